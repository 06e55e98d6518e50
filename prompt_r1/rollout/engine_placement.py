"""Where rollout actors run: each in its own placement group of one bundle sized by the agent backend.

One rule decides a rollout actor's bundle (`engine_bundle`), so what a pool asks of Ray is
explicit and the same on a laptop and a cluster:

- `agent.backend: vllm` on a Ray cluster with GPUs: `{GPU: agent.tensor_parallel_size, CPU:
  rollout.cpus_per_worker}`. One bundle keeps an engine's tensor-parallel GPUs on one node (vLLM
  then runs its extra ranks as local processes on the GPUs Ray gave the actor). A cluster with
  fewer GPUs than the pool needs is a placement error naming what is missing, never a silent
  fall-back to CPU.
- otherwise (the transformers backend, or vLLM on a cluster without GPUs): `{CPU:
  rollout.cpus_per_worker}`. Such an actor gets `CUDA_VISIBLE_DEVICES=""`: Ray leaves the
  variable alone for actors without GPUs, so they would see every GPU of their node, also those
  Ray gave to learner ranks or other engines.

Each actor has its own group because engines are independent: they need not share a node, so a
pool spreads over whatever nodes have room, and one engine's GPUs are reserved all together or
not at all. The groups are reserved together under `rollout.actor_start_timeout_s`
(`placement.reserve_groups`); the error names the resources missing and the settings to change.

The driver never touches CUDA: the GPU count here is Ray's (`ray.cluster_resources`), never
`torch.cuda`, so the driver creates no CUDA context and holds no GPU memory; actors see only the
GPUs Ray assigned them. `actor_location` is what an actor reports of its place (node, GPU ids).
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup

from prompt_r1.config.experiment import AgentConfig, Config, RolloutConfig
from prompt_r1.rollout.placement import PlacementError, in_group, release, reserve_groups

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
    """
    cpus = float(rollout.cpus_per_worker)
    if agent.backend != "vllm":
        return {"CPU": cpus}
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


def actor_options(bundle: dict[str, float], group: PlacementGroup, env_vars: dict[str, str]) -> dict[str, Any]:
    """`ray.remote(...).options(...)` that put an actor into the one bundle of `group`, asking for
    exactly that bundle's resources; an actor without GPUs is kept off every GPU of its node."""
    gpus = bundle.get("GPU", 0.0)
    env = dict(env_vars) if gpus else {**env_vars, "CUDA_VISIBLE_DEVICES": ""}  # Ray sets it when gpus > 0
    return {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": gpus, "scheduling_strategy": in_group(group, 0),
            "runtime_env": {"env_vars": env}}


def release_all(groups: list[PlacementGroup]) -> None:
    """Give every group's resources back (after its actors are killed)."""
    for group in groups:
        release(group)


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

