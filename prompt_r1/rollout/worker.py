"""The rollout actor: one policy copy plus a client per training environment, on a Ray worker.

Why it exists apart from `pool`: this is the code that runs inside each actor (sampling,
loading weight syncs, sleeping while a colocated learner updates), while `pool.RolloutPool`
is the driver's side that places the actors, splits batches over them and verifies their answers.
The actor never opens the warehouse and never starts a vLLM server (the driver does:
`pool.actor_environments`); an environment's API key arrives as an argument
(`actor_env.secret_env`), never through `runtime_env`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import SecretStr

from prompt_r1.config.env import EnvConfig
from prompt_r1.config.experiment import Config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.weights import WeightUpdate
from prompt_r1.cluster.actor_env import apply_secret_env
from prompt_r1.cluster.engine_placement import actor_location


def refuse_managed_environments(cfg: Config) -> None:
    """Raise when a training environment is a managed vLLM server: actors cannot start one, the
    driver must (`pool.actor_environments`) and hand the actors its URL as `openai`."""
    managed = [env.name for env in cfg.training_environments() if env.kind == "vllm"]
    if managed:
        raise ValueError(f"environment(s) {managed} have kind=vllm: start their servers in the driver first, e.g. "
                         "`with actor_environments(cfg) as actor_cfg:`, and build the pool with actor_cfg")


@contextlib.contextmanager
def _temperature(policy: Any, temperature: float | None) -> Iterator[None]:
    """Sample at another temperature for one call (greedy validation rollouts)."""
    if temperature is None:
        yield
        return
    previous = policy.temperature
    policy.temperature = temperature
    try:
        yield
    finally:
        policy.temperature = previous


class RolloutWorker:
    """A Ray actor: one policy copy plus a client per training environment, living as long as the pool."""

    def __init__(self, cfg: Config, model_path: str, seed: int,
                 env_factory: Callable[[EnvConfig], Any] | None = None,
                 secrets: dict[str, SecretStr] | None = None):
        # the environment's API key, from the driver (`actor_env.secret_env`): a node started
        # without it in its environment would otherwise fail here, or use another key
        apply_secret_env(secrets)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        from prompt_r1.policy import make_policy

        self.cfg = cfg
        refuse_managed_environments(cfg)
        self.policy = make_policy(self.cfg.agent, model_path, seed=seed, sleep_mode=self.cfg.rollout.colocate)
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.ExitStack()
        self.envs = [self._open_environment(env_cfg, env_factory) for env_cfg in cfg.training_environments()]
        self.weights = cfg.training_weights()
        self.version = 0  # GRPO updates in the weights held (set by `load_weights`), stamped on trajectories

    def _open_environment(self, env_cfg: EnvConfig, env_factory: Callable[[EnvConfig], Any] | None):
        env_cfg = env_cfg.model_copy(update={"cache": False})
        if env_factory is not None:
            return env_factory(env_cfg)
        from prompt_r1.env import open_environment

        return self._stack.enter_context(open_environment(env_cfg, warehouse=None, log_dir=None))

    def rollout(self, questions: list[QuestionRow], seed: int, step: int, greedy: bool = False,
                group_size: int | None = None, score: bool = True, scaffold: bool = False) -> list[Trajectory]:
        """Trajectories for these questions; draws are seeded by (run `seed`, `step`, question,
        sample, turn), so which actor gets a question never matters. `scaffold` (training
        rollouts only) starts some members from `rollout.scaffold.fn`'s first turn (and lets
        `rollout.scaffold.follow_up` write their later turns)."""
        from prompt_r1.rollout.episode import rollout_batch
        from prompt_r1.rollout.progress import RolloutProgress
        from prompt_r1.rollout.scaffold import FOLLOW_UP, load_scaffold

        spec, follow_up = self.cfg.rollout.scaffold.fn, self.cfg.rollout.scaffold.follow_up
        privileged = self.cfg.rollout.scaffold.privileged
        if scaffold and (greedy or spec is None):
            raise ValueError("a scaffolded rollout needs rollout.scaffold.fn and sampling (never greedy: validation "
                             "and probes measure the policy alone)")
        total = len(questions) * (group_size or self.cfg.rollout.group_size)
        label = "validation rollout" if greedy else f"rollout step {step}"
        with _temperature(self.policy, 0.0 if greedy else None), RolloutProgress(total, label) as progress:
            trajectories = self._loop.run_until_complete(rollout_batch(
                self.policy, self.envs, questions, self.cfg.agent, self.cfg.rollout, self.cfg.reward,
                group_size=group_size, seed=seed, step=step, score=score, env_weights=self.weights,
                scaffold=load_scaffold(spec, privileged) if scaffold else None,
                follow_up=load_scaffold(follow_up, privileged, FOLLOW_UP) if scaffold and follow_up else None,
                progress=progress))
        for trajectory in trajectories:  # the engine's own version, not the driver's idea of it
            trajectory.policy_version = self.version
        return trajectories

    def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        """Apply one weight sync; answers with the version now held and the checksum of what the
        engine now uses (`Policy.apply_update` says what each backend can read back)."""
        checksum = self.policy.apply_update(update)
        self.version = update.version
        return {"version": self.version, "checksum": checksum}

    def sleep(self) -> int:
        """Free the policy's GPU memory while a colocated learner updates (`Policy.sleep`)."""
        self.policy.sleep()
        return os.getpid()

    def wake_up(self) -> int:
        self.policy.wake_up()
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()

    def placement(self) -> dict[str, Any]:
        """The node and the GPU ids Ray gave this actor (`engine_placement.actor_location`)."""
        return actor_location()

    def shutdown(self) -> None:
        for env in self.envs:
            aclose = getattr(env, "aclose", None)
            if aclose is not None:
                self._loop.run_until_complete(aclose())
        self._stack.close()
        self.policy.close()
