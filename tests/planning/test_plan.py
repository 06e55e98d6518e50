"""`prompt-r1 plan`: the parameter count, the memory rule, the placement and the command's exits.

Nothing here loads a model: counts are checked against models transformers builds on the meta
device (no weights) and against SmolLM2's weights file header when that folder is built; the
rule is checked against a second, independent statement of it over seeded random configs.
"""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from prompt_r1.config.experiment import load_config
from prompt_r1.models.architecture import Architecture, folder_architecture, known_architecture
from prompt_r1.planning.memory import GIB, Machine, learner_parts
from prompt_r1.planning.plan import PlanError, make_plan
from prompt_r1.planning.machine import preflight

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "paper.yaml"
QWEN3_4B = known_architecture("Qwen/Qwen3-4B")
NODE_8X80 = Machine(nodes=1, gpus_per_node=8, gpu_memory_gib=80, host_memory_gib=512)


def _shape(arch: Architecture) -> tuple:
    return (arch.vocab, arch.hidden, arch.layers, arch.intermediate, arch.heads, arch.kv_heads, arch.head_dim,
            arch.tied, arch.counted_params)


# -- the parameter count -------------------------------------------------------------------------
@pytest.mark.parametrize("kind, extra", [
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"tie_word_embeddings": False, "attention_bias": True}),
    ("qwen2", {"tie_word_embeddings": False}),
    ("qwen3", {"tie_word_embeddings": True, "head_dim": 32}),
    ("gemma3_text", {"tie_word_embeddings": True, "head_dim": 32}),
])
def test_the_count_matches_a_model_transformers_builds(kind, extra):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, vocab_size=1000, hidden_size=128, intermediate_size=352,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, **extra)
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    counted = Architecture.from_config(config.to_dict(), kind, "test").counted_params
    assert abs(counted - real) / real < 0.02, (counted, real)


def test_the_count_of_smollm2_matches_its_weights_file():
    from prompt_r1.models.bundled import SMOLLM2, bundled_folder

    folder = bundled_folder(SMOLLM2)
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"SmolLM2 is not built under {folder} (PROMPT_R1_MODELS)")
    with open(folder / "model.safetensors", "rb") as f:  # the header lists every tensor's shape
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    real = sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    arch = folder_architecture(folder, SMOLLM2)
    assert abs(arch.counted_params - real) / real < 0.02 and real == 134_515_008
    assert _shape(arch) == _shape(known_architecture(SMOLLM2))  # the shipped numbers are this folder's


def test_the_known_tiny_architecture_is_what_the_tiny_builder_makes(tmp_path):
    from prompt_r1.models.bundled import build_tiny_model

    built = folder_architecture(build_tiny_model(tmp_path / "tiny"), "tiny")
    assert _shape(built) == _shape(known_architecture("tiny")) == _shape(known_architecture("tiny-protocol"))


def test_paper_agent_is_about_4b_and_a_count_from_the_user_wins():
    assert 4.0e9 < QWEN3_4B.params < 4.05e9
    assert QWEN3_4B.with_params(5e9).params == 5_000_000_000
    guessed = Architecture.guess(4e9, "org/model")
    assert guessed.params == 4_000_000_000 and "guessed" in guessed.source


# -- the memory rule -----------------------------------------------------------------------------
def _paper(**overrides):
    return load_config(PAPER, overrides)


def _by_kind(parts: dict[str, float]) -> dict[str, float]:
    keys = ("policy weights", "gradients", "AdamW", "reference", "activations", "logits", "DDP", "FSDP")
    return {k: sum(v for name, v in parts.items() if name.startswith(k)) for k in keys}


def test_fsdp_divides_weights_gradients_optimizer_and_reference_by_the_world_size():
    one = _by_kind(learner_parts(_paper(**{"train.world_size": 1, "train.strategy": "ddp"}), QWEN3_4B, 512))
    four = _by_kind(learner_parts(_paper(**{"train.world_size": 4, "train.strategy": "fsdp"}), QWEN3_4B, 512))
    for kind in ("policy weights", "gradients", "AdamW", "reference"):
        assert four[kind] == pytest.approx(one[kind] / 4), kind
    for kind in ("activations", "logits"):  # a rank's own micro-batch: not shared
        assert four[kind] == one[kind]
    assert four["FSDP"] > 0 and one["FSDP"] == 0


def test_ddp_keeps_every_weight_on_every_rank():
    one = _by_kind(learner_parts(_paper(**{"train.world_size": 1, "train.strategy": "ddp"}), QWEN3_4B, 512))
    two = _by_kind(learner_parts(_paper(**{"train.world_size": 2, "train.strategy": "ddp"}), QWEN3_4B, 512))
    assert two["policy weights"] == one["policy weights"] and two["DDP"] > 0 == one["DDP"]
    # one bucket, not a second copy of every gradient: 2^24 elements plus the embedding at most
    assert two["DDP"] * GIB == 4 * ((1 << 24) + QWEN3_4B.vocab * QWEN3_4B.hidden) < two["gradients"] * GIB / 5


