"""The settings `prompt-r1 plan` names when a config does not fit, each checked to fit on its own.

Why it exists: an error that only says "does not fit" leaves the user guessing; `planning.plan`
names the settings that would make the run fit, having recomputed the plan with each one
(`learner_fixes` for a learner rank, `engine_fixes` for a vLLM engine's share), or says that only
a combination does. Kept apart from the placement itself, which calls it.
"""

from __future__ import annotations

from typing import Any

from prompt_r1.config.experiment import Config
from prompt_r1.models.architecture import Architecture
from prompt_r1.planning.memory import (Machine, colocated, engine_component, engine_kv_least, learner_parts,
                                      tensor_parallel_size)


def get_setting(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def variant(cfg: Config, changes: dict[str, Any]) -> Config:
    """`cfg` with dotted keys changed (validated, as `--set` would be)."""
    out = cfg.model_copy(deep=True)
    for dotted, value in changes.items():
        parent, _, leaf = dotted.rpartition(".")
        setattr(get_setting(out, parent), leaf, value)
    return out


LOGITS_CHUNK_TOKENS = 512  # the chunk `plan` suggests: a few hundred MiB of logits at a 150k vocabulary


def learner_fixes(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int, limit: float) -> list[str]:
    """Settings that each alone bring a learner rank within `limit` GiB, most effective first."""
    def need(changes: dict[str, Any]) -> float:
        return sum(learner_parts(variant(cfg, changes), arch, prompt_tokens).values())

    train, fixes = cfg.train, []
    if machine.gpus_per_node and train.device != "cpu":  # sharding helps only across devices
        total, tp = machine.nodes * machine.gpus_per_node, tensor_parallel_size(cfg)
        engines_on_gpu = cfg.agent.backend == "vllm" and not colocated(cfg, machine)  # colocated: none of their own
        start = train.world_size + 1 if train.strategy == "fsdp" else max(2, train.world_size)
        # FSDP runs neither packed micro-batches nor logits in chunks: a sharding fix turns them off
        unshardable = {k: 0 for k in ("train.pack_tokens", "train.logits_chunk_tokens") if get_setting(cfg, k)}
        for ranks in range(start, total + 1):
            if need({**unshardable, "train.strategy": "fsdp", "train.world_size": ranks}) > limit:
                continue
            fix = (f"train.world_size>={ranks}" if train.strategy == "fsdp"
                   else f"train.strategy=fsdp with train.world_size>={ranks}")
            fix += "".join(f" and {k}=0" for k in unshardable)
            room = (total - ranks) // tp  # engines the GPUs left can still hold
            if engines_on_gpu and cfg.rollout.num_workers > room:
                fix = f"{fix} and rollout.num_workers<={room}" if room >= 1 else ""
            fixes += [fix] if fix else []
            break
    if not cfg.agent.lora.enabled and need({"agent.lora.enabled": True}) <= limit:
        fixes.append("agent.lora.enabled=true")
    if not train.gradient_checkpointing and need({"train.gradient_checkpointing": True}) <= limit:
        fixes.append("train.gradient_checkpointing=true")
    chunk = LOGITS_CHUNK_TOKENS
    if (train.strategy != "fsdp" and not train.logits_chunk_tokens and cfg.agent.max_response_tokens > chunk
            and need({"train.logits_chunk_tokens": chunk}) <= limit):
        fixes.append(f"train.logits_chunk_tokens={chunk}")
    smaller = [m for m in range(train.micro_batch_size - 1, 0, -1) if need({"train.micro_batch_size": m}) <= limit]
    if smaller:
        fixes.append(f"train.micro_batch_size={smaller[0]}")
    if fixes:
        return fixes
    every = {"agent.lora.enabled": True, "train.gradient_checkpointing": True, "train.micro_batch_size": 1}
    gpus = machine.nodes * machine.gpus_per_node
    if 0 < gpus < train.world_size:  # shards over ranks the machine cannot hold save nothing
        every["train.world_size"] = gpus
    changes = {k: v for k, v in every.items() if get_setting(cfg, k) != v}
    together = need(changes)
    named = " and ".join(f"{k}={str(v).lower()}" for k, v in changes.items())
    return [f"no one setting is enough: {named} together need {together:.1f} GiB"
            f"{' (that fits)' if together <= limit else ', still too much'}; or use devices with more memory"]


def engine_fits(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> bool:
    """Whether a vLLM engine's share of its GPUs holds its weights, runtime and one longest sequence."""
    return engine_component(cfg, arch, machine, prompt_tokens, 0).parts["KV cache"] >= engine_kv_least(cfg, arch)


def engine_fixes(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> list[str]:
    """Settings that each alone let one rollout engine hold its weights and one sequence."""
    fixes = []
    fits = lambda changes: engine_fits(variant(cfg, changes), arch, machine, prompt_tokens)  # noqa: E731
    share = cfg.agent.vllm_gpu_memory_utilization
    higher = [u / 100 for u in range(round(share * 100) + 1, 96)
              if fits({"agent.vllm_gpu_memory_utilization": u / 100})]
    if higher:
        fixes.append(f"agent.vllm_gpu_memory_utilization>={higher[0]:g}")
    for tp in range(tensor_parallel_size(cfg) + 1, machine.gpus_per_node + 1):
        if fits({"agent.tensor_parallel_size": tp}):
            fixes.append(f"agent.tensor_parallel_size>={tp}")
            break
    if cfg.agent.dtype == "float32" and fits({"agent.dtype": "bfloat16"}):
        fixes.append("agent.dtype=bfloat16")
    return fixes + ["GPUs with more memory (--gpu-memory-gib)"]


def settings_text(fixes: list[str]) -> str:
    """`set A, or B, or ...`: fixes that are settings get `set`, the others read as they are.

    >>> settings_text(["agent.lora.enabled=true", "GPUs with more memory"])
    'set agent.lora.enabled=true, or use GPUs with more memory'
    """
    return ", or ".join(f"set {f}" if "=" in f.split(" ")[0] else
                        f if f.startswith("no one") else f"use {f}" for f in fixes)


def limit_text(machine: Machine, gpu: bool) -> str:
    total = machine.gpu_memory_gib if gpu else machine.host_memory_gib
    return f"{round(total, 1):g} GiB x {machine.usable:g} usable ({total * machine.usable:.1f} GiB)"
