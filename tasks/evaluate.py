"""Evaluation task: one environment LLM per task run (so each shows up, and retries, alone)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from prompt_r1.config.experiment import Config
from prompt_r1.config.env import EnvConfig
from prompt_r1.evaluation.evaluate import EvalAgents, EvalOutcome, evaluate
from prompt_r1.core.failures import EnvironmentFailure
from warehouse.store import Warehouse


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
def evaluate_environment(cfg: Config, warehouse: Warehouse, run_id: str, agents: EvalAgents,
                         env_cfg: EnvConfig, log_dir: Path) -> EvalOutcome:
    """`agents` are opened once by the flow for all its environment tasks (and their retries)."""
    return evaluate(cfg, warehouse, run_id, agents, [env_cfg], log_dir=log_dir)
