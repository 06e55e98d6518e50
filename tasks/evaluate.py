"""Evaluation task: one environment LLM per task run (so each shows up, and retries, alone)."""

from __future__ import annotations

from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from prompt_r1.config.env import EnvConfig
from prompt_r1.core.failures import EnvironmentFailure
from prompt_r1.evaluation.evaluate import EvalOutcome


def retry_unless_environment_failure(task, task_run, state) -> bool:
    """Prefect retry condition: retry a crash, never a run stopped for environment failures (the
    client already retried each call; running the whole evaluation again would not help)."""
    try:
        state.result()
    except EnvironmentFailure:
        return False
    except Exception:
        return True
    return True


@task(name="evaluate-environment", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10,
      retry_condition_fn=retry_unless_environment_failure, task_run_name="evaluate-{env_cfg.name}")
def evaluate_environment(env_cfg: EnvConfig, work: Callable[[], EvalOutcome]) -> EvalOutcome:
    """One environment's part of the library's evaluation (`evaluate(..., on_environment=...)`):
    `work` evaluates `env_cfg` with the agents the flow opened once for every environment."""
    return work()
