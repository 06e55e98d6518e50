"""The plan for the machine at hand: its GPUs and RAM, the agent's shape, and `train`'s check.

Why it exists: `planning.plan` places a config on any machine it is given; this module finds the
machine a command runs on (`local_machine` for `prompt-r1 plan`, `_visible_machine` for a run:
this machine's GPUs or a Ray cluster's) and the agent's shape (`agent_architecture`), and runs
`preflight`, which refuses a GPU run that does not fit (or a `train.device` this machine lacks)
before any model loads. It imports no torch unless it looks for this machine's GPUs.
"""

from __future__ import annotations

import logging
import math
import os

from prompt_r1.config.experiment import Config, ConfigError
from prompt_r1.models.architecture import Architecture
from prompt_r1.planning.memory import DEFAULT_GPU_MEMORY_GIB, DEFAULT_PROMPT_TOKENS, GIB, Machine
from prompt_r1.planning.plan import Plan, PlanError, make_plan

log = logging.getLogger(__name__)


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
    None) and their memory, its RAM; each default it takes is a note. GPUs given for another
    machine leave its host memory unchecked unless `host_gib` is given."""
    notes, this_machine = [], gpus_per_node is None
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
    if host_gib is None and gpus_per_node and not this_machine:  # GPUs of another machine: not this one's RAM
        notes.append("host memory not checked (--host-memory-gib)")
        host_gib = math.inf
    elif host_gib is None and not gpus_per_node:
        notes.append("host memory: this machine's (--host-memory-gib)")
    return Machine(nodes, gpus_per_node, gpu_memory_gib or DEFAULT_GPU_MEMORY_GIB,
                   host_gib if host_gib is not None else host_memory_gib(), notes=tuple(notes))


def _visible_machine(cfg: Config) -> Machine | None:
    """The GPUs this run would use: a Ray cluster's (`rollout.ray_address`, memory from this
    machine's GPUs if it has any, else not checked), or this machine's; None without GPUs."""
    count, memory = local_gpus()
    if cfg.rollout.ray_address:
        import ray

        from prompt_r1.cluster.connect import init_ray

        init_ray(cfg.rollout)  # connecting now, not after the learner loaded, lets the plan see the cluster
        gpus = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]
        if not gpus:
            return None
        return Machine(len(gpus), min(gpus), memory if count else math.inf)  # the nodes' RAM is not known here
    return Machine(1, count, memory, host_memory_gib()) if count else None


def check_train_device(cfg: Config) -> None:
    """`train.device` against this machine's GPUs, with the learner's own check
    (`learner.devices.resolve_device`), so that `cuda` without a GPU or `cuda:7` on one GPU is refused
    before Ray starts rather than by the learner. A learner on a Ray cluster (`rollout.ray_address`)
    is left to the node it lands on; `auto` and `cpu` always resolve."""
    if cfg.train.device in ("auto", "cpu") or cfg.rollout.ray_address:
        return
    from prompt_r1.learner.devices import resolve_device

    resolve_device(cfg.train.device)


def check_train_device_on(cfg: Config, machine: Machine) -> None:
    """`train.device` against the machine a plan describes (`--gpus-per-node`): `cuda:N` needs a GPU of
    index N on a node, `cuda` any GPU; a `ConfigError` naming the setting otherwise (the learner would
    refuse it only once the run starts there).

    >>> check_train_device_on(Config.model_validate({"train": {"device": "cuda:1"}}), Machine(gpus_per_node=2))
    >>> check_train_device_on(Config.model_validate({"train": {"device": "cuda:5"}}), Machine(gpus_per_node=2))
    Traceback (most recent call last):
    ...
    prompt_r1.config.base.ConfigError: train.device is 'cuda:5', but a node of the planned machine has 2 GPU(s) (indices 0 to 1): set train.device to cuda (or cuda:0 to cuda:1), or plan for the node it runs on (--gpus-per-node)
    """
    device = cfg.train.device
    if not device.startswith("cuda"):
        return
    gpus = machine.gpus_per_node
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index < gpus:
        return
    if gpus == 0:
        raise ConfigError(f"train.device is {device!r}, but the planned machine has no GPU: set train.device to cpu, "
                          "or plan with --gpus-per-node")
    raise ConfigError(f"train.device is {device!r}, but a node of the planned machine has {gpus} GPU(s) (indices 0 "
                      f"to {gpus - 1}): set train.device to cuda (or cuda:0 to cuda:{gpus - 1}), or plan for the "
                      "node it runs on (--gpus-per-node)")


def check_rollout_device(cfg: Config) -> None:
    """`agent.device: cuda` on a local Ray instance needs a GPU torch can see here: refused before Ray
    starts, not by each rollout actor (`policy.hf.rollout_device`). A cluster is left to its nodes."""
    if cfg.agent.device != "cuda" or cfg.rollout.ray_address:
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"agent.device is 'cuda' but torch {torch.__version__} sees no CUDA GPU on this machine: "
                          "set agent.device to cpu and rollout.gpus_per_worker to 0, or run where a GPU is visible")


def check_model_sources(cfg: Config) -> None:
    """The model of each in-process training environment (`train.environments`, else `environment`)
    can load here: no hub id an offline machine cannot fetch, no missing folder. It loads inside
    each rollout actor, where a failure reached the user as hundreds of lines of `ActorDiedError`;
    here it is one `ModelLoadError` naming the setting, before Ray starts. (`agent.model`:
    `resolver.check_agent_spec`.)"""
    from prompt_r1.models.bundled import check_model_source

    pool = cfg.train.environments
    for index, env in enumerate(cfg.training_environments()):
        if env.kind == "inprocess":
            where = f"train.environments[{index}]" if pool else "environment"
            check_model_source(env.model, f"{where} `{env.name}` (its `model`)")


def check_before_ray(cfg: Config) -> None:
    """What a training run would otherwise learn only inside Ray: `train.device` (`check_train_device`),
    `agent.device` (`check_rollout_device`) and the models the actors load (`check_model_sources`).
    Takes seconds and starts nothing."""
    check_train_device(cfg)
    check_rollout_device(cfg)
    check_model_sources(cfg)


def preflight(cfg: Config, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> Plan | None:
    """`train`'s check before any model loads: `train.device` (`check_train_device`), then the plan
    for the GPUs the run would use; raises `PlanError` when it does not fit. A run that uses no GPU
    is left alone (None)."""
    from prompt_r1.models.architecture import architecture_for

    check_train_device(cfg)
    check_rollout_device(cfg)

    if cfg.train.device == "cpu" and cfg.agent.backend != "vllm" and cfg.agent.device == "cpu":
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