def test_the_ddp_bucket_bounds_what_reduce_gradients_concatenates(monkeypatch, tmp_path):
    """The rule's bucket against the real `ReplicatedRanks.reduce_gradients` (one gloo rank, a
    small bucket size so random gradient lists cross it many times): the largest tensor it
    concatenates is within the rule, and the rule is no more than one largest gradient above it."""
    import torch
    import torch.distributed as dist

    from prompt_r1.learner import collectives
    from prompt_r1.planning import memory

    assert memory.BUCKET_ELEMENTS == collectives.BUCKET_ELEMENTS  # the rule restates the learner's constant
    bucket, seen = 1000, []
    monkeypatch.setattr(collectives, "BUCKET_ELEMENTS", bucket)
    real = collectives._all_reduce_bucket
    monkeypatch.setattr(collectives, "_all_reduce_bucket", lambda grads: (seen.append(sum(g.numel() for g in grads)),
                                                                      real(grads)))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ranks = collectives.ReplicatedRanks(0, 1, torch.device("cpu"))
        rng = random.Random(0)
        for _ in range(30):
            sizes = [rng.choice([1, 7, 300, 999, 1000, 1500, 4000]) for _ in range(rng.randint(1, 25))]
            params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
            for p in params:
                p.grad = torch.ones_like(p)
            seen.clear()
            ranks.reduce_gradients(params)
            rule = min(sum(sizes), bucket + max(sizes))
            assert max(seen) <= rule and rule - max(seen) <= max(sizes), (sizes, seen)
    finally:
        dist.destroy_process_group()


def test_fsdp_keeps_the_root_unit_gathered_after_the_forward(tmp_path):
    """The premise of the rule's FSDP root unit, on FSDP2 itself (one gloo rank on CPU): after a
    forward, with or without gradients, the decoder layers are sharded again (DTensors) while
    the root's weights (embeddings, final norm) stay whole, and those are `root_params`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from transformers import LlamaConfig, LlamaForCausalLM

    from prompt_r1.planning.memory import root_params
    from prompt_r1.learner.collectives import ShardedRanks

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = ShardedRanks(0, 1, torch.device("cpu")).distribute(LlamaForCausalLM(config))
        tokens = torch.randint(0, 128, (1, 8))
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                model(tokens)
            whole = {n: p.numel() for n, p in model.named_parameters() if not isinstance(p, DTensor)}
            assert whole and all(".layers." not in n for n in whole)
            arch = Architecture.from_config(config.to_dict(), "tiny-llama", "test")
            assert sum(whole.values()) == root_params(arch)
            model.zero_grad(set_to_none=True)
            model.reshard()
    finally:
        dist.destroy_process_group()


def test_kl_coef_0_and_lora_keep_no_reference_copy():
    assert _by_kind(learner_parts(_paper(), QWEN3_4B, 512))["reference"] > 0
    assert _by_kind(learner_parts(_paper(**{"train.kl_coef": 0.0}), QWEN3_4B, 512))["reference"] == 0
    assert _by_kind(learner_parts(_paper(**{"agent.lora.enabled": True}), QWEN3_4B, 512))["reference"] == 0


def test_lora_shrinks_gradients_and_optimizer_to_the_adapter():
    full = _by_kind(learner_parts(_paper(), QWEN3_4B, 512))
    lora = _by_kind(learner_parts(_paper(**{"agent.lora.enabled": True}), QWEN3_4B, 512))
    assert lora["gradients"] < full["gradients"] / 100 and lora["AdamW"] < full["AdamW"] / 100
    assert lora["policy weights"] >= full["policy weights"]  # the frozen base stays, plus the adapter


def _expected_rank_gib(cfg, arch: Architecture, prompt: int) -> float:
    """The memory rule stated a second time, from the architecture's numbers (see planning.memory)."""
    t = cfg.train
    h, q, kv, i = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.intermediate
    sides = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
             "up_proj": (h, i), "down_proj": (i, h)}  # (in, out) of each linear layer
    shapes = {name: a + b for name, (a, b) in sides.items()}
    lora = cfg.agent.lora
    targets = list(shapes) if lora.target_modules == "all-linear" else lora.target_modules
    trainable = arch.layers * lora.r * sum(shapes[n] for n in targets) if lora.enabled else arch.params
    s = t.world_size if t.strategy == "fsdp" else 1
    c = 2 if cfg.agent.dtype == "bfloat16" and t.autocast else 4
    d = 2 if cfg.agent.dtype == "bfloat16" else 4  # the frozen reference is held in agent.dtype
    total = (4 * arch.params + (4 * trainable if lora.enabled else 0) + 12 * trainable) / s  # weights, grads, AdamW
    # DDP flushes a bucket once it holds 2^24 elements: at most that plus one more tensor, the
    # largest being a LoRA matrix (r x the larger side) or, fully trained, the embedding or an MLP matrix
    largest = (max(lora.r * max(sides[n]) for n in targets) if lora.enabled
               else max(arch.vocab * h, h * i))
    total += 4 * min(trainable, (1 << 24) + largest) if t.strategy == "ddp" and t.world_size > 1 else 0
    reference = t.kl_coef > 0 and not lora.enabled
    total += d * arch.params / s if reference else 0
    if s > 1:  # FSDP2: the root (embeddings, final norm) stays gathered with its gradient; 2 layers + 1 gradient
        root = arch.vocab * arch.hidden * (1 if arch.tied else 2) + arch.hidden
        total += (c + 4 + (d if reference else 0)) * root + (2 * c + 4) * arch.layer_params()
    tokens = t.micro_batch_size * (prompt + cfg.agent.max_response_tokens)
    a = 4 * arch.hidden + 3 * arch.heads * arch.head_dim + 3 * arch.kv_heads * arch.head_dim + 4 * arch.intermediate
    kept = arch.layers * arch.hidden + 2 * a if t.gradient_checkpointing else arch.layers * a
    total += tokens * kept * c
    m = t.micro_batch_size
    # each micro-batch row's logits: in the compute dtype, their float32 log-softmax and its gradient
    total += m * cfg.agent.max_response_tokens * arch.vocab * (c + 4 + 4)
    return total / GIB + 1.0


