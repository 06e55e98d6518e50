"""The extension points of the training schedule (`TrainingHooks`) and what it reports
(`StepResult`, `TrainingOutcome`).

`TrainingSession.run` is the one schedule; a caller changes what happens around it, never the
schedule itself, by subclassing `TrainingHooks`: `prompt-r1 train` uses the defaults (log lines),
the Prefect flow runs every stage as a task and sends metrics to MLflow, the learning benchmark
records curves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prompt_r1.core.trajectory import Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class StepResult:
    """One finished update: `step` is its 0-based index (MLflow's step for training metrics)."""

    step: int
    metrics: dict[str, float]
    trajectories: list[Trajectory]


@dataclass
class TrainingOutcome:
    """What `TrainingSession.run` leaves: the exported agent and validation before/after training."""

    agent: Path | None
    validation_before: dict[str, float]
    validation: dict[str, float]


class TrainingHooks:
    """Extension points of the training schedule; the defaults log progress.

    Subclass to observe the run (metrics to a tracker, a progress bar) or to wrap each stage (the
    Prefect flow runs every stage as a task). Validation metrics are reported with the number of
    updates done (0 = the untrained agent); training metrics with their update's 0-based index."""

    def __init__(self, total_steps: int | None = None):
        self.total_steps = total_steps
        self._clock: tuple[float, int] | None = None  # (wall time, step index) when this process's first step began

    def stage(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run one stage of the schedule (`next-batch`, `rollout`, `reward`, `grpo-update`,
        `record`, `broadcast-weights`, `validate`, `checkpoint`; with `rollout.max_staleness` >= 1
        also `rollout-submit`, which queues a later step's batch and returns its `InFlight` handle
        at once, and `rollout` then collects that handle)."""
        self.announce(name)
        return fn(*args)

    @staticmethod
    def announce(name: str) -> None:
        """Say which stage starts, for those that run for minutes on a CPU."""
        if name in ("rollout", "grpo-update", "validate", "checkpoint"):
            log.info("%s ...", name)

    def on_step(self, result: StepResult) -> None:
        shown = {k: round(v, 4) for k, v in result.metrics.items()
                 if k in ("reward_mean", "reward_std", "format_mean", "answer_mean", "pg_loss", "kl",
                          "informative_share", "env_error_rate", "step_time_s") or k.startswith("turn_reward_")}
        log.info("step %d/%s done%s: %s", result.step + 1, self.total_steps or "?", self.time_left(result), shown)

    def time_left(self, result: StepResult) -> str:
        """", N s a step, about M min left": the mean wall time of the steps this process ran (from the
        first one's start: its rollout included) times the steps still to run; "" when unknown."""
        now = time.monotonic()
        if getattr(self, "_clock", None) is None:  # the first step seen here: it began a rollout and an update ago
            began = now - result.metrics.get("rollout_time_s", 0.0) - result.metrics.get("step_time_s", 0.0)
            self._clock = (began, result.step)
        began, first = self._clock
        done = result.step + 1 - first
        if not self.total_steps or done <= 0 or now <= began:
            return ""
        per_step = (now - began) / done
        left = max(self.total_steps - result.step - 1, 0) * per_step
        return f" in {per_step:.0f} s a step, about {left / 60:.0f} min left"

    def on_validation(self, updates_done: int, metrics: dict[str, float]) -> None:
        log.info("validation after %d update(s): %s", updates_done, {k: round(v, 4) for k, v in metrics.items()})

    def before_checkpoint(self, step: int) -> None:
        """Called before the checkpoint of `step` completed updates is written."""

    def after_checkpoint(self, step: int, path: Path) -> None:
        """Called once the checkpoint of `step` completed updates is on disk."""
