"""The full-weight sync's copy of the weights: one flat buffer, each tensor cast on its own device.

Why it exists: after every update the learner sends its full weights to the rollout engines
(`GRPOLearner.weights_for_sync`). Copied one tensor at a time with `.to("cpu", dtype)`, each lands
in fresh pageable memory, and a blocking device-to-host copy casts on the CPU, so the float32
master weights cross the bus whole before becoming bfloat16 (5.3 s for Qwen3-1.7B on an H200).

- `host_copy` casts each tensor on its device (only `dtype`'s bytes cross the bus) and copies it
  without blocking, on a side stream, into its own view of one pinned host buffer, then waits once.
- `device_copy` keeps the copy on the learner's GPU, for engines that share that GPU
  (`rollout.colocate`): one buffer is one CUDA IPC handle to open (`core.device_share`), and the
  engine copies from it device to device.

Buffers are allocated per call: torch's caching allocators hand a freed block to the next call, and
an update still referenced elsewhere keeps its own. Their views pickle as the whole buffer under
torch's pickler (a storage travels whole): send them as a `WeightUpdate`, whose pickling carries
each tensor's own bytes (or, on the device, one handle), or clone them first.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

ALIGN = 64  # bytes: every tensor starts on a cache line, which every element size divides


def _views(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str,
           pin: bool) -> dict[str, torch.Tensor]:
    """One new buffer on `device`, cut into a contiguous `dtype` view per tensor, `ALIGN`-aligned."""
    itemsize = dtype.itemsize
    offsets, total = {}, 0
    for name, tensor in tensors.items():
        offsets[name] = total
        total += -(-tensor.numel() * itemsize // ALIGN) * ALIGN
    flat = torch.empty(total, dtype=torch.uint8, device=device, pin_memory=pin)
    return {name: flat[offsets[name]:offsets[name] + t.numel() * itemsize].view(dtype).view(t.shape)
            for name, t in tensors.items()}


def host_copy(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`{name: t.detach().to("cpu", dtype)}`, bit for bit, as contiguous views of one new host
    buffer (pinned when any tensor is on CUDA), each at an offset aligned to `ALIGN` bytes. Never
    aliases its inputs: changing them afterwards leaves the copies as they were.

    >>> out = host_copy({"w": torch.ones(2, 3).t(), "s": torch.tensor(2.5)}, torch.bfloat16)
    >>> out["w"].dtype, tuple(out["w"].shape), out["w"].is_contiguous(), out["s"].item()
    (torch.bfloat16, (3, 2), True, 2.5)
    """
    out = _views(tensors, dtype, "cpu", pin=any(t.is_cuda for t in tensors.values()))
    streams: dict[torch.device, torch.cuda.Stream] = {}
    for name, tensor in tensors.items():
        src = tensor.detach()
        if not src.is_cuda:
            out[name].copy_(src)  # casts and copies in one pass
            continue
        if src.device not in streams:  # a side stream per device, after the work queued so far
            streams[src.device] = torch.cuda.Stream(src.device)
            streams[src.device].wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(streams[src.device]):
            # the cast's temporary belongs to this stream, so freeing it after queuing the copy is safe
            cast = src.to(dtype, memory_format=torch.contiguous_format)
            out[name].copy_(cast, non_blocking=True)
    for stream in streams.values():  # the host must not read bytes still in flight
        stream.synchronize()
    return out


def device_copy(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device | str) -> dict[str, torch.Tensor]:
    """`{name: t.detach().to(device, dtype)}`, bit for bit, as contiguous views of one new buffer
    on `device`, laid out as `host_copy`'s. The copies are queued on the current stream; whoever
    reads them from another process waits for them (CUDA IPC records an event for that).

    >>> out = device_copy({"w": torch.ones(2, 3).t()}, torch.bfloat16, "cpu")
    >>> out["w"].dtype, out["w"].is_contiguous(), out["w"].untyped_storage().nbytes()
    (torch.bfloat16, True, 64)
    """
    out = _views(tensors, dtype, device, pin=False)
    for name, tensor in tensors.items():
        out[name].copy_(tensor.detach())  # casts on the device, in one pass
    return out