def _random_config(rng: random.Random):
    return _paper(**{
        "train.world_size": rng.randint(1, 16), "train.strategy": rng.choice(["ddp", "fsdp"]),
        "train.micro_batch_size": rng.randint(1, 16), "train.gradient_checkpointing": rng.random() < 0.5,
        "train.kl_coef": rng.choice([0.0, 0.001]), "train.autocast": rng.random() < 0.8,
        "agent.dtype": rng.choice(["float32", "bfloat16"]), "agent.max_response_tokens": rng.choice([256, 1024, 4096]),
        "agent.lora.enabled": rng.random() < 0.4, "agent.lora.r": rng.choice([8, 16, 64]),
        "agent.lora.target_modules": rng.choice([["q_proj", "v_proj"], "all-linear"]),
    })


def test_the_rule_stated_twice_agrees_and_scales_with_the_world_size():
    rng = random.Random(0)
    archs = [QWEN3_4B, known_architecture("smollm2-135m-instruct"), known_architecture("gemma3-270m"),
             Architecture.guess(14e9, "guess")]
    for _ in range(150):
        cfg, arch, prompt = _random_config(rng), rng.choice(archs), rng.choice([64, 512, 2048])
        parts = learner_parts(cfg, arch, prompt)
        assert sum(parts.values()) == pytest.approx(_expected_rank_gib(cfg, arch, prompt), rel=1e-9)
        per_rank = [sum(learner_parts(cfg.model_copy(update={"train": cfg.train.model_copy(
            update={"world_size": n})}), arch, prompt).values()) for n in range(1, 9)]
        if cfg.train.strategy == "fsdp":  # a rank's share shrinks as ranks are added, from 2 ranks on
            # (going from 1 rank to 2 adds the unit FSDP gathers, more than sharding saves for a small
            # model or an adapter: the plan says so rather than hide it)
            assert all(b <= a + 1e-9 for a, b in zip(per_rank[1:], per_rank[2:]))
        else:  # every rank holds everything: the group's total grows with each rank
            group = [n * gib for n, gib in enumerate(per_rank, start=1)]
            assert all(b > a for a, b in zip(group, group[1:]))


# -- the placement and the verdict ---------------------------------------------------------------
def test_paper_fits_one_node_of_8_gpus_of_80_gib():
    plan = make_plan(_paper(), QWEN3_4B, NODE_8X80)
    assert plan.fits, plan.problems
    where = {c.name: (c.node, c.devices) for c in plan.components}
    assert [where[f"learner rank {r}"] for r in range(4)] == [(0, [r]) for r in range(4)]
    assert [where[f"rollout engine {e}"] for e in range(4)] == [(0, [4 + e]) for e in range(4)]
    assert all(c.gib <= NODE_8X80.gpu_limit for c in plan.components)
    assert json.loads(json.dumps(plan.to_dict()))["fits"] is True
    # it would start: only rank 0 reads the full float32 state dict into host memory, and each rank
    # holds its shards (plus one whole tensor on its way) on the GPU, well below its step's peak
    ranks = [c for c in plan.components if c.role == "learner"]
    assert [sum(c.host.values()) > 0 for c in ranks] == [True, False, False, False]
    assert sum(ranks[0].host.values()) == pytest.approx(4 * QWEN3_4B.params / GIB)
    assert sum(ranks[1].startup.values()) < ranks[1].gib / 4
    # a rank's peak with the logits term fitted on an H100 (docs/scale.md, Calibration): about 52 of 72 GiB
    assert 48 < ranks[0].gib < 56


def test_paper_does_not_fit_one_24_gib_gpu_and_says_what_to_change():
    plan = make_plan(_paper(), QWEN3_4B, Machine(1, 1, 24, 64))
    assert not plan.fits
    text = plan.error()
    assert "needs" in text and "21.6 GiB" in text and "agent.lora.enabled=true" in text
    assert "the run needs 8 GPUs" in text and "train.world_size" in text and "rollout.num_workers" in text


