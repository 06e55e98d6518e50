"""The GRPO training loop: rollout -> reward -> update -> weight broadcast -> checkpoint.

`TrainingSession` holds the pieces of one run (learner, Ray rollout pool, environment, data
order) and exposes each stage as a method, so the Prefect flow can wrap every stage in its own
task while `prompt-r1 train` simply calls `run()`. Resuming loads the newest checkpoint
(weights, optimiser, RNG, data position) and drops warehouse rows of steps after it, so a
resumed run reaches the same step count with no repeated or skipped data; it continues only
the same run (same config and training pool, see `run_record`) unless forced.

Environment failures: trajectories ended by a failed environment call are recorded but left out
of the update; a step whose share of failed calls passes `environment.max_error_rate` stops the
run with `EnvironmentFailure` before its update, so no agent is exported from it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1.config import Config, EnvConfig
from prompt_r1.seeding import derive_seed
from prompt_r1.trajectory import Trajectory
from warehouse.store import QuestionRow, Warehouse

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]
    trajectories: list[Trajectory]


def training_pool(warehouse: Warehouse, cfg: Config) -> tuple[list[QuestionRow], list[QuestionRow]]:
    """(train, validation) questions: train split, seeded shuffle, capped, a held-out share."""
    pool = warehouse.questions(splits=["train"], datasets=cfg.data.train_datasets or None)
    if not pool:
        raise ValueError("no train-split questions in the warehouse; ingest a train/ folder first "
                         "(e.g. `prompt-r1 ingest data/sample`)")
    random.Random(derive_seed("training_pool", cfg.seed)).shuffle(pool)
    if cfg.data.max_train_questions:
        pool = pool[: cfg.data.max_train_questions]
    n_val = min(len(pool) - 1, max(1, round(len(pool) * cfg.data.validation_fraction))) if cfg.data.validation_fraction else 0
    return pool[n_val:], pool[:n_val]


def questions_hash(train: list[QuestionRow], val: list[QuestionRow]) -> str:
    """Identifies a training pool (train + validation ids, in order): a resume must see the same."""
    from prompt_r1.run_record import pool_hash

    return pool_hash([q.question_id for q in train], [q.question_id for q in val])


def training_pool_hash(warehouse: Warehouse, cfg: Config) -> str:
    """`questions_hash` of the pool `cfg` trains on (to pick the run to resume before starting)."""
    return questions_hash(*training_pool(warehouse, cfg))


def usable_for_update(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories GRPO may learn from: those no environment failure ended, in groups
    (questions) that keep at least 2 of them, so group statistics are over real rewards only.

    >>> t = lambda q, err=None: Trajectory(q, 0, [], error=err)
    >>> [x.question_id for x in usable_for_update([t("a"), t("a", "500"), t("a"), t("b"), t("b", "500")])]
    ['a', 'a']
    """
    ok = [t for t in trajectories if t.error is None]
    sizes: dict[str, int] = {}
    for t in ok:
        sizes[t.question_id] = sizes.get(t.question_id, 0) + 1
    return [t for t in ok if sizes[t.question_id] >= 2]


