"""One weight sync from the learner to the rollout engines: versioned and checksummed.

After every GRPO update the learner hands the rollout engines a `WeightUpdate`: the policy
`version` it carries (the number of updates applied; the initial agent is version 0), its `kind`
(`full`: every weight, HF names, in `agent.dtype`; `adapter`: only the LoRA tensors, in PEFT's
`get_peft_model_state_dict` names, with the `LoraConfig` that shapes them), and a `checksum`
computed by the sender. Each engine answers with the version it now holds and the checksum of
the tensors it now uses (see each policy's `apply_update` for what it can read back), and the
pool refuses any engine whose answer differs (`RolloutPool.broadcast`). Every trajectory then
carries the version that sampled it (`Trajectory.policy_version`).

The checksum (`weights_checksum`) is BLAKE2b (16-byte digest) over the tensors in sorted name
order, each contributing its name, dtype, shape and raw bytes (little-endian, as the CPU holds
them): all its bytes when it has at most `SAMPLE_ELEMENTS` elements (a LoRA adapter's tensors,
norms, biases), else a sample of at most `SAMPLE_ELEMENTS` elements evenly spaced from the first (stride
`ceil(numel / SAMPLE_ELEMENTS)`) and the last element. Same name -> tensor mapping, same
checksum, whatever the dict order; any change of name, dtype or shape changes it, and so does any
changed element of a small tensor or a sampled element of a large one. That is what it is for: an
engine that missed an update, loaded another version, another model or another dtype, or got a
truncated tensor, answers another checksum; a training step moves nearly every weight, so a sample
sees it. It is not a guard against one flipped byte in a large tensor (the object store and the
network carry their own checks). It costs microseconds per large tensor whatever its size (it
used to hash every byte: about 1 GB/s on one core, ~8 s per end for a 4B agent in bfloat16; see
BENCHMARKS.md, "Weight sync").

Imports: torch, numpy and `core.device_share` (the library's core).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from prompt_r1.core.device_share import SharedTensor, open_shared, share

WeightKind = Literal["full", "adapter"]


SAMPLE_ELEMENTS = 1 << 14  # elements hashed per large tensor (64 KiB of float32): cheap, and a step moves many


def checksum_elements(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of `tensor` (flattened) that its checksum reads: all of a small tensor, a strided
    sample and the last element of a large one (see the module docstring).

    >>> checksum_elements(torch.arange(5)).tolist()
    [0, 1, 2, 3, 4]
    >>> len(checksum_elements(torch.zeros(10 * SAMPLE_ELEMENTS + 3))) <= SAMPLE_ELEMENTS + 1
    True
    """
    flat = tensor.reshape(-1)
    if flat.numel() <= SAMPLE_ELEMENTS:
        return flat
    stride = -(-flat.numel() // SAMPLE_ELEMENTS)
    return torch.cat([flat[::stride], flat[-1:]])


def weights_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """Hex digest of `tensors` (see the module docstring for the rule).

    >>> a = {"w": torch.zeros(2), "b": torch.ones(1)}
    >>> weights_checksum(a) == weights_checksum({"b": torch.ones(1), "w": torch.zeros(2)})
    True
    >>> weights_checksum(a) == weights_checksum({"w": torch.zeros(2), "b": torch.ones(1, dtype=torch.float64)})
    False
    """
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        header = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{tuple(tensor.shape)}\0"
        digest.update(header.encode())
        # only the sampled elements leave the tensor's device; the raw bytes whatever the dtype
        # (numpy has no bfloat16): a uint8 view copies nothing
        sample = checksum_elements(tensor).to("cpu").contiguous()
        digest.update(sample.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes the tensors hold (what one sync moves through the object store)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(frozen=True)
class SyncHeader:
    """What a sync's receivers are checked against, without its tensors: the driver holds only
    this while the tensors travel from the learner to the engines (`WeightUpdate.header`)."""

    version: int
    kind: WeightKind
    checksum: str
    nbytes: int
    tensors: int  # how many

    def reply(self, checksum: str | None = None) -> dict[str, Any]:
        """An engine's answer after applying it: this version and the checksum of what it now uses."""
        return {"version": self.version, "checksum": checksum if checksum is not None else self.checksum}


@dataclass(frozen=True)
class WeightUpdate:
    """The weights of policy `version`, as the learner sends them (build with `make`)."""

    version: int
    kind: WeightKind
    tensors: dict[str, torch.Tensor] = field(repr=False)
    checksum: str
    adapter_config: dict[str, Any] | None = None  # PEFT LoraConfig as a dict (sets as sorted lists); adapters only
    on_device: bool = False  # handed over in the sender's device memory (`core.device_share`), not copied

    @classmethod
    def make(cls, version: int, kind: WeightKind, tensors: Mapping[str, torch.Tensor],
             adapter_config: dict[str, Any] | None = None, on_device: bool = False) -> "WeightUpdate":
        """Detached CPU tensors and their checksum, computed here by the sender; `on_device`: the
        tensors stay where they are and travel as handles to that memory (engines on the same GPU)."""
        if kind not in ("full", "adapter"):
            raise ValueError(f"a weight update is `full` or `adapter`, got {kind!r}")
        if (kind == "adapter") != (adapter_config is not None):
            raise ValueError("an adapter update needs its adapter_config, and only an adapter update has one")
        if version < 0:
            raise ValueError(f"policy versions count updates from 0, got {version}")
        kept = {name: t.detach() if on_device else t.detach().to("cpu") for name, t in tensors.items()}
        return cls(version, kind, kept, weights_checksum(kept), adapter_config, on_device)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.tensors)

    @property
    def header(self) -> SyncHeader:
        return SyncHeader(self.version, self.kind, self.checksum, self.nbytes, len(self.tensors))

    def reply(self, checksum: str | None = None) -> dict[str, Any]:
        """An engine's answer after applying it: this version and the checksum of what it now uses."""
        return self.header.reply(checksum)

    def __reduce__(self):
        """Pickled (as Ray's object store does) with each tensor's bytes as a numpy uint8 array, which
        pickle 5 carries out of band: `ray.put` copies them into shared memory once and an actor's
        `ray.get` maps them without a copy. A torch tensor pickles through a byte string (about ten
        times slower; BENCHMARKS.md, "Weight sync"). The received tensors are views of the object
        store's shared memory that nothing may write (torch cannot mark a tensor read-only):
        receivers copy them into their own weights (`load_weights`; tests/sync_helpers.py).
        An `on_device` update pickles as one handle per tensor to the sender's memory (`share`),
        which the receiver maps (`open_shared`) and copies from, never writes."""
        if self.on_device:
            handles = {name: share(t) for name, t in self.tensors.items()}
            return _rebuild_shared_update, (self.version, self.kind, handles, self.checksum, self.adapter_config)
        raw = {name: (str(t.dtype).removeprefix("torch."), tuple(t.shape), _tensor_bytes(t))
               for name, t in self.tensors.items()}
        return _rebuild_update, (self.version, self.kind, raw, self.checksum, self.adapter_config)


def _tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array (a view when it is contiguous, as `make` leaves it)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _rebuild_update(version: int, kind: WeightKind, raw: dict[str, tuple[str, tuple[int, ...], np.ndarray]],
                    checksum: str, adapter_config: dict[str, Any] | None) -> WeightUpdate:
    with warnings.catch_warnings():  # the object store's arrays are read-only; nothing here writes them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = {name: torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
                   for name, (dtype, shape, data) in raw.items()}
    return WeightUpdate(version, kind, tensors, checksum, adapter_config)


def _rebuild_shared_update(version: int, kind: WeightKind, handles: dict[str, SharedTensor], checksum: str,
                           adapter_config: dict[str, Any] | None) -> WeightUpdate:
    tensors = {name: open_shared(handle) for name, handle in handles.items()}
    return WeightUpdate(version, kind, tensors, checksum, adapter_config, on_device=True)


def peft_config_dict(peft_config: Any) -> dict[str, Any]:
    """A PEFT config as plain data that travels with an adapter (sets, e.g. the resolved
    `target_modules` of `all-linear`, become sorted lists; enums their values)."""
    out: dict[str, Any] = {}
    for key, value in peft_config.to_dict().items():
        if isinstance(value, set):
            value = sorted(value)
        elif hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
            value = value.value  # PeftType / TaskType enums
        out[key] = value
    return out


@dataclass(frozen=True)
class UpdateRef:
    """A `WeightUpdate` in Ray's object store, where the learner rank that made it put it: its
    header (what the engines' answers are checked against) and the reference the engines resolve.
    The reference is typed `Any` so that this module needs no Ray."""

    header: SyncHeader
    ref: Any                     # ray.ObjectRef of the WeightUpdate

