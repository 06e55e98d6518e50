"""The pipeline's Prefect stages: ingestion, one environment's evaluation, and the training
schedule's stages with the flow's hooks into it.

- `ingest_sources`: ingestion, cached in the warehouse itself (`sources` is keyed on each file's
  sha256), not in Prefect's result store, which would go stale when the warehouse file is deleted
  or replaced. So the task always runs, and each unchanged source is a no-op that costs one hash.
- `evaluate_environment`: one environment LLM per task run (so each shows up, and retries, alone).
- `FlowTrainingHooks`: `TrainingSession.run` (the library) owns the order of the training stages;
  the hooks run each as a Prefect task named after it (so the flow's graph reads batch -> rollout
  -> reward -> update -> record -> broadcast -> validate -> checkpoint, with retries where a stage
  talks to the environment), buffer metrics for MLflow and update a progress artifact. A run with
  a training pool (`train.environments`) also logs each step's numbers per environment
  (`environment_metrics`, `train_env/<name>/<metric>`) beside the pooled ones; with a
  `RolloutTracer` (`tracking.trace_rollouts` > 0), k trajectories a step become MLflow traces.

Ray is driven from these tasks rather than through prefect-ray's task runner: the rollout
workers are *stateful* Ray actors (each holds a policy copy that receives new weights after
every step), while prefect-ray runs stateless tasks as Ray remote functions. So the flow keeps
a pool of actors alive for the whole run and each task talks to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import mlflow
from prefect import task
from prefect.cache_policies import NO_CACHE

from prompt_r1.config.env import EnvConfig
from prompt_r1.core.failures import EnvironmentFailure
from prompt_r1.core.trajectory import Trajectory, stats_by_environment
from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import MAX_QUESTION_CHARS
from prompt_r1.env.base import cost_usd
from prompt_r1.evaluation.evaluate import EvalOutcome
from prompt_r1.training.hooks import StepResult, TrainingHooks
from prompt_r1.training.rollout_traces import RolloutTracer
from tasks.artifacts import training_progress
from tasks.tracking.runs import MetricBuffer
from warehouse.store import Warehouse

T = TypeVar("T")


@task(name="ingest-sources", cache_policy=NO_CACHE)
def ingest_sources(sources: list, db: str, max_question_chars: int = MAX_QUESTION_CHARS) -> list[dict]:
    """Ingest files and folders into the warehouse; already-ingested content is skipped."""
    with Warehouse(db) as wh:
        reports = ingest(wh, sources, max_question_chars=max_question_chars)
    return [vars(r) for r in reports]


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


# Stages that talk to the environment are retried (a rollout is seeded, so a retry redraws the
# same samples); the update is not (its failure is an `EnvironmentFailure` or a real bug). A
# validation stopped by `EnvironmentFailure` is not retried either: the client already retried
# each call, and the run stops as it does for a training step.
STAGE_RETRIES = {"rollout": 2, "validate": 1}


# Per-environment step metrics: MLflow name -> `rollout_stats` key (the pooled metrics' own rule).
ENV_METRICS = {"reward": "reward_mean", "answer_score": "answer_score", "format": "format_mean",
               "format_valid_rate": "format_valid_rate", "error_rate": "env_error_rate", "calls": "env_calls",
               "prompt_tokens": "env_prompt_tokens", "completion_tokens": "env_completion_tokens",
               "trajectories": "trajectories"}


def environment_metrics(trajectories: list[Trajectory], environments: list[EnvConfig],
                        format_cap: float) -> dict[str, float]:
    """`train_env/<name>/<metric>` for each environment the step's trajectories prompted: reward,
    answer score, format, error rate, calls, tokens (per trajectory, as the pooled metrics) and
    `cost_usd` (per trajectory, at the environment's prices); an environment the step never drew
    has no entry.

    >>> from prompt_r1.core.trajectory import EnvCall
    >>> env = EnvConfig(name="gpt", price_per_1k_prompt=1.0)
    >>> t = Trajectory("q", 0, [], env_name="gpt", env_calls=[EnvCall(0, "gpt", "m", prompt_tokens=500)])
    >>> m = environment_metrics([t], [env], 1.0)
    >>> m["train_env/gpt/calls"], m["train_env/gpt/cost_usd"], m["train_env/gpt/error_rate"]
    (1.0, 0.5, 0.0)
    """
    by_name = {env.name: env for env in environments}
    metrics: dict[str, float] = {}
    for name, stats in stats_by_environment(trajectories, format_cap).items():
        metrics.update({f"train_env/{name}/{key}": stats[source] for key, source in ENV_METRICS.items()})
        if name in by_name:
            metrics[f"train_env/{name}/cost_usd"] = cost_usd(
                by_name[name], stats["env_prompt_tokens"], stats["env_completion_tokens"])
    return metrics


@task(name="stage", cache_policy=NO_CACHE)
def _stage(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class FlowTrainingHooks(TrainingHooks):
    """Stages as tasks; metrics to `buffer` (flushed to MLflow at checkpoints, so a resumed run
    never logs a step twice); a progress artifact for the Prefect UI. With `environments` (the
    training pool, empty for a run with the one `environment`) each step also logs
    `environment_metrics`."""

    def __init__(self, total_steps: int, buffer: MetricBuffer, ckpt_dir: Path,
                 environments: list[EnvConfig] | None = None, format_cap: float = 1.0,
                 tracer: RolloutTracer | None = None):
        super().__init__(total_steps)
        self.buffer, self.ckpt_dir = buffer, ckpt_dir
        self.tracer, self.rollout_traces = tracer, []  # k rollouts a step as traces, logged at checkpoints
        self.environments, self.format_cap = list(environments or []), format_cap
        self.last_trajectories: list = []
        self.history: list[tuple[int, dict[str, float]]] = []  # this invocation's steps, for the table artifact

    def stage(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        self.announce(name)  # the task's own log line says only that it finished
        retries = STAGE_RETRIES.get(name, 0)
        return _stage.with_options(name=name, retries=retries, retry_delay_seconds=5 if retries else 0,
                                   retry_condition_fn=retry_unless_environment_failure)(fn, *args)

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        per_env = (environment_metrics(result.trajectories, self.environments, self.format_cap)
                   if self.environments else {})
        self.buffer.add(result.step, {**result.metrics, **per_env})
        self.last_trajectories = result.trajectories
        if self.tracer is not None:
            self.rollout_traces.extend(self.tracer.records(result))
        self.history.append((result.step, result.metrics))
        training_progress(result.step, self.total_steps, result.metrics)

    def on_validation(self, updates_done: int, metrics: dict[str, float]) -> None:
        super().on_validation(updates_done, metrics)
        self.buffer.add(updates_done, metrics)

    def before_checkpoint(self, step: int) -> None:
        self.buffer.save(self.ckpt_dir / f"metrics-{step:05d}.json")

    def after_checkpoint(self, step: int, path: Path) -> None:
        self.buffer.flush()
        if self.rollout_traces:  # as the metrics: at checkpoints, so a resumed run never traces a step twice
            from tasks.tracking.traces import trace_episodes

            trace_episodes(self.rollout_traces)
            mlflow.flush_trace_async_logging()
            self.rollout_traces = []
        mlflow.log_text("\n".join(json.dumps(x.to_record()) for x in self.last_trajectories[:4]),
                        f"trajectories/step-{step - 1:05d}.jsonl")


def registration_score(validation: dict[str, float], validated: bool) -> float | None:
    """The validation score an agent is registered (and may become champion) with: the final
    `val_reward`, or None when the run has no validation questions (`validated` False).

    A run whose validation scored no question never gets here (`TrainingSession.validate` stops it
    with `EnvironmentFailure`); this is the registry's own check that no agent is registered or
    promoted on a score computed from failures.

    >>> registration_score({"val_reward": 0.25, "val_env_error_rate": 0.0}, True)
    0.25
    >>> registration_score({}, False) is None
    True
    >>> registration_score({"val_env_error_rate": 1.0}, True)
    Traceback (most recent call last):
    ...
    ValueError: refusing to register the agent: its final validation scored no question (validation metrics: {'val_env_error_rate': 1.0})
    """
    import math

    score = validation.get("val_reward")
    if not validated:
        return None
    if score is None or not math.isfinite(score):
        raise ValueError("refusing to register the agent: its final validation scored no question "
                         f"(validation metrics: {validation})")
    return score