def trajectory_rows(trajectories: list[Trajectory]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Warehouse rows (trajectories, env_calls) of one step."""
    trajs, calls = [], []
    for t in trajectories:
        trajs.append(t.to_record())
        for c in t.env_calls:
            calls.append({"question_id": t.question_id, "group_index": t.group_index, **vars(c)})
    return trajs, calls


class TrainingSession:
    """One training run; use as a context manager (it starts and stops servers and actors)."""

    def __init__(self, cfg: Config, warehouse: Warehouse, run_id: str, run_dir: Path, resume: bool = False,
                 force: bool = False):
        """`resume`: continue the run in `run_dir` if it holds one (refused when its config or
        pool changed, unless `force`, or when it finished); without it the folder must be new."""
        self.cfg, self.warehouse, self.run_id, self.run_dir = cfg, warehouse, run_id, run_dir
        self.resume, self.force = resume, force
        self.ckpt_dir = run_dir / "checkpoints"
        self._stack = ExitStack()
        self.step = 0
        self.position = 0

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "TrainingSession":
        try:
            self._start()
        except BaseException:  # a later stage failed (or SIGTERM/Ctrl-C): stop what earlier ones started
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        """Data, learner, environment server, rollout actors; each started piece is on `_stack`."""
        from prompt_r1.checkpoint import latest_checkpoint, load_checkpoint
        from prompt_r1.models import resolve_model
        from prompt_r1.run_record import open_run
        from prompt_r1.trainer import GRPOLearner

        self.cfg.check_trainable()  # before data, models or servers: a config that cannot train fails at once
        self.train_questions, self.val_questions = training_pool(self.warehouse, self.cfg)
        self.by_id = {q.question_id: q for q in self.train_questions}
        # Checked before any model loads, so a refused resume fails in a second.
        open_run(self.run_dir, self.cfg.name, self.cfg.hash(), questions_hash(self.train_questions, self.val_questions),
                 self.resume, self.force)
        self.model_path = resolve_model(self.cfg.agent.model)
        self.learner = GRPOLearner(self.cfg, self.model_path)
        latest = latest_checkpoint(self.ckpt_dir) if self.resume else None
        if latest is not None:
            self.step, data_position = load_checkpoint(self.learner, latest)
            self.position = int(data_position.get("position", 0))
            log.info("resumed from %s: next step %d, data position %d", latest, self.step, self.position)
        if self.resume:  # rows of steps after the checkpoint (or of all steps, without one) are redone
            self.warehouse.delete_steps_after(self.run_id, self.step - 1)
        self.env_cfg = self._start_environment()
        self.pool = self._start_pool()
        if latest is not None:
            self.broadcast()

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def mark_finished(self) -> None:
        """The run is complete: later resumes of it are refused."""
        from prompt_r1.run_record import mark_finished

        mark_finished(self.run_dir)

    def _start_environment(self) -> EnvConfig:
        """Managed vLLM servers start here (driver) and actors reach them as `openai`."""
        from prompt_r1.ray_rollout import actor_environment

        return self._stack.enter_context(actor_environment(self.cfg.environment, self.run_dir / "logs"))

    def _start_pool(self):
        from prompt_r1.ray_rollout import RolloutPool, init_ray

        init_ray(self.cfg.rollout)
        cfg = self.cfg.model_copy(update={"environment": self.env_cfg})
        return self._stack.enter_context(RolloutPool(cfg, self.model_path, self.cfg.rollout.num_workers))

    # -- stages (each one Prefect task in the flow) --------------------------------------
    def next_batch(self) -> list[QuestionRow]:
        from prompt_r1.data_order import batches

        ids = [q.question_id for q in self.train_questions]
        position, batch = next(iter(batches(ids, self.cfg.rollout.batch_questions, self.cfg.seed, self.position)))
        self.position = position + 1
        return [self.by_id[i] for i in batch]

    def rollout(self, questions: list[QuestionRow]) -> list[Trajectory]:
        return self.pool.rollout(questions, self.step)

    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The GRPO update on the trajectories no environment failure ended (see `usable_for_update`).

        When the step's share of failed environment calls passes `environment.max_error_rate`,
        the step's rows are recorded (failures included) and `EnvironmentFailure` is raised
        instead: no update, no step advance."""
        from prompt_r1.failures import EnvironmentFailure, call_errors, check_error_rate

        try:
            rate = check_error_rate(self.cfg.environment.name, call_errors(trajectories),
                                    self.cfg.environment.max_error_rate, f"training step {self.step}")
        except EnvironmentFailure:
            trajs, calls = trajectory_rows(trajectories)
            self.warehouse.replace_step(self.run_id, self.step, trajs, calls)
            raise
        kept = usable_for_update(trajectories)
        if kept:
            metrics = self.learner.step(kept)
        else:  # every group lost its pairs to failures: nothing to learn from, the step still counts
            log.warning("step %d: no group kept 2 trajectories without environment failures; no update", self.step)
            metrics = {"update_skipped": 1.0}
        metrics.update({"env_error_rate": rate, "trajectories_used": float(len(kept)),
                        "env_error_trajectories": float(sum(1 for t in trajectories if t.error is not None))})
        return metrics

    def finish_step(self, trajectories: list[Trajectory]) -> None:
        """Record the step's trajectories and env calls, then advance the step counter."""
        trajs, calls = trajectory_rows(trajectories)
        self.warehouse.replace_step(self.run_id, self.step, trajs, calls)
        self.step += 1

    def broadcast(self) -> None:
        self.pool.broadcast(self.learner.state_dict_for_broadcast())

    def checkpoint(self, force: bool = False) -> Path | None:
        from prompt_r1.checkpoint import save_checkpoint

        if force or self.step % self.cfg.train.checkpoint_every == 0:
            return save_checkpoint(self.learner, self.ckpt_dir, self.step, {"position": self.position}, self.cfg)
        return None

    def validate(self) -> dict[str, float]:
        """Greedy rollouts on held-out questions: mean reward and answer score."""
        from prompt_r1.failures import call_errors, error_rate

        if not self.val_questions:
            return {}
        questions = self.val_questions[: self.cfg.train.validation_questions]
        trajs = self.pool.rollout(questions, self.step, greedy=True, group_size=1)
        n = max(1, sum(1 for t in trajs if t.error is None))  # a failed environment call is not a score
        return {
            "val_reward": sum(t.reward.total for t in trajs if t.reward) / n,
            "val_answer": sum(t.reward.answer for t in trajs if t.reward) / n,
            "val_format_valid": sum(1 for t in trajs if t.reward and t.reward.format >= 1.0) / n,
            "val_env_error_rate": error_rate(call_errors(trajs)),
        }

    def train_step(self) -> StepResult:
        """One full step: batch -> rollout -> update -> record -> broadcast -> checkpoint."""
        t0 = time.perf_counter()
        trajectories = self.rollout(self.next_batch())
        rollout_s = time.perf_counter() - t0
        metrics = self.update(trajectories)
        metrics["rollout_time_s"] = rollout_s
        self.finish_step(trajectories)
        self.broadcast()
        self.checkpoint(force=self.step == self.cfg.train.steps)
        return StepResult(self.step, metrics, trajectories)

    def export_agent(self) -> Path | None:
        """The final checkpoint as a plain HF folder (`run_dir/agent`): merged under LoRA, no
        optimiser state; this is what evaluation loads and the registry stores."""
        from prompt_r1.checkpoint import export_checkpoint, latest_checkpoint

        final = latest_checkpoint(self.ckpt_dir)
        return export_checkpoint(final, self.run_dir / "agent", overwrite=True) if final else None

    def run(self, on_step: Callable[[StepResult], None] | None = None) -> Path | None:
        """Train to `train.steps`; returns the exported final agent folder."""
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.train.steps, initial=self.step, desc="GRPO steps")
        while self.step < self.cfg.train.steps:
            result = self.train_step()
            log.info("step %d: %s", result.step, {k: round(v, 4) for k, v in result.metrics.items()})
            if on_step:
                on_step(result)
            bar.update()
        bar.close()
        final = self.export_agent()
        self.mark_finished()
        return final