def test_a_suggested_world_size_is_one_that_fits():
    cfg = _paper(**{"train.world_size": 1, "train.strategy": "ddp"})
    plan = make_plan(cfg, QWEN3_4B, NODE_8X80)
    wanted = [p for p in plan.problems if "train.strategy=fsdp with train.world_size>=" in p]
    assert wanted, plan.problems
    ranks = int(wanted[0].split("train.world_size>=")[1].split(",")[0])
    fixed = make_plan(_paper(**{"train.world_size": ranks, "train.strategy": "fsdp"}), QWEN3_4B, NODE_8X80)
    smaller = make_plan(_paper(**{"train.world_size": ranks - 1, "train.strategy": "fsdp"}), QWEN3_4B, NODE_8X80)
    assert fixed.fits, fixed.problems
    assert any("a learner rank needs" in p for p in smaller.problems)


def test_engines_need_their_gpus_on_one_node():
    # 4 learner ranks + one engine of 4 GPUs = 8 GPUs: it fits 2 nodes x 4, not 4 nodes x 2
    cfg = _paper(**{"agent.tensor_parallel_size": 4, "rollout.num_workers": 1})
    assert make_plan(cfg, QWEN3_4B, Machine(2, 4, 80, 512)).fits
    plan = make_plan(cfg, QWEN3_4B, Machine(4, 2, 80, 512))
    assert not plan.fits and "4 GPUs on one node" in plan.error()


def test_on_cpu_every_process_shares_the_host_memory_of_a_node():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    arch = known_architecture(cfg.agent.model)
    roomy = make_plan(cfg, arch, Machine(1, 0, host_memory_gib=64))
    assert roomy.fits and {c.where() for c in roomy.components} == {"node 0 host memory"}
    assert {c.role for c in roomy.components} == {"learner", "engine", "environment"}
    tight = make_plan(cfg, arch, Machine(1, 0, host_memory_gib=8))
    assert not tight.fits and "host memory" in tight.error()


def test_a_managed_environment_server_shares_the_first_gpu():
    # environment.kind vllm, started by the driver; the agent on transformers, so no engine wants a GPU
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"agent.backend": "transformers"})
    arch = known_architecture(cfg.agent.model)
    plan = make_plan(cfg, arch, Machine(1, 1, 24, 64))
    server = next(c for c in plan.components if c.role == "environment")
    assert plan.fits and server.where() == "node 0 GPU 0 (shared)" and "1 of 1 GPUs used" in plan.verdict()
    small = make_plan(cfg, arch, Machine(1, 1, 12, 64))
    assert not small.fits and "environment.gpu_memory_utilization" in small.error()


def test_a_vllm_engine_on_cpu_is_sized_as_the_engine_sizes_its_kv_cache():
    from prompt_r1.models.kv_cache import kv_cache_bytes

    cfg = load_config(ROOT / "configs" / "demo.yaml", {"agent.backend": "vllm"})
    arch = known_architecture(cfg.agent.model)
    engine = next(c for c in make_plan(cfg, arch, Machine(1, 0, host_memory_gib=64)).components if c.role == "engine")
    assert engine.parts["KV cache"] * GIB == kv_cache_bytes(arch.kv_config(), cfg.agent.vllm_max_model_len,
                                                            cfg.agent.vllm_max_num_seqs, 4)


def test_a_vllm_engine_must_take_a_whole_trajectory():
    short = make_plan(_paper(**{"agent.vllm_max_model_len": 4096}), QWEN3_4B, NODE_8X80)
    assert not short.fits and "agent.vllm_max_model_len>=4608" in short.error()


def test_an_engine_takes_its_configured_share_and_the_rest_is_kv_cache():
    for share in (0.3, 0.6, 0.9):
        plan = make_plan(_paper(**{"agent.vllm_gpu_memory_utilization": share}), QWEN3_4B, NODE_8X80)
        engine = next(c for c in plan.components if c.role == "engine")
        assert engine.gib == pytest.approx(share * 80)  # what vLLM takes: the share of the whole GPU
        weights = 2 * QWEN3_4B.params / GIB  # bfloat16
        assert engine.parts["KV cache"] == pytest.approx(share * 80 - weights - 2.0)
    # the case: 0.3 of an 80 GiB card holds far fewer sequences than 0.9
    def held(share: float) -> int:
        plan = make_plan(_paper(**{"agent.vllm_gpu_memory_utilization": share}), QWEN3_4B, NODE_8X80)
        return int(next(c for c in plan.components if c.role == "engine").notes[0].split("holds ")[1].split()[0])

    assert held(0.3) < 30 < 90 < held(0.9)


