"""Whether a config fits the machines, before any model loads: a placement and a verdict.

Why it exists: a run that does not fit finds out minutes in, after models load and placement
groups wait, or a GPU runs out of memory mid-step. `prompt-r1 plan` prints `make_plan`'s result;
`train` runs `preflight` before it loads a model when the run would use GPUs. Memory per process
comes from `planning.memory` (the rule, stated once). This module places the processes on
`nodes` x `gpus_per_node` GPUs in the order the run reserves them: learner ranks, one GPU each,
then rollout engines, `agent.tensor_parallel_size` GPUs on one node each; each gets GPUs of its
own, except that colocated engines (`rollout.colocate`) share their learner ranks' GPUs and a
managed environment server shares node 0's first GPU. A GPU that several components share fits
when both phases fit: between updates (the learner's resident memory beside every engine's
share) and during an update (the learner's peak beside colocated engines asleep). On GPU
machines whose host memory is known, each node's host memory is checked too (the learner's
start-up copy, colocated engines' offloaded weights). When something does not fit,
it names the settings to change, having checked that each one alone makes it fit (or saying that
none does). What machine and agent a plan is made for, and `train`'s check, are in
`planning.machine`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prompt_r1.config.experiment import Config
from prompt_r1.core.failures import UserError
from prompt_r1.models.architecture import Architecture
from prompt_r1.planning.memory import (
    DEFAULT_PROMPT_TOKENS, Component, Machine, colocated, components, engine_kv_least,
    in_process_share, tensor_parallel_size,
)
from prompt_r1.planning.fixes import (engine_fits, engine_fixes, learner_fixes, limit_text, settings_text,
                                           variant)


class PlanError(UserError, RuntimeError):
    """The config does not fit the machines; the message says what does not and what to change."""


def memory_problems(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int,
                    comps: list[Component]) -> list[str]:
    """Components too big for one device (a GPU, or one node's host memory), at their peak or,
    for a learner rank, while it starts."""
    problems = []
    for role in ("learner", "engine"):
        first = next((c for c in comps if c.role == role), None)
        if first is None:
            continue
        if role == "engine" and first.gpus and cfg.agent.backend == "vllm":  # the rest of its share holds a sequence
            if not engine_fits(cfg, arch, machine, prompt_tokens):
                problems.append(
                    f"a rollout engine's share (agent.vllm_gpu_memory_utilization "
                    f"{cfg.agent.vllm_gpu_memory_utilization:g} x {machine.gpu_memory_gib:g} GiB) leaves "
                    f"{first.parts['KV cache']:.1f} GiB of KV cache after its weights and runtime, less than one "
                    f"sequence of agent.vllm_max_model_len {cfg.agent.vllm_max_model_len} tokens "
                    f"({engine_kv_least(cfg, arch):.1f} GiB), so vLLM would not start: "
                    + settings_text(engine_fixes(cfg, arch, machine, prompt_tokens)))
            continue
        if role == "learner" and first.startup and sum(first.startup.values()) > machine.gpu_limit:
            problems.append(f"a learner rank needs {sum(first.startup.values()):.1f} GiB while it starts > "
                            f"{limit_text(machine, True)}: raise train.world_size under train.strategy fsdp, or "
                            "use GPUs with more memory")
        limit = machine.gpu_limit if first.gpus else machine.host_limit
        if first.gib <= limit:
            continue
        what = "a learner rank" if role == "learner" else "a rollout engine"
        fixes = (learner_fixes(cfg, arch, machine, prompt_tokens, limit) if role == "learner"
                 else ["lower rollout.batch_questions, rollout.group_size or agent.max_response_tokens, or raise "
                       "rollout.num_workers (the rows are split over the engines)"] if first.gpus and cfg.agent.device == "cuda"
                 else engine_fixes(cfg, arch, machine, prompt_tokens) if first.gpus
                 else ["a smaller agent or a machine with more memory (--host-memory-gib)"])
        problems.append(f"{what} needs {first.gib:.1f} GiB > {limit_text(machine, bool(first.gpus))}: "
                        + settings_text(fixes))
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
    problems = []
    if colocated(cfg, machine) and cfg.rollout.num_workers * tensor_parallel_size(cfg) > cfg.train.world_size:
        problems.append(f"rollout.colocate: {cfg.rollout.num_workers} engine(s) x {tensor_parallel_size(cfg)} GPUs "
                        f"share the GPUs of {cfg.train.world_size} learner rank(s): lower rollout.num_workers or "
                        "raise train.world_size")
    need, have = gpus_used(comps), machine.nodes * machine.gpus_per_node
    if need <= have:
        return problems
    learners = sum(1 for c in comps if c.role == "learner" and c.gpus)
    engines = sum(1 for c in comps if c.role == "engine" and c.gpus and not c.shared)
    return problems + [
        f"the run needs {need} GPUs ({learners} learner ranks + {engines} rollout engines x "
        f"{tensor_parallel_size(cfg)}) but {machine.describe()} has {have}: lower train.world_size or "
        "rollout.num_workers, or add GPUs or nodes (--gpus-per-node, --nodes)"
        + ("" if cfg.rollout.colocate or cfg.agent.backend != "vllm" else
           ", or set rollout.colocate=true (engines on the learner's GPUs)")]


def gpus_used(comps: list[Component]) -> int:
    """GPUs the components hold (a shared one takes none of its own)."""
    return sum(c.gpus for c in comps if not c.shared)


def place(machine: Machine, comps: list[Component]) -> list[str]:
    """Give each component a node and GPUs, first fit in the order the run reserves them (an
    engine's GPUs on one node; a colocated engine on its learner ranks' GPUs; another shared
    component on node 0's first GPU, beside what is there; host memory summed per node: CPU
    components, and GPU components' host parts where the host memory is known); what cannot be
    placed, or overfills a node's host memory, as problems (shared GPUs: `sharing_problems`)."""
    free = [list(range(machine.gpus_per_node)) for _ in range(machine.nodes)]
    host = [0.0] * machine.nodes
    learners = [c for c in comps if c.role == "learner" and c.gpus]
    problems = []
    for comp in comps:
        if comp.colocated:  # engine i on the GPUs of ranks i x tp .. (i+1) x tp - 1
            index = sum(1 for c in comps[:comps.index(comp)] if c.colocated)
            ranks = learners[index * comp.gpus:(index + 1) * comp.gpus]
            nodes = {r.node for r in ranks}
            if len(ranks) < comp.gpus or len(nodes) != 1 or None in nodes:
                problems.append(f"{comp.name} shares the GPUs of learner ranks {index * comp.gpus}-"
                                f"{(index + 1) * comp.gpus - 1}, which are not {comp.gpus} placed ranks on one node: "
                                "lower agent.tensor_parallel_size or rollout.num_workers, or use more GPUs per node")
                continue
            comp.node, comp.devices = ranks[0].node, [d for r in ranks for d in r.devices]
        elif comp.shared:
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
                                f"left ({limit_text(machine, False)} each, {max(host):.1f} GiB taken on the fullest): "
                                "lower rollout.num_workers or train.world_size, "
                                + ("lower environment.concurrency or cap every CPU engine's KV cache with "
                                   "VLLM_CPU_KVCACHE_SPACE=<GiB>, " if comp.role == "environment" else "")
                                + "or use a machine with more memory")
                continue
            comp.node = node
            host[node] += comp.gib
    for node in range(machine.nodes):
        held = [(f"{c.name} {name}", gib) for c in comps if c.gpus and c.node == node for name, gib in c.host.items()]
        total = host[node] + sum(gib for _, gib in held)
        if held and total > machine.host_limit:
            problems.append(f"node {node}'s host memory holds {total:.1f} GiB > {limit_text(machine, False)} ("
                            + "; ".join(f"{name} {gib:.1f}" for name, gib in held) + "): use nodes with more host "
                            "memory (--host-memory-gib), fewer learner ranks or engines per node, or a smaller agent")
    return problems


def sharing_problems(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int,
                     comps: list[Component]) -> list[str]:
    """GPUs that several components share and that overfill in one of the two phases: between
    updates (every component's resident memory: a learner's `RESIDENT` parts, an engine's share)
    or during an update (a learner's peak beside colocated engines asleep); the first such GPU,
    with the settings that would fix it."""
    placed = {(c.node, d) for c in comps if c.gpus and c.node is not None for d in c.devices}
    for node, device in sorted(placed):
        on = [c for c in comps if c.gpus and c.node == node and device in c.devices]
        between = sum(c.resident for c in on)
        during = sum(c.asleep if c.colocated else c.gib for c in on)
        if len(on) < 2 or max(between, during) <= machine.gpu_limit:
            continue
        phase, need = ("between updates", between) if between >= during else ("during an update", during)
        fixes = []
        if any(c.role == "environment" for c in on):
            fixes.append("lower environment.gpu_memory_utilization, or use an `openai` environment served elsewhere")
        engine = next((c for c in on if c.role == "engine"), None)
        if engine is not None and between > machine.gpu_limit:
            room = machine.gpu_limit - (between - engine.gib)  # what the others leave the engine
            most = math.floor(room / machine.gpu_memory_gib * 100) / 100
            if most > 0 and engine_fits(variant(cfg, {"agent.vllm_gpu_memory_utilization": most}), arch, machine,
                                        prompt_tokens):
                fixes.append(f"set agent.vllm_gpu_memory_utilization<={most:g}")
        learner = next((c for c in on if c.role == "learner"), None)
        if learner is not None and during > machine.gpu_limit:
            fixes += [settings_text(learner_fixes(cfg, arch, machine, prompt_tokens,
                                              machine.gpu_limit - (during - learner.gib)))]
        held = [c.resident if phase == "between updates" else c.asleep if c.colocated else c.gib for c in on]
        shown = " + ".join(f"{c.name} {gib:.1f}" for c, gib in zip(on, held))
        return [f"node {node} GPU {device} holds {shown} = {need:.1f} GiB {phase} > {limit_text(machine, True)}: "
                + (", or ".join(fixes) if fixes else "use GPUs with more memory (--gpu-memory-gib)")]
    return []


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
    evaluation: str = ""  # where evaluation's agent engines run after training (`evaluation_text`)

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
        together = [c for c in self.components if c.colocated and c.node is not None]
        if together:  # the learner's GPU in both phases (`sharing_problems`)
            on = [c for c in self.components if c.gpus and c.node == learner.node and learner.devices[0] in c.devices]
            tail += (f"; its GPU, shared, holds {sum(c.resident for c in on):.1f} GiB between updates and "
                     f"{sum(c.asleep if c.colocated else c.gib for c in on):.1f} during one")
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
            if first.startup:
                lines.append(f"  {'while it starts, per GPU':<52} {sum(first.startup.values()):>7.2f}")
            if first.role == "learner" and first.gpus and any(c.shared for c in self.components):
                lines.append(f"  {'between updates (kept on the GPU)':<52} {first.resident:>7.2f}")
            if first.colocated:
                lines.append(f"  {'asleep, during an update':<52} {first.asleep:>7.2f}")
            lines += [f"  {'host: ' + name:<52} {gib:>7.2f}" for name, gib in first.host.items()]
            lines += [f"  ({note})" for note in first.notes]
        lines += ["", f"evaluation (after training): {self.evaluation}"] if self.evaluation else []
        return "\n".join(lines + ["", self.verdict() if self.fits else "does not fit (the error below says why)"])

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (`prompt-r1 plan --json`)."""
        r = lambda x: None if math.isinf(x) else round(x, 3)  # noqa: E731  (inf: not checked)
        return {
            "fits": self.fits, "verdict": self.verdict(), "problems": self.problems, "config": self.source,
            "model": {"name": self.arch.name, "params": self.arch.params, "source": self.arch.source},
            "machine": {"nodes": self.machine.nodes, "gpus_per_node": self.machine.gpus_per_node,
                        "gpu_memory_gib": r(self.machine.gpu_memory_gib),
                        "host_memory_gib": r(self.machine.host_memory_gib),
                        "usable": self.machine.usable, "notes": list(self.machine.notes)},
            "prompt_tokens": self.prompt_tokens, "response_tokens": self.response_tokens, "evaluation": self.evaluation,
            "components": [{"name": c.name, "role": c.role, "gpus": c.gpus, "gib": r(c.gib), "node": c.node,
                            "devices": c.devices, "parts": {k: r(v) for k, v in c.parts.items()}, "notes": c.notes,
                            "resident_gib": r(c.resident), "startup": {k: r(v) for k, v in c.startup.items()},
                            "host": {k: r(v) for k, v in c.host.items()}, "colocated": c.colocated}
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
    if not problems:  # a placement of what cannot fit says nothing
        problems += place(machine, comps)
        problems += sharing_problems(cfg, arch, machine, prompt_tokens, comps) if not problems else []
    return Plan(source, arch, machine, prompt_tokens, cfg.agent.max_response_tokens, comps, problems,
                evaluation_text(cfg, arch, machine, prompt_tokens))


def evaluation_text(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> str:
    """Where evaluation's agent engines run on `machine` (`config.evaluation.engine_place`, the rule
    `evaluate` follows), once training has given its GPUs back, and each vLLM engine's share; a
    share too small for an engine to start is said (evaluation is not refused here: `train` is).

    >>> from prompt_r1.config.experiment import load_config
    >>> from prompt_r1.planning.machine import agent_architecture
    >>> paper = load_config("configs/paper.yaml")
    >>> evaluation_text(paper, agent_architecture(paper), Machine(gpus_per_node=8), 512)  # doctest: +ELLIPSIS
    '2 agent engines (base, trained), each placed by Ray on 1 GPU of its own, at agent.vllm_gpu_..._utilization 0.9 each'
    """
    from prompt_r1.config.evaluation import engine_place

    agents = cfg.eval.agent_checkpoints if {"agent", "agent_only"} & set(cfg.eval.methods) else []
    if not agents:
        return ""
    tp, gpus = cfg.agent.tensor_parallel_size, machine.nodes * machine.gpus_per_node
    place = engine_place(cfg.eval.agent_placement, cfg.agent.backend, len(agents), tp, gpus)
    what = f"{len(agents)} agent engine{'s' if len(agents) > 1 else ''} ({', '.join(agents)})"
    if cfg.agent.backend != "vllm" or not gpus:
        where = "each a Ray actor" if place == "ray" else "in the driver's process"
        return f"{what}, {where}, on CPU"
    share = in_process_share(cfg, 1 if place == "ray" else len(agents))
    text = (f"{what}, each placed by Ray on {tp} GPU{'s' if tp > 1 else ''} of its own" if place == "ray" else
            f"{what} need {len(agents) * tp} GPUs and {machine.describe()} has {gpus}: they share the driver's first "
            "GPU (evaluate warns)" if place == "shared" else f"{what} in the driver's process, sharing its first GPU")
    text += f", at agent.vllm_gpu_memory_utilization {share:g} each"
    if not engine_fits(variant(cfg, {"agent.vllm_gpu_memory_utilization": share}), arch, machine, prompt_tokens):
        text += (": too little for a vLLM engine to hold its weights and one sequence, so evaluation would fail "
                 "to start it; " + ("evaluate fewer agents at once (eval.agent_checkpoints), or use more GPUs"
                                    if place != "ray" else settings_text(engine_fixes(cfg, arch, machine,
                                                                                      prompt_tokens))))
    return text
