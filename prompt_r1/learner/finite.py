"""Every number the learner applies is finite, or the step stops before it is applied.

A non-finite loss makes non-finite gradients, and one optimiser step with them turns every weight
into NaN: the run then goes on, checkpoints and exports an agent that answers nothing, and exits
0. A finite setting can get there (a `reward.turn.weight` finite as a double and infinite once the
advantages are float32, a huge `train.lr`, a reward scorer's extreme value), so the check is on
what is applied, not on each setting: the global gradient norm, summed over ranks and measured
before clipping, is finite exactly when every gradient entry is. Every rank sees the same norm, so
every rank stops at the same optimiser step and none applies it.
"""

from __future__ import annotations

import math

from prompt_r1.core.failures import UserError


class NonFiniteUpdate(UserError, RuntimeError):
    """An update whose loss or gradient is not finite; nothing of it was applied."""


def check_finite_update(grad_norm: float, epoch: int, mini_batch: int, mini_batches: int) -> float:
    """`grad_norm` when finite; otherwise a `NonFiniteUpdate` naming where in the update it happened
    and what to change, raised before the optimiser step (so no weight, checkpoint or export holds it).

    >>> check_finite_update(2.5, 0, 0, 1)
    2.5
    >>> check_finite_update(float("nan"), 0, 1, 2)
    Traceback (most recent call last):
    ...
    prompt_r1.learner.finite.NonFiniteUpdate: the gradient norm of ppo epoch 1, mini-batch 2 of 2 is nan: the loss or its gradient is not finite, so the update was not applied and the run stops before this step's checkpoint. Lower what scales the loss (reward.turn.weight, reward weights or a scorer's values, train.lr), then continue from the last checkpoint with `train --resume --force`
    """
    if math.isfinite(grad_norm):
        return grad_norm
    raise NonFiniteUpdate(
        f"the gradient norm of ppo epoch {epoch + 1}, mini-batch {mini_batch + 1} of {mini_batches} is {grad_norm}: "
        "the loss or its gradient is not finite, so the update was not applied and the run stops before this "
        "step's checkpoint. Lower what scales the loss (reward.turn.weight, reward weights or a scorer's values, "
        "train.lr), then continue from the last checkpoint with `train --resume --force`")
