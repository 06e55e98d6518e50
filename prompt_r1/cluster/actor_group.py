"""What every group of Ray actors of one role shares: how long an actor's own clean-up may take,
and how a batch is split over the group.

The rollout pool (`rollout.pool`), the learner group (`learner.ray_group`) and the evaluation
engines (`evaluation.engines`) each hold N actors of one role; the split here is the one
contiguous split all of them use, so whole GRPO groups stay together in a rollout chunk and a
mini-batch's rows go to the learner ranks in order.
"""

from __future__ import annotations

from typing import Any

SHUTDOWN_TIMEOUT_S = 60.0  # an actor's own clean-up (environment client, policy) before ray.kill


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """Contiguous chunks whose sizes differ by at most one.

    >>> split_evenly([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    >>> split_evenly([1], 3)
    [[1], [], []]
    """
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks
