"""Weights handed over in device memory (`core.device_share`, `WeightUpdate(on_device=True)`).

CUDA IPC itself needs a GPU; on the CPU device torch's reduction pickles the bytes, so these tests
run the same calls end to end with a copy: the handles survive pickling and another process, the
engine loads what the learner sent (same checksum as the host path), and the device index in a
handle is mapped by the GPU's UUID to the receiver's own numbering, or refused naming the settings.
"""

from __future__ import annotations

import logging
import pickle
import random
from types import SimpleNamespace

import pytest
import torch

from prompt_r1.core import device_share
from prompt_r1.core.device_share import DeviceShareError, SharedTensor, open_shared, share
from prompt_r1.core.weights import WeightUpdate, weights_checksum
from prompt_r1.learner.sync_copy import device_copy


def random_state(rng: random.Random) -> dict[str, torch.Tensor]:
    return {f"w{i}": torch.randn(rng.randint(1, 5), rng.randint(1, 7), generator=torch.Generator().manual_seed(i))
            for i in range(rng.randint(1, 6))}


def test_a_shared_view_arrives_equal_after_pickling():
    rng = random.Random(0)
    for _ in range(20):
        state = device_copy(random_state(rng), torch.bfloat16, "cpu")  # views of one buffer
        for name, tensor in state.items():
            again = open_shared(pickle.loads(pickle.dumps(share(tensor))))
            assert torch.equal(again, tensor) and again.dtype == tensor.dtype and again.shape == tensor.shape, name


def test_an_on_device_update_keeps_its_checksum_and_kind_across_pickling():
    state = device_copy(random_state(random.Random(1)), torch.bfloat16, "cpu")
    update = WeightUpdate.make(3, "full", state, on_device=True)
    host = WeightUpdate.make(3, "full", state)
    got = pickle.loads(pickle.dumps(update))
    assert got.on_device and not host.on_device
    assert got.checksum == update.checksum == host.checksum  # the same weights whichever way they travel
    assert weights_checksum(got.tensors) == update.checksum
    assert all(torch.equal(got.tensors[k], state[k]) for k in state)


def fake_gpus(monkeypatch, uuids: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(uuids))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuids[i]))


def test_a_handle_names_the_gpu_by_uuid_and_the_receiver_uses_its_own_index(monkeypatch):
    """The learner sees the GPU as its index 3, the engine (Ray set its CUDA_VISIBLE_DEVICES) as 0."""
    seen = []

    def rebuild(*args):
        seen.append(args)
        return torch.zeros(1)

    args = tuple(range(15))  # rebuild_cuda_tensor's 15 arguments; the 7th is the device index
    fake_gpus(monkeypatch, ["GPU-aaa"])
    open_shared(SharedTensor(rebuild, args, "GPU-aaa"))
    assert seen[-1][device_share.STORAGE_DEVICE_ARG] == 0
    assert [a for i, a in enumerate(seen[-1]) if i != device_share.STORAGE_DEVICE_ARG] == \
        [a for i, a in enumerate(args) if i != device_share.STORAGE_DEVICE_ARG]
    fake_gpus(monkeypatch, ["GPU-x", "GPU-y", "GPU-aaa"])
    open_shared(SharedTensor(rebuild, args, "GPU-aaa"))
    assert seen[-1][device_share.STORAGE_DEVICE_ARG] == 2


def test_an_engine_that_cannot_see_the_learners_gpu_is_told_what_to_change(monkeypatch):
    fake_gpus(monkeypatch, ["GPU-other"])
    with pytest.raises(DeviceShareError) as err:
        open_shared(SharedTensor(lambda *a: None, tuple(range(15)), "GPU-learner"))
    assert "GPU-learner" in str(err.value) and "rollout.colocate" in str(err.value)


def test_the_rebuild_arguments_put_the_device_where_torch_reads_it():
    """`STORAGE_DEVICE_ARG` is the index of `storage_device` in torch's own CUDA rebuild function."""
    import inspect

    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    names = list(inspect.signature(rebuild_cuda_tensor).parameters)
    assert names[device_share.STORAGE_DEVICE_ARG] == "storage_device"


def test_an_update_crosses_into_another_process(tmp_path):
    """Through Ray's object store into a worker process, as a learner's sync reaches an engine."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
    try:
        state = device_copy(random_state(random.Random(2)), torch.float32, "cpu")
        update = WeightUpdate.make(5, "full", state, on_device=True)

        @ray.remote
        def received(u: WeightUpdate) -> tuple[str, bool, int]:
            return weights_checksum(u.tensors), u.on_device, u.version

        assert ray.get(received.remote(ray.put(update)), timeout=120) == (update.checksum, True, 5)
    finally:
        ray.shutdown()
