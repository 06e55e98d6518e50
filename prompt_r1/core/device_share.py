"""Tensors handed to another process on the same GPU by CUDA IPC: a colocated weight sync without the host.

Why it exists: when the rollout engines share the learner's GPU (`rollout.colocate` with the
transformers backend), a full-weight sync through the host would copy every weight from the GPU
to host memory, into Ray's object store, and back onto the same GPU. Instead the learner pickles
a handle to its device buffer (`share`: torch's own reduction, `reduce_tensor`), and the engine
maps that memory (`open_shared`) and copies from it device to device. Torch keeps the buffer
alive until every process that mapped it lets go, and makes the reader wait for the writes
queued before the handle was taken.

A handle names the device by its index in the sender's CUDA_VISIBLE_DEVICES, which Ray sets per
actor, so an engine and its learner may number the same GPU differently: a handle carries the
GPU's UUID and the receiver finds its own index for it. An engine that cannot see that GPU stops
with an error naming the settings.

On the CPU device torch's reduction pickles the bytes instead of mapping them: the same calls,
a copy (how the CPU tests run this path end to end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prompt_r1.core.failures import UserError

STORAGE_DEVICE_ARG = 6  # torch.multiprocessing.reductions.rebuild_cuda_tensor's `storage_device`


class DeviceShareError(UserError):
    """An engine cannot open the learner's device memory."""


@dataclass(frozen=True)
class SharedTensor:
    """What crosses the process boundary: torch's rebuild function, its arguments (for a CUDA
    tensor an IPC handle, offsets and an event; for a CPU tensor its storage) and the GPU's UUID."""

    rebuild: Callable[..., torch.Tensor]
    args: tuple[Any, ...]
    gpu_uuid: str | None


def share(tensor: torch.Tensor) -> SharedTensor:
    """A picklable handle to `tensor`'s memory (its bytes, for a CPU tensor)."""
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(tensor.detach())
    uuid = str(torch.cuda.get_device_properties(tensor.device).uuid) if tensor.is_cuda else None
    return SharedTensor(rebuild, tuple(args), uuid)


def local_gpu_index(uuid: str) -> int:
    """This process's index of the GPU with `uuid`."""
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise DeviceShareError(
        f"the learner's GPU ({uuid}) is not visible to this rollout engine, so it cannot take the weights on the "
        "device: rollout.colocate places each engine on its learner's GPU; check that agent.device is cuda and "
        "that CUDA_VISIBLE_DEVICES is not set by hand for the Ray workers")


def open_shared(shared: SharedTensor) -> torch.Tensor:
    """The tensor `share` made, in this process: the sender's device memory, mapped (on CPU, a copy)."""
    args = list(shared.args)
    if shared.gpu_uuid is not None:
        args[STORAGE_DEVICE_ARG] = local_gpu_index(shared.gpu_uuid)
    return shared.rebuild(*args)
