"""`host_copy` against the per-tensor copy it replaces (`t.detach().to("cpu", dtype)`), over seeded
random state dicts: bit-identical, contiguous, aligned, never aliasing its inputs; a full-weight
`WeightUpdate` over its views pickles as its own bytes, not the shared buffer once per tensor."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

from prompt_r1.core.weights import WeightUpdate, weights_checksum
from prompt_r1.learner.sync_copy import ALIGN, device_copy, host_copy

SEED = 20261130
N_CASES = 300
SOURCE_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def _base(rng: random.Random, shape: list[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.int64:
        return torch.randint(-(1 << 20), 1 << 20, shape, generator=gen)
    scale = rng.choice([1e-3, 1.0, 300.0])  # values that round differently in each target
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _case(rng: random.Random, gen: torch.Generator, seen: set[str]):
    """A random state dict, the tensors its entries view (to change afterwards), and a target dtype."""
    tensors, bases = {}, []
    for i in range(rng.randint(1, 6)):
        dtype = rng.choice(SOURCE_DTYPES)
        form = rng.choice(["plain", "0-d", "empty", "transpose", "slice", "expand", "alias"])
        if form == "alias" and tensors:  # one tensor under two names, as tied weights are
            name = rng.choice(list(tensors))
            tensors[f"t{i}"] = tensors[name]
            seen.add(form)
            continue
        if form == "0-d":
            base = _base(rng, [], dtype, gen)
            view = base
        elif form == "empty":
            base = _base(rng, [rng.randint(0, 3), 0, rng.randint(1, 3)], dtype, gen)
            view = base
        else:
            shape = [rng.randint(1, 7) for _ in range(rng.randint(1, 3))]
            base = _base(rng, shape + [rng.randint(2, 9)], dtype, gen)
            view = {"transpose": base.transpose(0, -1), "slice": base[..., ::2],
                    "expand": base[..., :1].expand(*base.shape[:-1], 4)}.get(form, base)
        seen.add(form)
        tensors[f"t{i}"] = view
        bases.append(base)
    return tensors, bases, rng.choice([torch.float32, torch.bfloat16])


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the storages of `a` and `b` overlap (an empty one holds no memory)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    if not sa.nbytes() or not sb.nbytes():
        return False
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def _check(tensors: dict[str, torch.Tensor], bases: list[torch.Tensor], dtype: torch.dtype, copy=host_copy) -> None:
    expected = {k: v.detach().to("cpu", dtype, copy=True) for k, v in tensors.items()}
    out = copy(tensors, dtype)
    assert list(out) == list(tensors)
    spans = []
    for name, tensor in out.items():
        assert tensor.dtype == dtype and tensor.shape == tensors[name].shape, name
        assert torch.equal(tensor, expected[name]), name
        assert tensor.is_contiguous() and tensor.device.type == "cpu"
        offset = tensor.data_ptr() - tensor.untyped_storage().data_ptr()
        assert offset % ALIGN == 0, (name, offset)
        spans.append((offset, offset + tensor.numel() * tensor.element_size()))
        assert not any(_shares_memory(tensor, base) for base in bases), name
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no two overlap
    for base in bases:  # the sources move on (the next optimiser step); the copies stay
        base.fill_(7)
    assert all(torch.equal(out[k], expected[k]) for k in out)


def test_host_copy_matches_the_per_tensor_copy_bit_for_bit() -> None:
    rng, gen = random.Random(SEED), torch.Generator().manual_seed(SEED)
    seen: set[str] = set()
    for i in range(N_CASES):
        # device_copy lays its buffer out as host_copy does (here on the CPU device)
        _check(*_case(rng, gen, seen), copy=host_copy if i % 2 else lambda t, d: device_copy(t, d, "cpu"))
    assert seen == {"plain", "0-d", "empty", "transpose", "slice", "expand", "alias"}, seen
    assert host_copy({}, torch.bfloat16) == {} == device_copy({}, torch.bfloat16, "cpu")


def test_a_target_dtype_already_held_is_still_copied() -> None:
    source = {"w": torch.randn(4, 4)}
    out = host_copy(source, torch.float32)
    source["w"].add_(1.0)
    assert not torch.equal(out["w"], source["w"])


def test_an_update_over_its_views_pickles_as_its_own_bytes() -> None:
    gen = torch.Generator().manual_seed(SEED)
    source = {f"layer{i}.weight": torch.randn(128, 96, generator=gen) for i in range(24)}
    update = WeightUpdate.make(3, "full", host_copy(source, torch.bfloat16))
    raw = pickle.dumps(update, protocol=5)
    assert update.nbytes <= len(raw) < update.nbytes + 64 * 1024  # not 24 x the shared buffer
    received = pickle.loads(raw)
    assert received.checksum == update.checksum == weights_checksum(received.tensors)
    assert all(torch.equal(received.tensors[k], update.tensors[k]) for k in source)


def test_the_learner_sends_a_copy_the_next_step_leaves_alone(tiny_model_path) -> None:
    from grpo_helpers import make_config

    from prompt_r1.learner.grpo_learner import GRPOLearner

    cfg = make_config()
    cfg.agent.dtype = "bfloat16"
    learner = GRPOLearner(cfg, tiny_model_path)
    update = learner.weights_for_sync(1)
    state = learner.model.state_dict()
    assert "lm_head.weight" not in update.tensors  # tied: the engine ties it itself
    assert all(torch.equal(t, state[k].to("cpu", torch.bfloat16)) for k, t in update.tensors.items())
    sent = {k: t.clone() for k, t in update.tensors.items()}
    with torch.no_grad():
        for param in learner.model.parameters():
            param.add_(1.0)
    assert all(torch.equal(update.tensors[k], sent[k]) for k in sent)


def test_colocated_engines_on_the_learners_gpu_take_the_sync_on_the_device() -> None:
    """`Config.syncs_on_device` against its rule restated, over every combination of its inputs."""
    import itertools

    from prompt_r1.config.experiment import parse_config

    answers = []
    for colocate, backend, agent_device, learner, world, lora in itertools.product(
            [True, False], ["transformers", "vllm"], ["cuda", "cpu"], ["cuda", "cpu"], [1, 2], [False, True]):
        agent = {"model": "tiny", "backend": backend, "device": agent_device, "lora": {"enabled": lora}}
        if backend == "transformers" and agent_device == "cuda":
            agent["batch_invariant"] = False
        if backend == "vllm" and agent_device == "cpu":
            continue  # agent.device is the transformers backend's
        try:
            cfg = parse_config({"agent": agent, "rollout": {"colocate": colocate},
                                "train": {"world_size": world, "strategy": "ddp"}})
        except Exception:
            continue  # a combination the config refuses
        expected = colocate and backend == "transformers" and agent_device == "cuda" and learner == "cuda" \
            and world == 1 and not lora
        assert cfg.syncs_on_device(learner) == expected, (colocate, backend, agent_device, learner, world, lora)
        answers.append(expected)
    assert answers.count(True) == 1 and len(answers) > 20  # the one case, among many admitted ones


def test_a_learner_hands_its_sync_over_in_its_device_memory(tiny_model_path) -> None:
    """On the device (the CPU here) the update is one cast copy, sent as handles to it; the engine
    loads the same weights as the host path (same checksum), and the copy lives until the next step."""
    from grpo_helpers import hand_trajectories, make_config

    from prompt_r1.learner.grpo_learner import GRPOLearner
    from prompt_r1.policy.hf import TransformersPolicy

    cfg = make_config()
    learner = GRPOLearner(cfg, tiny_model_path)
    assert not learner.syncs_on_device  # a CPU learner never does by itself
    host = learner.weights_for_sync(1)
    learner.syncs_on_device = True
    update = learner.weights_for_sync(1)
    assert update.on_device and update.checksum == host.checksum and set(update.tensors) == set(host.tensors)
    assert len({t.untyped_storage().data_ptr() for t in update.tensors.values()}) == 1  # one buffer, one handle
    received = pickle.loads(pickle.dumps(update))
    policy = TransformersPolicy(tiny_model_path)
    assert policy.apply_update(received) == update.checksum
    assert learner._handed_over is update
    learner.step(hand_trajectories(learner.tokenizer))
    assert learner._handed_over is None  # freed before the update's own memory peak


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_it_casts_on_the_gpu_into_pinned_memory() -> None:
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    source = {"w": torch.randn(512, 384, device="cuda", generator=gen) * 300,
              "t": torch.randn(64, 48, device="cuda", generator=gen).t(),
              "h": torch.randn(33, device="cuda", generator=gen).half(),
              "cpu": torch.randn(5, 3), "s": torch.tensor(1.5, device="cuda")}
    expected = {k: v.to("cpu", torch.bfloat16) for k, v in source.items()}
    out = host_copy(source, torch.bfloat16)
    assert all(t.is_pinned() for t in out.values())
    assert all(torch.equal(out[k], expected[k]) for k in source)
    source["w"].add_(1.0)
    torch.cuda.synchronize()
    assert torch.equal(out["w"], expected["w"])
