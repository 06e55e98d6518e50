"""Whether a config fits the machines, before any model loads: a placement and a verdict.

Why it exists: a run that does not fit finds out minutes in, after models load and placement
groups wait, or a GPU runs out of memory mid-step. `prompt-r1 plan` prints `make_plan`'s result;
`train` runs `preflight` before it loads a model when the run would use GPUs. Memory per process
comes from `training.memory` (the rule, stated once). This module places the processes on
`nodes` x `gpus_per_node` GPUs in the order the run reserves them: learner ranks, one GPU each,
then rollout engines, `agent.tensor_parallel_size` GPUs on one node each; each gets GPUs of its
own, while a managed environment server shares node 0's first GPU. When something does not fit,
it names the settings to change, having checked that each one alone makes it fit (or saying that
none does). It imports no torch unless it looks for this machine's GPUs.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from prompt_r1.config.experiment import Config
from prompt_r1.core.failures import UserError
from prompt_r1.models.architecture import Architecture
from prompt_r1.training.memory import (
    DEFAULT_GPU_MEMORY_GIB, DEFAULT_PROMPT_TOKENS, GIB, Component, Machine, components, engine_component,
    learner_parts, tensor_parallel_size,
)

log = logging.getLogger(__name__)


class PlanError(UserError, RuntimeError):
    """The config does not fit the machines; the message says what does not and what to change."""


def _get(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _variant(cfg: Config, changes: dict[str, Any]) -> Config:
    """`cfg` with dotted keys changed (validated, as `--set` would be)."""
    out = cfg.model_copy(deep=True)
    for dotted, value in changes.items():
        parent, _, leaf = dotted.rpartition(".")
        setattr(_get(out, parent), leaf, value)
    return out


def learner_fixes(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int, limit: float) -> list[str]:
    """Settings that each alone bring a learner rank within `limit` GiB, most effective first."""
    def need(changes: dict[str, Any]) -> float:
        return sum(learner_parts(_variant(cfg, changes), arch, prompt_tokens).values())

    train, fixes = cfg.train, []
    if machine.gpus_per_node and train.device != "cpu":  # sharding helps only across devices
        total, tp = machine.nodes * machine.gpus_per_node, tensor_parallel_size(cfg)
        engines_on_gpu = cfg.agent.backend == "vllm"
        start = train.world_size + 1 if train.strategy == "fsdp" else max(2, train.world_size)
        for ranks in range(start, total + 1):
            if need({"train.strategy": "fsdp", "train.world_size": ranks}) > limit:
                continue
            fix = (f"train.world_size>={ranks}" if train.strategy == "fsdp"
                   else f"train.strategy=fsdp with train.world_size>={ranks}")
            room = (total - ranks) // tp  # engines the GPUs left can still hold
            if engines_on_gpu and cfg.rollout.num_workers > room:
                fix = f"{fix} and rollout.num_workers<={room}" if room >= 1 else ""
            fixes += [fix] if fix else []
            break
    if not cfg.agent.lora.enabled and need({"agent.lora.enabled": True}) <= limit:
        fixes.append("agent.lora.enabled=true")
    if not train.gradient_checkpointing and need({"train.gradient_checkpointing": True}) <= limit:
        fixes.append("train.gradient_checkpointing=true")
    smaller = [m for m in range(train.micro_batch_size - 1, 0, -1) if need({"train.micro_batch_size": m}) <= limit]
    if smaller:
        fixes.append(f"train.micro_batch_size={smaller[0]}")
    if fixes:
        return fixes
    every = {"agent.lora.enabled": True, "train.gradient_checkpointing": True, "train.micro_batch_size": 1}
    gpus = machine.nodes * machine.gpus_per_node
    if 0 < gpus < train.world_size:  # shards over ranks the machine cannot hold save nothing
        every["train.world_size"] = gpus
    changes = {k: v for k, v in every.items() if _get(cfg, k) != v}
    together = need(changes)
    named = " and ".join(f"{k}={str(v).lower()}" for k, v in changes.items())
    return [f"no one setting is enough: {named} together need {together:.1f} GiB"
            f"{' (that fits)' if together <= limit else ', still too much'}; or use devices with more memory"]


def engine_fixes(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> list[str]:
    """Settings that let one rollout engine hold its weights and one sequence."""
    fixes = []
    if hasattr(cfg.agent, "tensor_parallel_size"):
        for tp in range(tensor_parallel_size(cfg) + 1, machine.gpus_per_node + 1):
            engine = engine_component(_variant(cfg, {"agent.tensor_parallel_size": tp}), arch, machine, prompt_tokens, 0)
            if engine.gib <= machine.gpu_limit:
                fixes.append(f"agent.tensor_parallel_size>={tp}")
                break
    if cfg.agent.dtype == "float32":
        fixes.append("agent.dtype=bfloat16")
    return fixes + ["GPUs with more memory (--gpu-memory-gib)"]


def _settings(fixes: list[str]) -> str:
    """`set A, or B, or ...`: fixes that are settings get `set`, the others read as they are.

    >>> _settings(["agent.lora.enabled=true", "GPUs with more memory"])
    'set agent.lora.enabled=true, or use GPUs with more memory'
    """
    return ", or ".join(f"set {f}" if "=" in f.split(" ")[0] else
                        f if f.startswith("no one") else f"use {f}" for f in fixes)


def _limit_text(machine: Machine, gpu: bool) -> str:
    total = machine.gpu_memory_gib if gpu else machine.host_memory_gib
    return f"{round(total, 1):g} GiB x {machine.usable:g} usable ({total * machine.usable:.1f} GiB)"


def memory_problems(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int,
                    comps: list[Component]) -> list[str]:
    """Components too big for one device (a GPU, or one node's host memory)."""
    problems = []
    for role in ("learner", "engine"):
        first = next((c for c in comps if c.role == role), None)
        if first is None:
            continue
        limit = machine.gpu_limit if first.gpus else machine.host_limit
        if first.gib <= limit:
            continue
        what = "a learner rank" if role == "learner" else "a rollout engine"
        fixes = (learner_fixes(cfg, arch, machine, prompt_tokens, limit) if role == "learner"
                 else engine_fixes(cfg, arch, machine, prompt_tokens) if first.gpus
                 else ["a smaller agent or a machine with more memory (--host-memory-gib)"])
        problems.append(f"{what} needs {first.gib:.1f} GiB > {_limit_text(machine, bool(first.gpus))}: "
                        + _settings(fixes))
    return problems


def length_problems(cfg: Config, prompt_tokens: int) -> list[str]:
    """A vLLM agent engine whose longest sequence is shorter than a trajectory: it would refuse
    a trajectory's later turns."""
    agent = cfg.agent
    seq = prompt_tokens + agent.max_response_tokens
    if agent.backend != "vllm" or agent.vllm_max_model_len >= seq:
        return []
    return [f"agent.vllm_max_model_len is {agent.vllm_max_model_len} tokens, shorter than a trajectory "
            f"({prompt_tokens} prompt tokens, an estimate: --prompt-tokens, + agent.max_response_tokens "
            f"{agent.max_response_tokens}), so the engine would refuse its later turns: set "
            f"agent.vllm_max_model_len>={seq}"]


def count_problems(cfg: Config, machine: Machine, comps: list[Component]) -> list[str]:
    """More GPUs asked for than the machines have, as a problem naming what asks for them."""
    need, have = gpus_used(comps), machine.nodes * machine.gpus_per_node
    if need <= have:
        return []
    learners = sum(1 for c in comps if c.role == "learner" and c.gpus)
    engines = sum(1 for c in comps if c.role == "engine" and c.gpus)
    return [f"the run needs {need} GPUs ({learners} learner ranks + {engines} rollout engines x "
            f"{tensor_parallel_size(cfg)}) but {machine.describe()} has {have}: lower train.world_size or "
            "rollout.num_workers, or add GPUs or nodes (--gpus-per-node, --nodes)"]


def gpus_used(comps: list[Component]) -> int:
    """GPUs the components hold (a shared one takes none of its own)."""
    return sum(c.gpus for c in comps if not c.shared)


def place(machine: Machine, comps: list[Component]) -> list[str]:
    """Give each component a node and GPUs, first fit in the order the run reserves them (an
    engine's GPUs on one node; a shared component on node 0's first GPU, beside what is there;
    host memory summed per node); what cannot be placed, or overfills a device, as problems."""
    free = [list(range(machine.gpus_per_node)) for _ in range(machine.nodes)]
    host = [0.0] * machine.nodes
    problems = []
    for comp in comps:
        if comp.shared:
            comp.node, comp.devices = 0, [0]
        elif comp.gpus:
            node = next((n for n in range(machine.nodes) if len(free[n]) >= comp.gpus), None)
            if node is None:
                problems.append(f"{comp.name} needs {comp.gpus} GPUs on one node, and no node has that many "
                                "left after the components before it: use fewer GPUs per engine or more per node")
                continue
            comp.node, comp.devices, free[node] = node, free[node][:comp.gpus], free[node][comp.gpus:]
        else:
            node = next((n for n in range(machine.nodes) if host[n] + comp.gib <= machine.host_limit), None)
            if node is None:
                problems.append(f"{comp.name} needs {comp.gib:.1f} GiB of host memory and no node has that much "
                                f"left ({_limit_text(machine, False)} each, {max(host):.1f} GiB taken on the fullest): "
                                "lower rollout.num_workers or train.world_size, or use a machine with more memory")
                continue
            comp.node = node
            host[node] += comp.gib
    for shared in (c for c in comps if c.shared):
        beside = [c for c in comps if c.gpus and c.node == shared.node and shared.devices[0] in c.devices]
        total = sum(c.gib for c in beside)
        if total > machine.gpu_limit:
            problems.append(f"node 0 GPU 0 holds {' + '.join(c.name for c in beside)} = {total:.1f} GiB > "
                            f"{_limit_text(machine, True)}: lower environment.gpu_memory_utilization, or use an "
                            "`openai` environment served elsewhere")
    return problems


@dataclass
class Plan:
    """The estimate and placement of one config on one machine, with its verdict."""

    source: str
    arch: Architecture
    machine: Machine
    prompt_tokens: int
    response_tokens: int
    components: list[Component]
    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems

    def error(self) -> str:
        return f"{self.source} does not fit {self.machine.describe()}: " + "; ".join(self.problems)

    def verdict(self) -> str:
        if not self.fits:
            return self.error()
        used = gpus_used(self.components)
        learner = next((c for c in self.components if c.role == "learner"), None)
        if self.machine.gpus_per_node:
            head = f"fits: {used} of {self.machine.nodes * self.machine.gpus_per_node} GPUs used"
        else:
            head = "fits in host memory"
        if learner is None:
            return head
        limit = self.machine.gpu_limit if learner.gpus else self.machine.host_limit
        host = sum(c.gib for c in self.components if not c.gpus and c.node == 0)
        tail = (f"a learner rank needs {learner.gib:.1f} of {limit:.1f} GiB usable" if learner.gpus
                else f"node 0 holds {host:.1f} of {limit:.1f} GiB usable")
        return f"{head}; {tail}"

    def render(self) -> str:
        """The plan as text: a table (component, GiB, where), each kind's parts, the verdict."""
        a = self.arch
        lines = [f"plan for {self.source}: agent {a.name}, {count_text(a.params)} parameters ({a.source})",
                 f"machine: {self.machine.describe()}", *(f"note: {n}" for n in self.machine.notes),
                 f"sequences: {self.prompt_tokens} prompt (an estimate; --prompt-tokens) + {self.response_tokens} "
                 "response tokens (agent.max_response_tokens)", ""]
        unit = "GiB per GPU" if self.machine.gpus_per_node else "GiB"
        width = max([len(c.name) for c in self.components] + [9])
        lines.append(f"{'component':<{width}}  {unit:>11}  where")
        lines += [f"{c.name:<{width}}  {c.gib:>11.1f}  {c.where()}" for c in self.components]
        for role in ("learner", "engine", "environment"):
            first = next((c for c in self.components if c.role == role), None)
            if first is None:
                continue
            title = {"learner": "each learner rank", "engine": "each rollout engine",
                     "environment": "the environment server"}[role]
            lines += ["", f"{title}{', per GPU' if first.gpus else ' (host memory)'}:"]
            lines += [f"  {name:<52} {gib:>7.2f}" for name, gib in first.parts.items()]
            lines += [f"  ({note})" for note in first.notes]
        return "\n".join(lines + ["", self.verdict() if self.fits else "does not fit (the error below says why)"])

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (`prompt-r1 plan --json`)."""
        r = lambda x: round(x, 3)  # noqa: E731
        return {
            "fits": self.fits, "verdict": self.verdict(), "problems": self.problems, "config": self.source,
            "model": {"name": self.arch.name, "params": self.arch.params, "source": self.arch.source},
            "machine": {"nodes": self.machine.nodes, "gpus_per_node": self.machine.gpus_per_node,
                        "gpu_memory_gib": self.machine.gpu_memory_gib, "host_memory_gib": r(self.machine.host_memory_gib),
                        "usable": self.machine.usable, "notes": list(self.machine.notes)},
            "prompt_tokens": self.prompt_tokens, "response_tokens": self.response_tokens,
            "components": [{"name": c.name, "role": c.role, "gpus": c.gpus, "gib": r(c.gib), "node": c.node,
                            "devices": c.devices, "parts": {k: r(v) for k, v in c.parts.items()}, "notes": c.notes}
                           for c in self.components],
        }


def count_text(n: float) -> str:
    """A parameter count for people.

    >>> count_text(4022468096), count_text(134515008)
    ('4.02B', '134.5M')
    """
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def make_plan(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
              source: str = "config") -> Plan:
    """Estimate every component of `cfg` on `machine`, place them, and say whether it fits."""
    comps = components(cfg, arch, machine, prompt_tokens)
    problems = (length_problems(cfg, prompt_tokens) + memory_problems(cfg, arch, machine, prompt_tokens, comps)
                + count_problems(cfg, machine, comps))
    problems += place(machine, comps) if not problems else []  # a placement of what cannot fit says nothing
    return Plan(source, arch, machine, prompt_tokens, cfg.agent.max_response_tokens, comps, problems)


def agent_architecture(cfg: Config, params: float | None = None) -> Architecture:
    """The agent's shape (`models.architecture`), its count replaced by `params` when given; a
    guessed shape of `params` weights for a model with none here, or whose config.json cannot be
    sized (malformed, mixture-of-experts: its error asks for --params); else an error asking for them."""
    from prompt_r1.models.architecture import ArchitectureError, architecture_for

    try:
        arch = architecture_for(cfg.agent.model, cfg.name)
    except ArchitectureError as err:
        if params is None:
            raise
        log.warning("%s; planning with a shape guessed from --params %g instead", err, params)
        return Architecture.guess(params, cfg.agent.model)
    if arch is not None:
        return arch.with_params(params)
    if params is None:
        raise ArchitectureError(f"agent.model {cfg.agent.model!r} has no config.json here and no known "
                                "architecture (prompt_r1/models/architectures.json): pass its parameter count, "
                                "e.g. --params 4e9")
    return Architecture.guess(params, cfg.agent.model)


def host_memory_gib() -> float:
    """This machine's RAM."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def local_gpus() -> tuple[int, float]:
    """(CUDA GPUs this process sees, the smallest one's memory in GiB); (0, 0) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0.0
    count = torch.cuda.device_count()
    return count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / GIB


def local_machine(nodes: int = 1, gpus_per_node: int | None = None, gpu_memory_gib: float | None = None,
                  host_gib: float | None = None) -> Machine:
    """A machine from what was given, the rest from this one: its GPUs (when `gpus_per_node` is
    None) and their memory, its RAM; each default it takes is a note."""
    notes = []
    count, memory = local_gpus() if gpus_per_node is None or (gpus_per_node and gpu_memory_gib is None) else (0, 0.0)
    if gpus_per_node is None:
        gpus_per_node = count
        notes.append(f"{count} GPUs per node, as this machine has (--gpus-per-node)" if count else
                     "this machine has no GPU: planned for its host memory (--gpus-per-node N "
                     "--gpu-memory-gib M plans for GPUs)")
    elif not gpus_per_node:
        notes.append("--gpus-per-node 0: planned for host memory")
    if gpus_per_node and gpu_memory_gib is None:
        gpu_memory_gib = memory or DEFAULT_GPU_MEMORY_GIB
        notes.append(f"GPU memory {gpu_memory_gib:.1f} GiB, {'as this machine has' if memory else 'assumed'} "
                     "(--gpu-memory-gib)")
    if not gpus_per_node and host_gib is None:
        notes.append("host memory: this machine's (--host-memory-gib)")
    return Machine(nodes, gpus_per_node, gpu_memory_gib or DEFAULT_GPU_MEMORY_GIB,
                   host_gib if host_gib is not None else host_memory_gib(), notes=tuple(notes))


def _visible_machine(cfg: Config) -> Machine | None:
    """The GPUs this run would use: a Ray cluster's (`rollout.ray_address`, memory from this
    machine's GPUs if it has any, else not checked), or this machine's; None without GPUs."""
    count, memory = local_gpus()
    if cfg.rollout.ray_address:
        import ray

        from prompt_r1.rollout.ray_pool import init_ray

        init_ray(cfg.rollout)  # connecting now, not after the learner loaded, lets the plan see the cluster
        gpus = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]
        if not gpus:
            return None
        return Machine(len(gpus), min(gpus), memory if count else math.inf, host_memory_gib())
    return Machine(1, count, memory, host_memory_gib()) if count else None


def preflight(cfg: Config, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> Plan | None:
    """`train`'s check before any model loads: the plan for the GPUs the run would use; raises
    `PlanError` when it does not fit. A run that uses no GPU is left alone (None)."""
    from prompt_r1.models.architecture import architecture_for

    if cfg.train.device == "cpu" and cfg.agent.backend != "vllm":
        return None
    machine = _visible_machine(cfg)
    if machine is None:
        log.debug("no GPU in sight: no plan check before training")
        return None
    arch = architecture_for(cfg.agent.model, cfg.name)
    if arch is None:
        log.warning("no plan check: agent.model %s has no config.json here and no known architecture", cfg.agent.model)
        return None
    plan = make_plan(cfg, arch, machine, prompt_tokens, source=f"config {cfg.name!r}")
    if not plan.fits:
        raise PlanError(plan.error() + " (`prompt-r1 plan -c FILE` prints the whole plan)")
    log.info("plan: %s", plan.verdict())
    return plan
