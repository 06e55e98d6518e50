"""Where rollout actors run: each in its own placement group of one bundle sized by the agent backend.

One rule decides a rollout actor's bundle (`engine_bundle`), so what a pool asks of Ray is
explicit and the same on a laptop and a cluster:

- `agent.backend: vllm` on a Ray cluster with GPUs: `{GPU: agent.tensor_parallel_size, CPU:
  rollout.cpus_per_worker}`. One bundle keeps an engine's tensor-parallel GPUs on one node (vLLM
  then runs its extra ranks as local processes on the GPUs Ray gave the actor). A cluster with
  fewer GPUs than the pool needs is a placement error naming what is missing, never a silent
  fall-back to CPU.
- the transformers backend with `rollout.gpus_per_worker` g > 0 (`agent.device: cuda`): `{CPU:
  rollout.cpus_per_worker, GPU: g}`; a fraction lets Ray pack several actors on one GPU (it sets
  each one's `CUDA_VISIBLE_DEVICES` to the GPU it chose). A cluster without GPUs is refused.
- otherwise (the transformers backend on CPU, or vLLM on a cluster without GPUs): `{CPU:
  rollout.cpus_per_worker}`. Such an actor gets `CUDA_VISIBLE_DEVICES=""`: Ray leaves the
  variable alone for actors without GPUs, so they would see every GPU of their node, also those
  Ray gave to learner ranks or other engines.

- `rollout.colocate` with the vllm backend (or the transformers backend on `cuda`) and a learner
  on GPUs: engine i shares the GPUs of learner ranks i x tp .. (i+1) x tp - 1 (`shared_gpus`). Its
  bundle is `{CPU: rollout.cpus_per_worker, node:<ip>: 0.001}`, Ray's own per-node resource, so it
  lands on those ranks' node; it holds no GPU of Ray's (the ranks hold them) and gets
  `CUDA_VISIBLE_DEVICES` set to the ranks' GPU ids, the ids Ray gave the ranks. A vLLM engine's
  memory is `agent.vllm_gpu_memory_utilization` of each GPU, beside the learner's, and it sleeps
  while the learner updates (`RolloutPool.sleep`); a transformers policy keeps its weights there
  and frees its cached blocks.

Each actor has its own group because engines are independent: they need not share a node, so a
pool spreads over whatever nodes have room, and one engine's GPUs are reserved all together or
not at all. The groups are reserved together under `rollout.actor_start_timeout_s`
(`placement.reserve_groups`); the error names the resources missing and the settings to change.

The driver never touches CUDA: the GPU count here is Ray's (`ray.cluster_resources`), never
`torch.cuda`, so the driver creates no CUDA context and holds no GPU memory; actors see only the
GPUs Ray assigned them. `actor_location` is what an actor reports of its place (node, GPU ids).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup

from prompt_r1.config.experiment import AgentConfig, Config, RolloutConfig
from prompt_r1.cluster.placement import PlacementError, in_group, reserve_groups

log = logging.getLogger(__name__)

FIX = ("lower rollout.num_workers, agent.tensor_parallel_size or rollout.cpus_per_worker, free what other Ray "
       "jobs hold, add nodes to the cluster (rollout.ray_address), or raise rollout.actor_start_timeout_s if "
       "nodes are still joining")


def engine_bundle(agent: AgentConfig, rollout: RolloutConfig, cluster_gpus: float) -> dict[str, float]:
    """The placement bundle of one rollout actor, given the GPUs the Ray cluster has in all.

    >>> from prompt_r1.config.experiment import AgentConfig, RolloutConfig
    >>> vllm = AgentConfig(backend="vllm", tensor_parallel_size=2)
    >>> engine_bundle(vllm, RolloutConfig(cpus_per_worker=1), cluster_gpus=4)
    {'CPU': 1.0, 'GPU': 2.0}
    >>> engine_bundle(AgentConfig(), RolloutConfig(cpus_per_worker=2), cluster_gpus=4)
    {'CPU': 2.0}
    >>> engine_bundle(AgentConfig(backend="vllm"), RolloutConfig(), cluster_gpus=0)
    {'CPU': 1.0}
    >>> engine_bundle(AgentConfig(), RolloutConfig(gpus_per_worker=0.25), cluster_gpus=1)
    {'CPU': 1.0, 'GPU': 0.25}
    """
    cpus = float(rollout.cpus_per_worker)
    if agent.backend != "vllm":
        if not rollout.gpus_per_worker:
            return {"CPU": cpus}
        if cluster_gpus <= 0:
            raise PlacementError(
                f"rollout.gpus_per_worker={rollout.gpus_per_worker:g} asks each rollout actor for a GPU share "
                f"(agent.device={agent.device}), but this Ray cluster has no GPU: set agent.device to cpu and "
                "rollout.gpus_per_worker to 0, or connect to a cluster with GPUs (rollout.ray_address)")
        return {"CPU": cpus, "GPU": float(rollout.gpus_per_worker)}
    if cluster_gpus > 0:
        return {"CPU": cpus, "GPU": float(agent.tensor_parallel_size)}
    if agent.tensor_parallel_size > 1:
        raise PlacementError(
            f"agent.tensor_parallel_size={agent.tensor_parallel_size} splits a vLLM engine over GPUs, but this Ray "
            "cluster has none: set agent.tensor_parallel_size to 1 (vLLM on CPU runs one engine per actor; raise "
            "rollout.num_workers for more engines), or connect to a cluster with GPUs (rollout.ray_address)")
    return {"CPU": cpus}


def place_engines(cfg: Config, num_workers: int) -> tuple[dict[str, float], list[PlacementGroup]]:
    """One ready placement group per rollout actor (the bundle, the groups), or `PlacementError`
    within `rollout.actor_start_timeout_s`. A local Ray instance (no `rollout.ray_address`) never
    grows, so a pool bigger than it fails at once."""
    bundle = engine_bundle(cfg.agent, cfg.rollout, ray.cluster_resources().get("GPU", 0.0))
    groups = reserve_groups(
        [[bundle]] * num_workers, what=f"the rollout pool ({num_workers} actors, one placement group each)",
        timeout_s=cfg.rollout.actor_start_timeout_s, field="rollout.actor_start_timeout_s", fix=FIX,
        name="prompt-r1-rollout", fixed_cluster=not cfg.rollout.ray_address)
    return bundle, groups


def shared_gpus(cfg: Config, num_workers: int, learner_placements: list[dict[str, Any]] | None
                ) -> list[dict[str, Any]] | None:
    """Under `rollout.colocate`: per engine, the node (`node_ip`) and GPU ids (`gpu_ids`) of the
    learner ranks it shares (engine i: ranks i x tp .. (i+1) x tp - 1); None when engines get places
    of their own (colocate off, the transformers backend, or a learner without GPUs: then there is
    no GPU to share and engines run as usual). `learner_placements` are the ranks' `actor_location`s.

    >>> from prompt_r1.config.experiment import parse_config
    >>> cfg = parse_config({"agent": {"backend": "vllm"}, "rollout": {"colocate": True}})
    >>> shared_gpus(cfg, 1, [{"node_id": "n0", "node_ip": "10.0.0.5", "gpu_ids": ["3"]}])
    [{'node_ip': '10.0.0.5', 'gpu_ids': ['3']}]
    >>> shared_gpus(cfg, 1, [{"node_id": "n0", "node_ip": "10.0.0.5", "gpu_ids": []}]) is None
    True
    """
    if not cfg.rollout.colocate:
        return None
    ranks = learner_placements or []
    on_gpu = cfg.agent.backend == "vllm" or cfg.agent.device == "cuda"
    if not on_gpu or not ranks or not all(p.get("gpu_ids") for p in ranks):
        log.info("rollout.colocate: %s, so the rollout engines are placed as usual",
                 "the transformers backend samples on CPU (agent.device)" if not on_gpu
                 else "the learner holds no GPU to share")
        return None
    tp = cfg.agent.tensor_parallel_size
    if num_workers * tp > len(ranks):
        raise PlacementError(f"rollout.colocate: {num_workers} engine(s) x agent.tensor_parallel_size {tp} need "
                             f"{num_workers * tp} learner GPUs to share, but the learner has {len(ranks)} rank(s); "
                             "lower rollout.num_workers or raise train.world_size")
    out = []
    for index in range(num_workers):
        mine = ranks[index * tp:(index + 1) * tp]
        if len({p["node_id"] for p in mine}) > 1:
            raise PlacementError(
                f"rollout.colocate: rollout engine {index} would share the GPUs of learner ranks {index * tp}-"
                f"{(index + 1) * tp - 1}, which Ray put on different nodes, and an engine's GPUs must be on one "
                "node: set train.placement_strategy to PACK or STRICT_PACK, or agent.tensor_parallel_size to 1")
        out.append({"node_ip": mine[0]["node_ip"], "gpu_ids": [g for p in mine for g in p["gpu_ids"]]})
    return out


def place_colocated(cfg: Config, shared: list[dict[str, Any]]) -> tuple[list[dict[str, float]], list[PlacementGroup]]:
    """One ready placement group per colocated engine (`shared_gpus`): CPUs on its ranks' node."""
    bundles = [{"CPU": float(cfg.rollout.cpus_per_worker), f"node:{s['node_ip']}": 0.001} for s in shared]
    groups = reserve_groups(
        [[b] for b in bundles], what=f"the colocated rollout pool ({len(bundles)} actors beside the learner ranks)",
        timeout_s=cfg.rollout.actor_start_timeout_s, field="rollout.actor_start_timeout_s", fix=FIX,
        name="prompt-r1-rollout", fixed_cluster=not cfg.rollout.ray_address)
    return bundles, groups


