"""Where the learner computes: `train.device` as a torch device, and the autocast dtype.

Apart from the learner so that the pre-flight (`planning.machine.check_train_device`) can refuse a
device this machine lacks without importing transformers.
"""

from __future__ import annotations

import logging

import torch

from prompt_r1.config.base import ConfigError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """`train.device` as a torch device: `auto` is the first CUDA GPU if torch sees one, else CPU.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device is {name!r} but torch {torch.__version__} sees no CUDA GPU; "
                              "use `auto` or `cpu`")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device is {name!r} but only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible (check CUDA_VISIBLE_DEVICES)")
    return device


def autocast_dtype(device: torch.device, agent_dtype: str, enabled: bool = True) -> torch.dtype | None:
    """The autocast compute dtype for the learner, or None for plain float32 compute.

    >>> autocast_dtype(torch.device("cpu"), "bfloat16")
    torch.bfloat16
    >>> autocast_dtype(torch.device("cpu"), "float32") is None
    True
    """
    if not enabled or agent_dtype != "bfloat16":
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        log.warning("%s has no bfloat16 support: the learner computes in float32", device)
        return None
    if not torch.amp.is_autocast_available(device.type):
        return None
    return torch.bfloat16
