"""The GRPO training loop: rollout -> reward -> update -> weight broadcast -> checkpoint.

`TrainingSession` holds the pieces of one run (learner, Ray rollout pool, environment, data
order), exposes each stage as a method, and `run()` is the one schedule of those stages:
`prompt-r1 train` calls it with the default hooks, the Prefect flow with hooks that run every
stage as a task and send metrics to MLflow. Resuming loads the newest intact checkpoint
(weights, optimiser, RNG, data position, the cost reward's rolling window; a corrupted newer
one is named in a warning and passed over) and drops warehouse rows of steps after it, so a resumed run reaches the same step count
with no repeated or skipped data; it continues only the same run (same config and training
pool, see `run_folder`) unless forced. The learner is this process or `train.world_size` Ray
ranks, behind one interface (`learner.base.Learner`); checkpoints resume at any world size.

Policy versions: the weights after `step` updates are policy version `step`; every sync
(`broadcast`) sends that version and each trajectory comes back stamped with the version that
sampled it, so a step's metrics carry `policy_age_mean` / `policy_age_max` (updates between the
sampling weights and the learner's; 0 in this synchronous schedule).

Environments: the run trains against `Config.training_environments()` (the pool `train.environments`,
or the one `environment`); each question of a batch draws one, so its whole GRPO group prompts the
same environment (`rollout_batch`), and every trajectory records which (`env_name`).

Environment failures: trajectories ended by a failed environment call are recorded but left out
of the update and of validation scores; a step (or a validation) in which the share of one
environment's failed calls passes that environment's `max_error_rate` stops the run with
`EnvironmentFailure` before its update (before its checkpoint), so no agent is exported from it. A validation in which failures left no
question scored stops the run the same way.

Colocated engines (`rollout.colocate`): the engines share the learner's GPUs and sleep during
each update (`update`), waking before the broadcast.

Asynchronous rollouts (`rollout.max_staleness` = k >= 1): the batches of the next steps run on the
rollout actors while the learner trains; `run_ahead` holds them and states the rules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.config.experiment import Config
from prompt_r1.config.env import env_prices
from prompt_r1.core.cost_reward import CostWindow
from prompt_r1.core.failures import EnvironmentFailure, check_pool_error_rates
from prompt_r1.core.signals import interrupts_held
from prompt_r1.core.trajectory import Trajectory, rollout_stats
from prompt_r1.core.questions import QuestionRow
from prompt_r1.data.order import batches
from prompt_r1.data.pool import TrainingPool
from prompt_r1.data.scorers import scorer_fingerprints
from prompt_r1.models.resolver import resolve_agent
from prompt_r1.rollout.reward_stage import RewardStage, indicator_shares
from prompt_r1.rollout.scaffold import assert_unscaffolded
from prompt_r1.training.checks import check_pack_budget_on, check_run_capacity, check_run_settings, check_scaffold_on
from prompt_r1.training.batch_stats import (
    env_error_trajectories, policy_age, scaffold_stats, trajectory_rows, usable_for_update,
)
from prompt_r1.training.hooks import StepResult, TrainingHooks, TrainingOutcome
from prompt_r1.training.run_ahead import InFlight, RunAhead
from prompt_r1.training.run_folder import mark_finished, open_run, own_run

# The learner (torch, transformers) and the rollout pool (Ray) are imported where a run starts them,
# so importing this module (the flows do, before any run starts) loads neither.
if TYPE_CHECKING:  # the caller opens the warehouse; the library only reads and writes through it
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

CLOSE_PATIENCE_S = 120.0  # how long stopping a run holds off a further Ctrl-C (then it interrupts as usual)


class TrainingSession:
    """One training run; use as a context manager (it starts and stops servers and actors)."""

    def __init__(self, cfg: Config, warehouse: Warehouse, run_id: str, run_dir: Path, resume: bool = False,
                 force: bool = False, questions: TrainingPool | None = None):
        """`resume`: continue the run in `run_dir` if it holds one (refused when its config or
        pool changed, unless `force`, or when it finished); without it the folder must be new.
        `questions`: the training pool the caller already built (`TrainingPool.load`), else built here."""
        self.cfg, self.warehouse, self.run_id, self.run_dir = cfg, warehouse, run_id, run_dir
        self.questions = questions
        self.resume, self.force = resume, force
        self.ckpt_dir = run_dir / "checkpoints"
        self._stack = ExitStack()
        self.step = 0
        self.position = 0
        self.ahead: RunAhead | None = None  # batches of the next steps in flight (max_staleness >= 1)
        # reward.cost `bonus`: sqrt(cost) of past trajectories, across steps; saved in checkpoints
        self.cost_window = CostWindow(cfg.reward.cost.window)
        # the one reward stage of every training step (outcome, cost window, turn rewards, indicators)
        self.reward_stage = RewardStage(cfg.reward, env_prices(cfg.training_environments()), self.cost_window)
        self.step_indicators: dict[str, float] = {}  # the last scored batch's indicator shares (sampled members)
        self._restarts_reported = 0  # `pool.restarts` already in a `rollout_actor_restarts` (restarts_since_report)

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "TrainingSession":
        try:
            self._start()
        except BaseException:  # a later stage failed (or SIGTERM/Ctrl-C): stop what earlier ones started
            self._close()
            raise
        return self

    def _start(self) -> None:
        """Data, learner, environment server, rollout actors; each started piece is on `_stack`."""
        from prompt_r1.learner.base import open_learner
        from prompt_r1.learner.checkpoint import resume_checkpoint
        from prompt_r1.env.judge import use_judges

        check_run_settings(self.cfg)  # before data, models, servers or Ray: a config that cannot train fails at once
        # One process per run folder (a second is refused naming the holder), taken before Ray
        # starts (the capacity check may start it); a killed earlier owner's Ray leftovers are stopped.
        self._stack.enter_context(own_run(self.run_dir))
        self.questions = self.questions or TrainingPool.load(self.warehouse, self.cfg)
        self.train_questions, self.val_questions = self.questions.train, self.questions.validation
        self.by_id = {q.question_id: q for q in self.train_questions}
        # a dataset scorer that cannot load, a turn scorer that cannot judge this pool or a scaffold that
        # names an answer stops here, before Ray or any model starts; every scorer call gets data.scorer_timeout_s
        use_judges(self.cfg.data.judges, self.warehouse)  # the LLM judges a dataset's scorer may name
        self.reward_stage.check(self.train_questions, self.cfg.data.scorer_timeout_s)
        RewardStage(self.cfg.reward, strict=False).check(self.val_questions, self.cfg.data.scorer_timeout_s)
        check_scaffold_on(self.cfg, self.train_questions)
        check_run_capacity(self.cfg)
        # Checked before any model loads, so a refused resume fails in a second.
        # the scorers' (and indicators' and scaffold's) code is part of the run's identity: a resume after it
        # changed is refused like a config change
        scorers = scorer_fingerprints(self.train_questions + self.val_questions, self.cfg.reward.turn.scorer,
                                      self.cfg.reward.turn.indicators, self.cfg.rollout.scaffold.fn,
                                      self.cfg.rollout.scaffold.follow_up)
        open_run(self.run_dir, self.cfg.name, self.cfg.hash(), self.questions.hash, self.resume, self.force,
                 config=self.cfg, scorers=scorers)
        self.model_path = resolve_agent(self.cfg.agent.model, config_name=self.cfg.name)
        check_pack_budget_on(self.cfg, self.model_path, self.train_questions)  # before the learner or any rollout
        # in this process, or train.world_size ranks in Ray (then nothing here holds a model)
        self.learner = self._stack.enter_context(open_learner(self.cfg, self.model_path))
        # the newest intact checkpoint: a damaged newer one is named in a warning and passed over
        latest = resume_checkpoint(self.ckpt_dir) if self.resume else None
        if latest is not None:  # saved at any world size
            self.restore(latest)
        if self.resume:  # rows of steps after the checkpoint (or of all steps, without one) are redone
            self.warehouse.delete_steps_after(self.run_id, self.step - 1)
        self.actor_cfg = self._start_environments()
        self.pool = self._start_pool()
        self.ahead = RunAhead(self.pool, self.cfg.rollout.max_staleness, self.cfg.train.steps, sent_version=self.step)
        self._stack.callback(self.ahead.drop)  # runs before the pool stops (the stack is LIFO)
        if latest is not None:
            self.broadcast()

    def restore(self, checkpoint: Path) -> None:
        """Continue from `checkpoint`: the learner's state, the step, the data position and the cost
        reward's window (a checkpoint written before the window existed restores an empty one)."""
        self.step, data_position = self.learner.load_checkpoint(checkpoint)
        self.position = int(data_position.get("position", 0))
        self.cost_window.load(data_position.get("cost_window", []))
        log.info("resumed from %s: next step %d, data position %d", checkpoint, self.step, self.position)

    def __exit__(self, *exc: Any) -> None:
        self._close()

    def _close(self) -> None:
        """Stop what `_start` started, newest first. A second Ctrl-C is held off meanwhile
        (`interrupts_held`; each stop has its own deadline): cut short, it would leave actors,
        servers or Ray's agents running."""

        with interrupts_held("stopping the run's actors and servers", CLOSE_PATIENCE_S):
            self._stack.close()

    def mark_finished(self) -> None:
        """The run is complete: later resumes of it are refused."""

        mark_finished(self.run_dir)

    def _start_environments(self) -> Config:
        """The config the rollout actors get: managed vLLM servers of the training environments
        start here (driver), and actors reach them as `openai`."""
        from prompt_r1.rollout.pool import actor_environments

        return self._stack.enter_context(actor_environments(self.cfg, self.run_dir / "logs"))

    def _start_pool(self):
        from prompt_r1.cluster.connect import cpus_needed, init_ray
        from prompt_r1.rollout.pool import RolloutPool

        init_ray(self.cfg.rollout, cpus_needed(self.cfg))
        cfg = self.actor_cfg
        # a learner in Ray says where its ranks run: colocated engines go beside them (`rollout.colocate`)
        placements = getattr(self.learner, "placements", None)
        pool = self._stack.enter_context(RolloutPool(cfg, self.model_path, self.cfg.rollout.num_workers,
                                                     learner_placements=placements))
        return pool

    # -- stages (each one Prefect task in the flow) --------------------------------------
    def next_batch(self) -> list[QuestionRow]:
        ids = [q.question_id for q in self.train_questions]
        position, batch = next(iter(batches(ids, self.cfg.rollout.batch_questions, self.cfg.seed, self.position)))
        self.position = position + 1
        return [self.by_id[i] for i in batch]

    def rollout(self, questions: list[QuestionRow]) -> list[Trajectory]:
        """The group's multi-turn trajectories, not yet scored (`score` is its own stage)."""
        return self.pool.rollout(questions, self.step, score=False, scaffold=self.cfg.rollout.scaffold.fn is not None)

    def submit_rollout(self, questions: list[QuestionRow]) -> InFlight:
        """Queue the batch of the next step not yet in flight on the actors; returns at once."""
        return self.ahead.submit(questions, self.step)

    def collect_rollout(self, batch: InFlight) -> list[Trajectory]:
        """The trajectories of a batch submitted earlier (the oldest in flight), not yet scored."""
        return self.ahead.collect(batch)

    def run_ahead(self, hooks: TrainingHooks) -> None:
        """Submit the batches of the next steps that may start now (`RunAhead.next_step`: within
        `rollout.max_staleness` versions, none past `train.steps`; none at max_staleness 0)."""
        while self.ahead.next_step(self.step) is not None:
            questions = hooks.stage("next-batch", self.next_batch)
            hooks.stage("rollout-submit", self.submit_rollout, questions)

    def score(self, trajectories: list[Trajectory]) -> None:
        """The reward stage on the step's batch (`RewardStage`: outcome with cost, turn rewards), and
        the task's indicator shares over the members the policy sampled from the start."""
        questions = {t.question_id: self.by_id[t.question_id] for t in trajectories}
        self.reward_stage.score(trajectories, questions)
        sampled = [t for t in trajectories if t.reward is not None and not t.scaffold_turns]
        self.step_indicators = {f"indicator_{name}": share for name, share in indicator_shares(
            [self.reward_stage.indicators(questions[t.question_id], t) for t in sampled]).items()}

    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The GRPO update on the trajectories no environment failure ended (see `usable_for_update`);
        its metrics are the learner's and those trajectories' `rollout_stats`.

        When the step's share of one environment's failed calls passes its `max_error_rate`, the
        step's rows are recorded (failures included) and `EnvironmentFailure` is raised instead: no
        update, no step advance."""

        try:
            rate = check_pool_error_rates(self.cfg.training_environments(), trajectories,
                                          f"training step {self.step}")
        except EnvironmentFailure:
            trajs, calls = trajectory_rows(trajectories)
            self.warehouse.replace_step(self.run_id, self.step, trajs, calls)
            raise
        kept = usable_for_update(trajectories)
        if kept:
            with self._engines_asleep():
                learned = self.learner.step(kept)
            # the batch the update trained on, described here once for every kind of learner
            metrics = {**rollout_stats(kept, self.cfg.reward.format_cap), **learned}
        else:  # every group lost its pairs to failures: nothing to learn from, the step still counts
            log.warning("step %d: no group kept 2 trajectories without environment failures; no update", self.step)
            metrics = {"update_skipped": 1.0, "groups": 0.0, "groups_informative": 0.0, "informative_share": 0.0}
        metrics.update({"env_error_rate": rate, "trajectories_used": float(len(kept)),
                        "env_error_trajectories": float(env_error_trajectories(trajectories))})
        metrics.update(policy_age(trajectories, self.step))
        metrics.update(self.step_indicators)
        metrics.update(self.reward_stage.judge_stats)  # an LLM judge's cost and dropped samples (data.judges)
        if self.cfg.rollout.scaffold.fn is not None:  # how much of the batch the scaffold wrote, and how it did
            scaffolded = [t for t in kept if t.scaffold_turns]
            metrics.update(scaffold_stats(scaffolded, len(kept), self.cfg.rollout.scaffold.verified_at))
        return metrics

    @contextmanager
    def _engines_asleep(self) -> Iterator[None]:
        """Under `rollout.colocate` the rollout engines free the GPU memory they share with the
        learner for the update, and take it back after (before the weight broadcast); nothing
        rolls out meanwhile (colocate runs at max_staleness 0)."""
        if not self.cfg.rollout.colocate:
            yield
            return
        self.pool.sleep()
        try:
            yield
        finally:
            self.pool.wake_up()

    def finish_step(self, trajectories: list[Trajectory]) -> None:
        """Record the step's trajectories and env calls, then advance the step counter."""
        trajs, calls = trajectory_rows(trajectories)
        self.warehouse.replace_step(self.run_id, self.step, trajs, calls)
        self.step += 1

    def broadcast(self) -> None:
        """Sync the rollout engines to the learner's weights as policy version `step` (updates
        applied so far), verified on every engine (`RolloutPool.broadcast`). With batches in flight
        it does not wait: each engine loads the update after those batches, and the next collection
        verifies the engines' answers."""
        self.ahead.broadcast(self.learner.weights_for_sync(self.step), self.step)

    def checkpoint(self) -> Path:
        """Save weights, optimiser, RNG and data position after `step` updates (`run` decides when).
        The position is that of the first batch not trained yet: batches in flight are redone on resume
        (they were not scored yet, so the cost window holds the trained steps' trajectories only)."""
        position = self.position - len(self.ahead or ())
        return self.learner.save_checkpoint(self.ckpt_dir, self.step,
                                            {"position": position, "cost_window": self.cost_window.values()})

    def validate(self) -> dict[str, float]:
        """Greedy rollouts on held-out questions, scored over the questions the environment
        answered: a trajectory ended by a failed environment call is an error, not a 0, so
        `val_reward`, `val_answer` and `val_format_valid` average over the scored ones only;
        `val_env_error_rate` (share of failed calls) and `val_scored` (share of questions scored)
        stand beside them.

        Like a training step, validation stops the run with `EnvironmentFailure` when the share of
        one environment's failed calls passes its `max_error_rate`, and also when failures left no question
        scored (whatever the rate): a score made of failures is never reported, so no agent is
        checkpointed, exported or registered on one."""

        if not self.val_questions:
            return {}
        questions = self.val_questions[: self.cfg.train.validation_questions]
        # scored here, in the driver, as training is: a dataset's own scorer need not import in the actors
        trajectories = self.pool.rollout(questions, self.step, greedy=True, group_size=1, score=False)
        assert_unscaffolded(trajectories, "validation")
        RewardStage(self.cfg.reward, env_prices(self.cfg.training_environments()), strict=False).score(
            trajectories, {q.question_id: q for q in questions})
        where = f"validation after {self.step} update(s)"
        rate = check_pool_error_rates(self.cfg.training_environments(), trajectories, where)
        scored = [t for t in trajectories if t.reward is not None]
        if not scored:  # scoring runs on every trajectory no failure ended: all of them failed
            failed = next((t for t in trajectories if t.error), trajectories[0])
            name = failed.env_name or self.cfg.environment.name
            raise EnvironmentFailure(
                f"environment `{name}`: every question of {where} ended in a failed call "
                f"({len(trajectories)} of {len(trajectories)}, nothing to score); first error: {failed.error}",
                name, failed.error or "", rate)
        stats = rollout_stats(scored, self.cfg.reward.format_cap)
        out = {"val_reward": stats["reward_mean"], "val_answer": stats["answer_score"],
               "val_format_valid": stats["format_valid_rate"], "val_env_error_rate": rate,
               "val_scored": len(scored) / len(trajectories)}
        restarts = self.restarts_since_report()
        if restarts:  # an actor that died here, after the last step, would go uncounted otherwise
            out["rollout_actor_restarts"] = restarts
        return out

    def restarts_since_report(self) -> float:
        """Rollout actors Ray restarted (`RolloutPool.restarts`) since the last step or validation
        reported them: each restart is counted once, in the report after it."""
        new, self._restarts_reported = self.pool.restarts - self._restarts_reported, self.pool.restarts
        return float(new)

    def export_agent(self) -> Path | None:
        """The final checkpoint as a plain HF folder (`run_dir/agent`): merged under LoRA, no
        optimiser state; this is what evaluation loads and the registry stores."""
        from prompt_r1.learner.checkpoint import latest_checkpoint
        from prompt_r1.models.export import export_checkpoint

        final = latest_checkpoint(self.ckpt_dir)
        return export_checkpoint(final, self.run_dir / "agent", overwrite=True) if final else None

    def run(self, hooks: TrainingHooks | None = None) -> TrainingOutcome:
        """Train to `train.steps`: THE schedule, for `prompt-r1 train` and the Prefect flow alike.

        A fresh run first validates the untrained agent. Each step runs batch -> rollout ->
        reward -> update -> record -> broadcast, validates every `train.validate_every` steps and
        after the last, and checkpoints every `train.checkpoint_every` steps and after the last.
        With `rollout.max_staleness` >= 1 the batches of the next steps are submitted (`run_ahead`)
        between reward and update, and a step's rollout is the collection of its batch.
        The final checkpoint is exported as a plain HF folder. `hooks` observe (metrics, progress)
        and may wrap each stage (the flow runs each one as a Prefect task)."""
        hooks = hooks or TrainingHooks(self.cfg.train.steps)
        cfg = self.cfg.train
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        if self.step == 0 and self.val_questions:
            before = hooks.stage("validate", self.validate)
            hooks.on_validation(0, before)
        while self.step < cfg.steps:
            index = self.step
            t0 = time.perf_counter()
            if self.ahead:  # submitted during an earlier step (max_staleness >= 1)
                trajectories = hooks.stage("rollout", self.collect_rollout, self.ahead.batches[0])
            else:
                questions = hooks.stage("next-batch", self.next_batch)
                trajectories = hooks.stage("rollout", self.rollout, questions)
            rollout_s = time.perf_counter() - t0
            hooks.stage("reward", self.score, trajectories)
            self.run_ahead(hooks)  # the next steps' batches generate while this update runs
            metrics = hooks.stage("grpo-update", self.update, trajectories)
            metrics["rollout_time_s"] = rollout_s
            metrics["rollout_actor_restarts"] = self.restarts_since_report()
            hooks.stage("record", self.finish_step, trajectories)
            hooks.stage("broadcast-weights", self.broadcast)
            hooks.on_step(StepResult(index, metrics, trajectories))
            last = self.step == cfg.steps
            if last or (cfg.validate_every and self.step % cfg.validate_every == 0):
                val = hooks.stage("validate", self.validate)
                hooks.on_validation(self.step, val)
                if last:
                    after = val
            if last or self.step % cfg.checkpoint_every == 0:
                hooks.before_checkpoint(self.step)
                path = hooks.stage("checkpoint", self.checkpoint)
                hooks.after_checkpoint(self.step, path)
        if not after:  # resumed after the final checkpoint: validate the final weights
            after = hooks.stage("validate", self.validate)
        return TrainingOutcome(self.export_agent(), before, after)