def test_a_share_too_small_for_the_weights_is_refused_naming_one_that_fits():
    machine = Machine(1, 8, 40)
    cfg = _paper(**{"agent.vllm_gpu_memory_utilization": 0.2, "agent.lora.enabled": True, "train.strategy": "ddp",
                    "train.micro_batch_size": 1})
    plan = make_plan(cfg, QWEN3_4B, machine)
    problem = next(p for p in plan.problems if "rollout engine's share" in p)
    assert "vLLM would not start" in problem
    share = float(problem.split("agent.vllm_gpu_memory_utilization>=")[1].split(",")[0])
    assert make_plan(_paper(**{**{"agent.vllm_gpu_memory_utilization": share}, "agent.lora.enabled": True,
                               "train.strategy": "ddp", "train.micro_batch_size": 1}), QWEN3_4B, machine).fits
    assert not make_plan(_paper(**{"agent.vllm_gpu_memory_utilization": share - 0.01, "agent.lora.enabled": True,
                                   "train.strategy": "ddp", "train.micro_batch_size": 1}), QWEN3_4B, machine).fits


ONE_GPU = ROOT / "configs" / "one-gpu.yaml"


def test_the_one_gpu_recipe_shares_one_80_gib_gpu_in_both_phases():
    cfg = load_config(ONE_GPU)
    plan = make_plan(cfg, QWEN3_4B, Machine(1, 1, 80))
    assert plan.fits, plan.problems
    learner, engine = plan.components
    assert (learner.where(), engine.where()) == ("node 0 GPU 0", "node 0 GPU 0 (shared)")
    assert "1 of 1 GPUs used" in plan.verdict()
    # the two phases, stated again: between updates the learner keeps its float32 base, adapter,
    # AdamW state and runtime beside the engine's whole share; during an update its peak sits
    # beside the engine asleep (its runtime only)
    p, t = QWEN3_4B.params, QWEN3_4B.lora_params(16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    resident = (4 * (p + t) + 8 * t) / GIB + 1.0
    assert learner.resident == pytest.approx(resident)
    assert engine.gib == pytest.approx(0.6 * 80) and engine.asleep == 2.0
    assert f"holds {resident + 48:.1f} GiB between updates and {learner.gib + 2:.1f} during one" in plan.verdict()
    assert resident + 48 <= 72 and learner.gib + 2 <= 72


def test_a_colocated_share_too_large_is_refused_naming_the_largest_that_fits():
    plan = make_plan(load_config(ONE_GPU, {"agent.vllm_gpu_memory_utilization": 0.9}), QWEN3_4B, Machine(1, 1, 80))
    assert not plan.fits and "between updates" in plan.error()
    most = float(plan.error().split("agent.vllm_gpu_memory_utilization<=")[1].split()[0].rstrip(",;"))
    fitting = load_config(ONE_GPU, {"agent.vllm_gpu_memory_utilization": most})
    assert make_plan(fitting, QWEN3_4B, Machine(1, 1, 80)).fits
    over = make_plan(load_config(ONE_GPU, {"agent.vllm_gpu_memory_utilization": round(most + 0.02, 2)}), QWEN3_4B,
                     Machine(1, 1, 80))
    assert not over.fits


def test_colocation_counts_the_learner_peak_beside_a_sleeping_engine_not_its_share():
    # without sleep the peak and the share would be summed (46.9 + 48 GiB > 72): the plan does not
    cfg = load_config(ONE_GPU)
    plan = make_plan(cfg, QWEN3_4B, Machine(1, 1, 80))
    learner, engine = plan.components
    assert learner.gib + engine.gib > 72 and plan.fits
    # a learner whose peak leaves less than the sleeping engine's runtime does not fit (with a share
    # small enough for the time between updates)
    small = load_config(ONE_GPU, {"agent.vllm_gpu_memory_utilization": 0.35})
    tight = make_plan(small, QWEN3_4B, Machine(1, 1, 80, usable=(learner.gib + 1.0) / 80))
    assert not tight.fits and "during an update" in tight.error() and "train.micro_batch_size=" in tight.error()
    assert make_plan(small, QWEN3_4B, Machine(1, 1, 80, usable=(learner.gib + 2.0) / 80)).fits


def test_paper_on_one_gpu_is_pointed_at_colocation():
    plan = make_plan(_paper(**{"train.world_size": 1, "train.strategy": "ddp", "agent.lora.enabled": True}),
                     QWEN3_4B, Machine(1, 1, 80))
    assert not plan.fits and "rollout.colocate=true" in plan.error()


def test_host_memory_is_checked_when_it_is_known():
    cfg = load_config(ONE_GPU)
    assert make_plan(cfg, QWEN3_4B, Machine(1, 1, 80)).fits  # not known: not checked
    assert make_plan(cfg, QWEN3_4B, Machine(1, 1, 80, host_memory_gib=64)).fits
    small = make_plan(cfg, QWEN3_4B, Machine(1, 1, 80, host_memory_gib=16))
    # the learner reads the whole float32 model (15.0 GiB) and the sleeping engine keeps its bf16 weights (7.5)
    assert not small.fits and "host memory holds 22.5 GiB" in small.error()
    # fsdp: rank 0 alone reads the full state dict, so 4 ranks need one copy, not four
    paper = make_plan(_paper(), QWEN3_4B, Machine(1, 8, 80, host_memory_gib=24))
    assert paper.fits, paper.problems
    ddp = _paper(**{"train.strategy": "ddp", "agent.lora.enabled": True})
    assert "host memory holds 59.9 GiB" in make_plan(ddp, QWEN3_4B, Machine(1, 8, 80, host_memory_gib=24)).error()


def test_the_start_up_peak_never_exceeds_the_step_and_shrinks_with_fsdp():
    rng = random.Random(1)
    for _ in range(60):
        cfg = _random_config(rng)
        if cfg.train.strategy == "fsdp" and cfg.agent.lora.enabled:
            continue
        plan = make_plan(cfg, QWEN3_4B, Machine(4, 4, 1e6))
        ranks = [c for c in plan.components if c.role == "learner"]
        assert all(sum(c.startup.values()) <= c.gib for c in ranks)
        fsdp = cfg.train.strategy == "fsdp" and cfg.train.world_size > 1
        readers = [r for r in ranks if r.host]
        assert len(readers) == (1 if fsdp else len(ranks))


# -- train's check -------------------------------------------------------------------------------
def test_preflight_leaves_a_machine_without_gpus_alone(monkeypatch):
    import prompt_r1.planning.machine as plan_module

    monkeypatch.setattr(plan_module, "local_gpus", lambda: (0, 0.0))
    assert preflight(_paper()) is None
    monkeypatch.setattr(plan_module, "local_gpus", lambda: pytest.fail("a CPU-only run needs no GPU lookup"))
    assert preflight(load_config(ROOT / "configs" / "smoke.yaml", {"train.device": "cpu"})) is None


def test_preflight_refuses_before_any_model_loads_when_the_gpus_are_too_small(monkeypatch):
    import prompt_r1.planning.machine as plan_module

    monkeypatch.setattr(plan_module, "local_gpus", lambda: (8, 80.0))
    assert preflight(_paper()).fits
    monkeypatch.setattr(plan_module, "local_gpus", lambda: (1, 24.0))
    with pytest.raises(PlanError, match=r"does not fit.*agent\.lora\.enabled=true.*prompt-r1 plan"):
        preflight(_paper())


# -- the command ---------------------------------------------------------------------------------
def _plan(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def test_plan_prints_the_table_and_exits_0_when_it_fits(home):
    result = _plan("-c", "configs/paper.yaml", "--gpus-per-node", "8", "--gpu-memory-gib", "80")
    assert result.exit_code == 0, result.output
    assert "learner rank 3" in result.output and "node 0 GPU 7" in result.output
    assert "fits: 8 of 8 GPUs used" in result.output and "error:" not in result.output


def test_plan_json_is_json_alone(home):
    result = _plan("-c", "configs/paper.yaml", "--gpus-per-node", "8", "--gpu-memory-gib", "80", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["fits"] is True and data["model"]["name"] == "Qwen/Qwen3-4B" and len(data["components"]) == 8


def test_plan_exits_2_with_one_error_line_when_it_does_not_fit(home):
    result = _plan("-c", "configs/paper.yaml", "--gpus-per-node", "1", "--gpu-memory-gib", "24")
    assert result.exit_code == 2
    errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "agent.lora.enabled=true" in errors[0] and "Traceback" not in result.output
    as_json = _plan("-c", "configs/paper.yaml", "--gpus-per-node", "1", "--gpu-memory-gib", "24", "--json")
    data = json.loads(as_json.stdout)
    assert as_json.exit_code == 2 and data["exit_code"] == 2 and data["plan"]["fits"] is False
    assert "agent.lora.enabled=true" in data["error"]


def test_plan_without_gpus_plans_host_memory_and_builds_no_model(home, tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPT_R1_MODELS", str(tmp_path / "models"))
    result = _plan("-c", "configs/smoke.yaml", "--gpus-per-node", "0", "--host-memory-gib", "64")
    assert result.exit_code == 0, result.output
    assert "planned for host memory" in result.output and "node 0 host memory" in result.output
    assert not (tmp_path / "models").exists()  # tiny-protocol's shape came from the known architectures


def test_plan_places_the_one_gpu_recipe_on_one_80_gib_gpu(home):
    result = _plan("-c", "configs/one-gpu.yaml", "--gpus-per-node", "1", "--gpu-memory-gib", "80")
    assert result.exit_code == 0, result.output
    assert "node 0 GPU 0 (shared)" in result.output and "asleep, during an update" in result.output
    assert "fits: 1 of 1 GPUs used" in result.output and "host memory not checked" in result.output


def test_a_model_without_a_shape_needs_params(home):
    unknown = ["-c", "configs/paper.yaml", "--set", "agent.model=some-org/some-model", "--gpus-per-node", "8"]
    result = _plan(*unknown)
    assert result.exit_code == 2 and "--params" in result.output
    guessed = _plan(*unknown, "--params", "1.5e9")
    assert guessed.exit_code == 0, guessed.output
    assert "1.50B parameters" in guessed.output and "guessed from --params" in guessed.output


def test_on_cpu_the_pool_run_that_ran_out_of_memory_does_not_fit_and_a_kv_cap_makes_it_fit(monkeypatch):
    """configs/learning-pool.yaml on the 23.5 GiB CPU machine: as configured its pool arm was killed
    by Ray's memory monitor; with VLLM_CPU_KVCACHE_SPACE=1 it ran (BENCHMARKS.md). On CPU a server
    is two processes and a rollout engine holds a received full update beside its weights."""
    cfg = load_config(ROOT / "configs" / "learning-pool.yaml")
    arch = known_architecture(cfg.agent.model)
    machine = Machine(1, 0, host_memory_gib=23.5)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    plan = make_plan(cfg, arch, machine)
    assert not plan.fits and "VLLM_CPU_KVCACHE_SPACE" in plan.error()
    engine = next(c for c in plan.components if c.role == "engine")
    assert engine.parts["a received weight update (during a sync)"] == engine.parts["weights (float32)"]
    servers = [c for c in plan.components if c.role == "environment"]
    assert len(servers) == 2 and all(s.parts["API server process (HTTP, tokenizer)"] == 1.0 for s in servers)
    assert all(s.parts["KV cache"] > 2.0 for s in servers)  # 16 sequences of 4096 tokens each

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    capped = make_plan(cfg, arch, machine)
    assert capped.fits
    assert all(c.parts["KV cache"] == 1.0 for c in capped.components if c.role in ("engine", "environment"))
    assert sum(c.gib for c in plan.components) - sum(c.gib for c in capped.components) > 2.5


def test_a_kv_cache_space_that_is_not_a_positive_whole_number_is_one_error_line(home, monkeypatch):
    """vLLM gives every CPU engine exactly VLLM_CPU_KVCACHE_SPACE GiB: 0 or less leaves no room for one
    sequence (never memory set free), and a word is no size; `plan` says so in one line, exit 2."""
    for value in ("0", "-1", "-30", "abc", "1.5", "2GiB", " "):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
        for args in (["-c", "configs/learning-pool.yaml", "--gpus-per-node", "0", "--host-memory-gib", "512"],
                     ["-c", "configs/smoke.yaml", "--gpus-per-node", "0", "--set", "agent.backend=vllm"]):
            result = _plan(*args)
            assert result.exit_code == 2, (value, result.output)
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and f"VLLM_CPU_KVCACHE_SPACE={value!r}" in errors[0], (value, result.output)
            assert "Traceback" not in result.output and "fits" not in result.output
    for value in ("1", "4", ""):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
        assert _plan("-c", "configs/learning-pool.yaml", "--gpus-per-node", "0",
                     "--host-memory-gib", "512").exit_code == 0


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7"])
def test_plan_and_train_refuse_a_cuda_device_this_machine_lacks_before_anything_starts(home, monkeypatch, device):
    """`plan` for this machine checks train.device with the learner's own check; so does `train`,
    before Ray or a run folder."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = _plan("-c", "configs/smoke.yaml", "--set", f"train.device={device}")
    assert result.exit_code == 2 and f"train.device is '{device}'" in result.output, result.output
    assert "Traceback" not in result.output
    other = _plan("-c", "configs/smoke.yaml", "--set", f"train.device={device}", "--gpus-per-node", "8",
                  "--gpu-memory-gib", "80")  # planning another machine: its GPUs, not this one's
    assert other.exit_code == 0, other.output
    trained = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml", "--set", f"train.device={device}"])
    assert trained.exit_code == 2 and f"train.device is '{device}'" in trained.output, trained.output
    assert not list(home.glob("smoke/*")), "a refused run leaves no run folder"


def test_a_cuda_index_past_the_visible_gpus_is_refused_and_a_cluster_learner_is_left_to_its_node(monkeypatch):
    import torch

    from prompt_r1.config.base import ConfigError
    from prompt_r1.config.experiment import parse_config
    from prompt_r1.planning.machine import check_train_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("cuda:1", "cuda:7"):
        with pytest.raises(ConfigError, match=rf"train.device is '{device}' but only 1 CUDA"):
            check_train_device(parse_config({"train": {"device": device}}))
        check_train_device(parse_config({"train": {"device": device}, "rollout": {"ray_address": "head:6379"}}))
    for device in ("cuda", "cuda:0", "auto", "cpu"):
        check_train_device(parse_config({"train": {"device": device}}))


def test_logits_in_chunks_count_one_chunk_of_positions():
    """`train.logits_chunk_tokens` N: the logits term is N positions' worth where it was the whole
    response's; nothing else changes; a chunk longer than the response counts the response."""
    plain = _paper(**{"train.strategy": "ddp"})
    response = plain.agent.max_response_tokens
    whole = _by_kind(learner_parts(plain, QWEN3_4B, 512))
    for chunk in (1, 64, response - 1, response, 10 * response):
        parts = _by_kind(learner_parts(_paper(**{"train.strategy": "ddp", "train.logits_chunk_tokens": chunk}),
                                       QWEN3_4B, 512))
        assert parts["logits"] == pytest.approx(whole["logits"] * min(chunk, response) / response)
        assert {k: v for k, v in parts.items() if k != "logits"} == {k: v for k, v in whole.items() if k != "logits"}


def test_plan_names_logits_in_chunks_when_they_alone_make_a_rank_fit():
    """A rank over its memory by less than the response's logits: `plan` names
    train.logits_chunk_tokens=512 among the settings that each fit alone (each rechecked), and
    never for FSDP, which refuses it."""
    from prompt_r1.planning.fixes import LOGITS_CHUNK_TOKENS, learner_fixes, variant

    cfg = _paper(**{"train.strategy": "ddp", "train.world_size": 1, "agent.lora.enabled": False})
    parts = learner_parts(cfg, QWEN3_4B, 512)
    logits = sum(v for k, v in parts.items() if k.startswith("logits"))
    limit = sum(parts.values()) - logits / 2  # the whole response's logits do not fit; 512 positions' do
    machine = Machine(nodes=1, gpus_per_node=0)
    fixes = learner_fixes(cfg, QWEN3_4B, machine, 512, limit)
    assert f"train.logits_chunk_tokens={LOGITS_CHUNK_TOKENS}" in fixes
    chunked = variant(cfg, {"train.logits_chunk_tokens": LOGITS_CHUNK_TOKENS})
    assert sum(learner_parts(chunked, QWEN3_4B, 512).values()) <= limit
    fsdp = _paper(**{"train.strategy": "fsdp", "train.world_size": 1, "agent.lora.enabled": False})
    assert not any("logits_chunk" in f for f in learner_fixes(fsdp, QWEN3_4B, machine, 512, limit))


def test_packing_counts_its_budget_of_tokens_and_one_row_of_logits():
    """`train.pack_tokens` P: activations of P tokens where m padded rows counted m x (prompt +
    response), and the logits of one row of at most P - prompt response positions."""
    prompt = 512
    cfg = _paper(**{"train.strategy": "ddp", "train.micro_batch_size": 4})
    response = cfg.agent.max_response_tokens
    budget = 2 * (prompt + response)
    padded = learner_parts(cfg, QWEN3_4B, prompt)
    packed = learner_parts(_paper(**{"train.strategy": "ddp", "train.micro_batch_size": 4,
                                     "train.pack_tokens": budget}), QWEN3_4B, prompt)
    act = lambda parts: sum(v for k, v in parts.items() if k.startswith("activations"))  # noqa: E731
    logits = lambda parts: sum(v for k, v in parts.items() if k.startswith("logits"))  # noqa: E731
    assert act(packed) == pytest.approx(act(padded) / 2)  # half the tokens of 4 padded rows
    assert logits(packed) == pytest.approx(logits(padded) * (budget - prompt) / (4 * response))


def test_a_sharding_fix_turns_packing_and_chunks_off():
    """FSDP refuses packed micro-batches and logits in chunks, so `plan`'s FSDP fix for a config
    with them says to turn them off (and was checked with them off) instead of failing."""
    from prompt_r1.planning.fixes import learner_fixes

    cfg = _paper(**{"train.strategy": "ddp", "train.world_size": 1, "agent.lora.enabled": False,
                    "train.pack_tokens": 8192, "train.logits_chunk_tokens": 512})
    sharded_cfg = _paper(**{"train.strategy": "fsdp", "train.world_size": 8, "agent.lora.enabled": False})
    limit = sum(learner_parts(sharded_cfg, QWEN3_4B, 512).values()) + 0.1
    assert sum(learner_parts(cfg, QWEN3_4B, 512).values()) > limit
    fixes = learner_fixes(cfg, QWEN3_4B, Machine(nodes=1, gpus_per_node=16), 512, limit)  # room for engines too
    sharded = [f for f in fixes if f.startswith("train.strategy=fsdp")]
    assert sharded and sharded[0].endswith("and train.pack_tokens=0 and train.logits_chunk_tokens=0"), fixes


def test_a_colocated_transformers_engine_counts_the_sync_it_takes_on_the_gpu():
    """Full fine-tuning with transformers engines on the learner's GPU: the last sync stays in the
    learner's GPU memory until its next update (`Config.syncs_on_device`), beside the engine between
    updates and gone during one; LoRA's sync goes through the host and adds nothing there."""
    gpu = {"agent.backend": "transformers", "agent.device": "cuda", "agent.batch_invariant": False,
           "agent.dtype": "bfloat16"}
    full = make_plan(load_config(ONE_GPU, {**gpu, "agent.lora.enabled": False}), QWEN3_4B, Machine(1, 1, 80))
    lora = make_plan(load_config(ONE_GPU, gpu), QWEN3_4B, Machine(1, 1, 80))
    handed = [c for c in full.components if c.role == "engine"][0]
    plain = [c for c in lora.components if c.role == "engine"][0]
    [(name, gib)] = [(k, v) for k, v in handed.parts.items() if k.startswith("the learner's sync")]
    assert gib == pytest.approx(QWEN3_4B.params * 2 / GIB)  # its weights once more, in bfloat16
    assert not [k for k in plain.parts if k.startswith("the learner's sync")]
    assert handed.gib - plain.gib == pytest.approx(gib) and handed.asleep == pytest.approx(plain.asleep)
