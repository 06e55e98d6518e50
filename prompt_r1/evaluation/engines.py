"""Evaluation's agent engines as Ray actors, one placement group each, called as ordinary policies.

Why: built in the driver, every agent engine under evaluation (`base`, `trained`, ...) lands on the
driver's first GPU and they split `agent.vllm_gpu_memory_utilization`, while the node's other
GPUs sit idle; two vLLM engines in one process are fragile too. Here each engine runs in a Ray
actor (`EvalEngine`) in a placement group of its own, one bundle of `{GPU:
agent.tensor_parallel_size, CPU: rollout.cpus_per_worker}` (on a cluster without GPUs:
`engine_placement.engine_bundle`'s CPU bundle), reserved under `rollout.actor_start_timeout_s` with
`placement.reserve_groups` as the rollout pool does, and takes the whole configured share of its
own GPU(s) (less a managed vLLM environment server's share: that server sits on the driver's first
GPU, which Ray may give to an engine). The driver keeps only a `RemotePolicy` per engine: the
tokenizer, and `generate` forwarded to the actor within `rollout.rollout_timeout_s`, so episodes
and `agent_only` run unchanged and the driver touches no CUDA.

Where they run (`eval.agent_placement`; the rule is `config.evaluation.engine_place`, which `plan`
follows too, applied here by `engines_in_ray` to the GPUs Ray counts): `driver` keeps today's
in-process engines; `ray` uses actors; `auto` uses actors for the vllm backend when Ray (started
here if need be, sized as `init_ray` sizes it) counts GPUs, else the driver. When the cluster has
fewer GPUs than the engines need, the engines share the driver's GPU as before, with a warning
(queueing them one after another would hold each engine only for its own rows, but every method
of an environment uses all agents at once).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from prompt_r1.cluster.actor_group import SHUTDOWN_TIMEOUT_S
from prompt_r1.config.experiment import AgentConfig, Config
from prompt_r1.core.weights import WeightUpdate
from prompt_r1.policy.base import Policy, Sample

log = logging.getLogger(__name__)

FIX = ("set eval.agent_placement to driver, lower agent.tensor_parallel_size or rollout.cpus_per_worker, free what "
       "other Ray jobs hold, or raise rollout.actor_start_timeout_s if nodes are still joining")


def engines_in_ray(cfg: Config, engines: int) -> bool:
    """Whether evaluation's `engines` agent engines run as Ray actors (`config.evaluation.engine_place`,
    with the GPUs Ray counts); starts Ray (`init_ray`) only where the answer depends on them."""
    from prompt_r1.config.evaluation import engine_place

    tp = cfg.agent.tensor_parallel_size
    if engine_place(cfg.eval.agent_placement, cfg.agent.backend, engines, tp, math.inf) == "driver":
        return False
    if (cfg.eval.agent_placement == "auto" and not ray.is_initialized() and cfg.rollout.ray_address is None
            and not _local_cuda()):
        return False  # a local instance on a machine without GPUs would count none: no Ray start for that
    from prompt_r1.cluster.connect import init_ray

    init_ray(cfg.rollout, engines * cfg.rollout.cpus_per_worker)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    place = engine_place(cfg.eval.agent_placement, cfg.agent.backend, engines, tp, gpus)
    if place == "shared":
        log.warning("evaluation: %d agent engine(s) x agent.tensor_parallel_size %d need %d GPUs but the Ray cluster "
                    "has %g: they run in this process and share its first GPU (agent.vllm_gpu_memory_utilization "
                    "split between them); add GPUs, or evaluate fewer agents (eval.agent_checkpoints) to give each "
                    "engine a GPU of its own", engines, tp, engines * tp, gpus)
    return place == "ray"


def _local_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def eval_bundle(cfg: Config, cluster_gpus: float) -> dict[str, float]:
    """One evaluation engine's bundle: whole GPUs when the cluster has any (whatever the backend:
    the transformers backend samples on CPU even there), else the rollout actor's CPU bundle.

    >>> from prompt_r1.config.experiment import parse_config
    >>> tp2 = parse_config({"agent": {"backend": "vllm", "tensor_parallel_size": 2}})
    >>> eval_bundle(tp2, 8), eval_bundle(parse_config({}), 0)
    ({'CPU': 1.0, 'GPU': 2.0}, {'CPU': 1.0})
    """
    from prompt_r1.cluster.engine_placement import engine_bundle

    if cluster_gpus > 0:
        return {"CPU": float(cfg.rollout.cpus_per_worker), "GPU": float(cfg.agent.tensor_parallel_size)}
    return engine_bundle(cfg.agent, cfg.rollout, cluster_gpus)


class EvalEngine:
    """A Ray actor holding one agent policy (`make_policy`) for evaluation."""

    def __init__(self, agent: AgentConfig, model_path: str, seed: int):
        from transformers.utils import logging as hf_logging

        from prompt_r1.policy import make_policy

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.policy = make_policy(agent, model_path, seed=seed)

    def placement(self) -> dict[str, Any]:
        from prompt_r1.cluster.engine_placement import actor_location

        return actor_location()

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int],
                 seeds: Sequence[int] | None) -> list[Sample]:
        return self.policy.generate(prompts, max_new_tokens, seeds)

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        self.policy.load_weights(state_dict)

    def apply_update(self, update: WeightUpdate) -> str:
        return self.policy.apply_update(update)

    def shutdown(self) -> None:
        self.policy.close()


class RemotePolicy(Policy):
    """The driver's side of an `EvalEngine`: its tokenizer here, its sampling in the actor. Every
    call waits at most `timeout_s` (`rollout.rollout_timeout_s`); closing it stops the actor and
    releases its placement group."""

    def __init__(self, label: str, actor: Any, group: Any, agent: AgentConfig, model_path: str, seed: int,
                 location: dict[str, Any], timeout_s: float):
        from transformers import AutoTokenizer

        from prompt_r1.models.bundled import model_load_errors
        from prompt_r1.policy import backend_deterministic

        self._keep_settings(model_path, agent.temperature, agent.top_p, seed, self.stop_strings)
        self.label, self.actor, self.group, self.location, self.timeout_s = label, actor, group, location, timeout_s
        self.deterministic = backend_deterministic(agent)
        with model_load_errors(model_path, "agent"):
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def _call(self, ref: Any, what: str) -> Any:
        from prompt_r1.cluster.connect import RayWaitError

        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise RayWaitError(f"evaluation engine `{self.label}` (node {self.location.get('node_ip')}, pid "
                               f"{self.location.get('pid')}) did not finish {what} within {self.timeout_s:g}s "
                               "(rollout.rollout_timeout_s); raise it for big batches, or see the Ray logs of that "
                               "node") from err

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int],
                 seeds: Sequence[int] | None = None) -> list[Sample]:
        return self._call(self.actor.generate.remote(prompts, max_new_tokens, seeds), "a generation")

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        self._call(self.actor.load_weights.remote(state_dict), "loading weights")

    def apply_update(self, update: WeightUpdate) -> str:
        return self._call(self.actor.apply_update.remote(update), "loading weights")

    def close(self) -> None:
        """The engine's own clean-up (within `SHUTDOWN_TIMEOUT_S`), then `ray.kill`, then its group."""
        from prompt_r1.cluster.placement import release

        if self.actor is None:
            return
        with contextlib.suppress(Exception):
            ray.get(self.actor.shutdown.remote(), timeout=SHUTDOWN_TIMEOUT_S)
        with contextlib.suppress(Exception):
            ray.kill(self.actor)
        release(self.group)
        self.actor = self.group = None


def ray_policies(cfg: Config, agent: AgentConfig, paths: Mapping[str, Path]) -> dict[str, RemotePolicy]:
    """label -> a `RemotePolicy` whose engine runs `agent` from that label's folder in a placement
    group of its own (see the module docstring); Ray must be running (`engines_in_ray` starts it).
    Placement and start-up share one deadline, `rollout.actor_start_timeout_s`; on any failure
    every engine started and every group reserved is given back."""
    from prompt_r1.cluster.actor_env import actor_env_vars
    from prompt_r1.cluster.engine_placement import actor_options, describe_location, release_all
    from prompt_r1.cluster.placement import reserve_groups
    from prompt_r1.cluster.connect import RayWaitError

    labels = list(paths)
    bundle = eval_bundle(cfg, ray.cluster_resources().get("GPU", 0.0))
    timeout_s = cfg.rollout.actor_start_timeout_s
    groups = reserve_groups([[bundle]] * len(labels), what=f"the evaluation engines ({', '.join(labels)}: one "
                            "placement group each)", timeout_s=timeout_s, field="rollout.actor_start_timeout_s",
                            fix=FIX, name="prompt-r1-eval", fixed_cluster=not cfg.rollout.ray_address)
    actors: list[Any] = []
    try:
        engine_class, env_vars = ray.remote(EvalEngine), actor_env_vars()
        for label, group in zip(labels, groups):
            actors.append(engine_class.options(**actor_options(bundle, group, env_vars)).remote(
                agent, str(paths[label]), cfg.seed))
        try:
            places = ray.get([a.placement.remote() for a in actors], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise RayWaitError(f"the evaluation engines ({', '.join(labels)}) did not start within {timeout_s:g}s "
                               "(rollout.actor_start_timeout_s); raise it if loading the agent is slow, or see the "
                               "Ray logs of the engines' node") from err
        policies = {label: RemotePolicy(label, actor, group, agent, str(paths[label]), cfg.seed, where,
                                        cfg.rollout.rollout_timeout_s)
                    for label, actor, group, where in zip(labels, actors, groups, places)}
    except BaseException:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        release_all(groups)
        raise
    for index, (label, policy) in enumerate(policies.items()):
        log.info("%s (%s)", describe_location(index, policy.location, role="evaluation engine"), label)
    return policies