def actor_options(bundle: dict[str, float], group: PlacementGroup, visible: str | None = None) -> dict[str, Any]:
    """`ray.remote(...).options(...)` that put an actor into the one bundle of `group`, asking for
    exactly that bundle's resources; an actor without GPUs is kept off every GPU of its node, or,
    colocated, given `visible` (the GPU ids it shares with learner ranks). `ActorGroup` adds the
    driver's settings to the `runtime_env`."""
    gpus = bundle.get("GPU", 0.0)
    env = {} if gpus else {"CUDA_VISIBLE_DEVICES": visible or ""}  # Ray sets it when gpus > 0
    resources = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}  # node:<ip> of a colocated engine
    return {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": gpus, "scheduling_strategy": in_group(group, 0),
            "runtime_env": {"env_vars": env}, **({"resources": resources} if resources else {})}


def actor_location() -> dict[str, Any]:
    """Called inside an actor: the node and the GPUs Ray assigned to it (what tests check, and what
    the pool logs at start)."""
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def describe_location(index: int, where: dict[str, Any], role: str = "rollout actor") -> str:
    """One log line per actor (rollout actors, learner ranks).

    >>> describe_location(0, {"node_id": "abcdef0123", "node_ip": "10.0.0.5", "gpu_ids": ["1"], "pid": 7})
    'rollout actor 0: node abcdef01 (10.0.0.5), GPUs [1], pid 7'
    """
    gpus = f"[{','.join(where['gpu_ids'])}]" if where["gpu_ids"] else "none"
    return f"{role} {index}: node {where['node_id'][:8]} ({where['node_ip']}), GPUs {gpus}, pid {where['pid']}"

