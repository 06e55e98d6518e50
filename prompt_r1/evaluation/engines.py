"""Evaluation's agent engines as Ray actors, one placement group each, called as ordinary policies.

Why: built in the driver, every agent engine under evaluation (`base`, `trained`, ...) lands on the
driver's first GPU and they split `agent.vllm_gpu_memory_utilization`, while the node's other
GPUs sit idle; two vLLM engines in one process are fragile too. Here each engine runs in a Ray
actor (`EvalEngine`) in a placement group of its own, one bundle of `{GPU:
agent.tensor_parallel_size, CPU: rollout.cpus_per_worker}` (on a cluster without GPUs:
`engine_placement.engine_bundle`'s CPU bundle), reserved under `rollout.actor_start_timeout_s` with
`placement.reserve_groups` as the rollout pool does, and takes the whole configured share of its
own GPU(s) (less a managed vLLM environment server's share: that server sits on the driver's first
GPU, which Ray may give to an engine). The engines are one `cluster.actor_group.ActorGroup`,
started, gathered and stopped as the rollout engines are; the driver keeps a `RemotePolicy` per
engine: the tokenizer, and `generate` forwarded to the actor within `rollout.rollout_timeout_s`,
so episodes and `agent_only` run unchanged and the driver touches no CUDA.

Where they run (`eval.agent_placement`; the rule is `config.evaluation.engine_place`, which `plan`
follows too, applied here by `engines_in_ray` to the GPUs Ray counts): `driver` keeps the
engines in this process; `ray` uses actors; `auto` uses actors for the vllm backend when Ray (started
here if need be, sized as `init_ray` sizes it) counts GPUs, else the driver. When the cluster has
fewer GPUs than the engines need, the engines share the driver's GPU, with a warning
(queueing them one after another would hold each engine only for its own rows, but every method
of an environment uses all agents at once).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from prompt_r1.cluster.actor_group import ActorGroup
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
    """The driver's side of one `EvalEngine` of an `ActorGroup` (`engines`, actor `index`): its
    tokenizer here, its sampling in the actor. Every call waits at most `timeout_s`
    (`rollout.rollout_timeout_s`). The engines of one `ray_policies` call are started and given
    back together: closing one policy stops them all and releases their placement groups."""

    def __init__(self, label: str, engines: ActorGroup, index: int, agent: AgentConfig, model_path: str, seed: int,
                 timeout_s: float):
        from transformers import AutoTokenizer

        from prompt_r1.models.bundled import model_load_errors
        from prompt_r1.policy import backend_deterministic

        self._keep_settings(model_path, agent.temperature, agent.top_p, seed, self.stop_strings)
        self.label, self.engines, self.index, self.timeout_s = label, engines, index, timeout_s
        self.location = engines.placements[index]
        self.deterministic = backend_deterministic(agent)
        with model_load_errors(model_path, "agent"):
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def _call(self, method: str, what: str, *args: Any) -> Any:
        ref = getattr(self.engines.actors[self.index], method).remote(*args)
        return self.engines.gather([ref], what, indices=[self.index], timeout_s=self.timeout_s,
                                   field="rollout.rollout_timeout_s",
                                   fix="raise it for big batches, or see the Ray logs of that node")[0]

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int],
                 seeds: Sequence[int] | None = None) -> list[Sample]:
        return self._call("generate", "a generation", prompts, max_new_tokens, seeds)

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        self._call("load_weights", "loading weights", state_dict)

    def apply_update(self, update: WeightUpdate) -> str:
        return self._call("apply_update", "loading weights", update)

    def close(self) -> None:
        """Every engine's own clean-up, then `ray.kill`, then their groups (`ActorGroup.shutdown`)."""
        self.engines.shutdown()


def ray_policies(cfg: Config, agent: AgentConfig, paths: Mapping[str, Path]) -> dict[str, RemotePolicy]:
    """label -> a `RemotePolicy` whose engine runs `agent` from that label's folder in a placement
    group of its own (see the module docstring); Ray must be running (`engines_in_ray` starts it).
    Placement and start-up share one deadline, `rollout.actor_start_timeout_s`; on any failure
    every engine started and every group reserved is given back."""
    from prompt_r1.cluster.engine_placement import actor_options, describe_location
    from prompt_r1.cluster.placement import reserve_groups

    labels = list(paths)
    bundle = eval_bundle(cfg, ray.cluster_resources().get("GPU", 0.0))
    timeout_s = cfg.rollout.actor_start_timeout_s
    groups = reserve_groups([[bundle]] * len(labels), what=f"the evaluation engines ({', '.join(labels)}: one "
                            "placement group each)", timeout_s=timeout_s, field="rollout.actor_start_timeout_s",
                            fix=FIX, name="prompt-r1-eval", fixed_cluster=not cfg.rollout.ray_address)
    engines = ActorGroup("evaluation engine", groups=groups, labels=[f"`{label}`" for label in labels],
                         name="evaluation engines")
    try:
        engines.start(EvalEngine, [(agent, str(paths[label]), cfg.seed) for label in labels],
                      [actor_options(bundle, group) for group in groups])
        engines.locate(timeout_s, what=f"starting the evaluation engines ({', '.join(labels)})",
                       field="rollout.actor_start_timeout_s",
                       fix="raise it if loading the agent is slow, or see the Ray logs of the engines' node")
        policies = {label: RemotePolicy(label, engines, index, agent, str(paths[label]), cfg.seed,
                                        cfg.rollout.rollout_timeout_s)
                    for index, label in enumerate(labels)}
    except BaseException:
        engines.kill()
        raise
    for index, (label, policy) in enumerate(policies.items()):
        log.info("%s (%s)", describe_location(index, policy.location, role="evaluation engine"), label)
    return policies
