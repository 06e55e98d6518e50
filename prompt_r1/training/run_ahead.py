"""Asynchronous rollouts: the batches of later steps, in flight on the rollout actors while the
learner trains (`rollout.max_staleness` = k >= 1).

After a step's batch is scored, the session submits the batches of the next steps before the
step's update, so the actors generate while the learner trains. A batch is admitted only while
the newest weights queued to the actors are at most k versions behind the update that will train
on it (`admissible`), and the weight broadcast does not wait (it runs on each actor after the
batches queued before it). Data order, seeds, records and checkpoints are per step as at k = 0;
a checkpoint saves the data position of the first batch not yet trained, so a resume discards the
batches in flight and rolls them out again (with the resumed weights: a resumed run at k >= 1 is
not bit-identical to an uninterrupted one). At k = 0 nothing is ever submitted ahead and the
schedule is the synchronous one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory

if TYPE_CHECKING:
    from prompt_r1.core.weights import WeightUpdate
    from prompt_r1.core.weights import UpdateRef
    from prompt_r1.rollout.pool import PendingRollout, RolloutPool


@dataclass(eq=False)  # identity: the queue finds a handle in itself
class InFlight:
    """A batch rolled out ahead of its update."""

    step: int                        # the update that trains on it (its rollouts are seeded with it)
    questions: list[QuestionRow]
    pending: PendingRollout | None   # None once collected (or its collection failed: a retry redoes it)


def admissible(step: int, weights_version: int, max_staleness: int) -> bool:
    """May the batch of update `step` start on weights of `weights_version` (GRPO updates in them)?
    Trained at `step`, the learner then holds version `step`: the gap is its staleness.

    >>> admissible(3, 2, 1), admissible(3, 1, 1), admissible(3, 3, 0), admissible(4, 3, 0)
    (True, False, True, False)
    """
    return step - weights_version <= max_staleness


class RunAhead:
    """The batches submitted ahead of their update, oldest first, and the newest policy version
    queued to the actors (what admission is measured against)."""

    def __init__(self, pool: RolloutPool, max_staleness: int, total_steps: int, sent_version: int = 0):
        self.pool, self.max_staleness, self.total_steps = pool, max_staleness, total_steps
        self.sent_version = sent_version  # GRPO updates in the newest weights queued to the actors
        self.batches: list[InFlight] = []

    def __len__(self) -> int:
        return len(self.batches)

    def next_step(self, current_step: int) -> int | None:
        """The update whose batch may be submitted now (the first not in flight), or None: none
        past `total_steps`, none beyond the staleness bound, none at all at max_staleness 0."""
        step = current_step + 1 + len(self.batches)
        if not self.max_staleness or step >= self.total_steps:
            return None
        return step if admissible(step, self.sent_version, self.max_staleness) else None

    def submit(self, questions: list[QuestionRow], current_step: int) -> InFlight:
        """Queue the batch of the next update not yet in flight on the actors; returns at once."""
        batch = InFlight(current_step + 1 + len(self.batches), questions, None)
        batch.pending = self.pool.submit(questions, batch.step, score=False)
        self.batches.append(batch)
        return batch

    def collect(self, batch: InFlight) -> list[Trajectory]:
        """The trajectories of a submitted batch (the oldest in flight), not yet scored. If an
        earlier collection of it failed (the flow retries the stage) it is rolled out again."""
        if batch in self.batches:
            self.batches.remove(batch)
        pending, batch.pending = batch.pending, None
        if pending is None:
            return self.pool.rollout(batch.questions, batch.step, score=False)
        return self.pool.collect(pending)

    def broadcast(self, weights: WeightUpdate | UpdateRef, version: int) -> None:
        """Queue `weights` (policy `version`: GRPO updates in them) to the actors and measure
        admission against them from now on. With batches in flight it does not wait: each actor
        loads the update after those batches, and the next collection verifies it."""
        self.pool.broadcast(weights, wait=not self.batches)
        self.sent_version = version

    def drop(self) -> None:
        """Leaving the run with batches in flight (an error, or Ctrl-C): cancel them, so the
        actors' clean-up does not queue behind them."""
        for batch in self.batches:
            if batch.pending is not None:
                self.pool.cancel(batch.pending)
        self.batches = []
