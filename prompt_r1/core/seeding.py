"""The one rule for deriving random seeds, so a run's draws never depend on scheduling.

Every random draw of a run is seeded by a hash of *what* is drawn (run seed, training step,
question, sample index in its GRPO group, agent turn; the environment of a training pool each
question meets), never by *when* it happens: which
trajectories share a generation batch depends on when environment replies arrive, so a counter
of batched calls (or a batch position) would make a slow environment change the samples.
Hashing (rather than arithmetic such as `seed * K + step`) keeps distinct tuples from colliding
(`seed 0, epoch 1` vs `seed 1, epoch 0`) and spreads nearby tuples over the whole seed range.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# `step` of the draws made outside training (evaluation, serving): no training step is ever negative.
NO_STEP = -1
_MASK = (1 << 63) - 1  # torch.Generator.manual_seed and random.Random take any non-negative int < 2**64


def derive_seed(purpose: str, *parts: int | str) -> int:
    """A 63-bit seed that is a pure function of `purpose` and `parts` (stable across processes,
    platforms and Python versions; `hash()` is salted per process, so it is not used).

    >>> derive_seed("data_order", 0, 1) == derive_seed("data_order", 0, 1)
    True
    >>> derive_seed("data_order", 0, 1) != derive_seed("data_order", 1, 0)
    True
    >>> 0 <= derive_seed("x") < 2**63
    True
    """
    text = "\x1f".join([purpose, *(f"{type(p).__name__}:{p}" for p in parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") & _MASK


def draw_seed(seed: int, step: int, question_id: str, sample_index: int, turn: int) -> int:
    """Seed of one agent generation: run `seed`, training `step` (`NO_STEP` outside training),
    the question, the trajectory's index in its group and the agent turn (0-based).

    >>> draw_seed(0, 3, "q1", 0, 0) == draw_seed(0, 3, "q1", 0, 0)
    True
    >>> len({draw_seed(0, 3, "q1", g, t) for g in range(8) for t in range(4)})  # distinct per sample and turn
    32
    >>> draw_seed(0, 3, "q1", 0, 0) != draw_seed(0, NO_STEP, "q1", 0, 0)
    True
    """
    return derive_seed("agent_turn", seed, step, question_id, sample_index, turn)


def draw_environment(seed: int, step: int, question_id: str, weights: Sequence[float]) -> int:
    """Index of the environment a question meets in a training pool with sampling `weights`: one
    draw per (run `seed`, `step`, question), so the question's whole GRPO group shares it and the
    group baseline compares prompts, never environment strength. A pool of one draws nothing.

    >>> draw_environment(0, 3, "q1", [1.0])
    0
    >>> draw_environment(0, 3, "q1", [1.0, 2.0]) == draw_environment(0, 3, "q1", [1.0, 2.0])
    True
    >>> sorted({draw_environment(0, s, "q1", [1.0, 1.0]) for s in range(20)})
    [0, 1]
    """
    if len(weights) == 1:
        return 0
    if not weights or any(w <= 0 for w in weights):
        raise ValueError(f"environment weights must be positive, got {list(weights)}")
    target = derive_seed("environment", seed, step, question_id) / (_MASK + 1) * sum(weights)
    total = 0.0
    for index, weight in enumerate(weights):
        total += weight
        if target < total:
            return index
    return len(weights) - 1  # float rounding at the top end
