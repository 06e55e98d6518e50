"""The cost-aware parts of the reward (`reward.cost`), as pure functions, and their rolling window.

Users pay per environment token, so the reward may prefer cheaper trajectories. The rules are
those of two routing papers, restated for Prompt-R1's reward (`core.reward`), whose `total` at
the format cap is `-1 + format + answer` (= the answer score at the default cap 1.0):

- cost of a trajectory, c = sum over its successful environment calls of
  (prompt_tokens x price_per_1k_prompt + completion_tokens x price_per_1k_completion) / 1000,
  each call priced by its own environment (`env_name`), cached replies priced like fresh ones
  (the reward must not depend on the state of the reply cache);
- `bonus` (Router-R1, arXiv 2506.09033): put sqrt(c) of every scored trajectory of the step into a
  rolling window (the last `window` values), take its `low`/`high` percentiles p_lo, p_hi (linear
  interpolation, numpy's default), and the cheapness c_norm = 1 - clip((sqrt(c) - p_lo) / (p_hi - p_lo), 0, 1),
  or 0.5 when p_hi - p_lo < 1e-8. A right answer (format at the cap and answer >= `correct_at`)
  gets total' = total x (1 - alpha) + c_norm x alpha; any other trajectory keeps its total;
- `penalty` (xRouter, arXiv 2510.08439, `R = score x (K - min(lambda x cost, cost_max))`): the
  answer score is multiplied, so at the cap total' = -1 + format + answer x (K - min(lambda x c, cost_max));
  below the cap the answer does not count and total' = total.

`RewardBreakdown.answer` stays the raw answer score (the accuracy metric); the cost part,
`RewardBreakdown.cost`, is total' - total, so format, gated answer and cost still add up.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from prompt_r1.core.reward import GATE_TOLERANCE, RewardBreakdown
from prompt_r1.core.trajectory import EnvCall

# env name -> (USD per 1k prompt tokens, USD per 1k completion tokens)
Prices = Mapping[str, tuple[float, float]]
FLAT_SPREAD = 1e-8  # Router-R1: a window narrower than this says nothing; cheapness is then 0.5


def call_cost(prompt_tokens: int, completion_tokens: int, price_per_1k_prompt: float,
              price_per_1k_completion: float) -> float:
    """USD of one call's usage at per-1k-token prices.

    >>> round(call_cost(2000, 500, 0.15, 0.6), 6)
    0.6
    """
    return (prompt_tokens * price_per_1k_prompt + completion_tokens * price_per_1k_completion) / 1000.0


def trajectory_cost(calls: Sequence[EnvCall], prices: Prices) -> float:
    """USD of a trajectory's successful environment calls, each at its environment's prices.

    >>> calls = [EnvCall(0, "big", "m", 1000, 100), EnvCall(1, "big", "m", 5, 5, error="HTTP 500")]
    >>> round(trajectory_cost(calls, {"big": (1.0, 2.0)}), 6)
    1.2
    """
    total = 0.0
    for call in calls:
        if call.error is not None:
            continue
        if call.env_name not in prices:
            raise KeyError(f"no prices for environment {call.env_name!r} (priced: {sorted(prices)}); the "
                           "training environments' price_per_1k_prompt / price_per_1k_completion price its calls")
        total += call_cost(call.prompt_tokens, call.completion_tokens, *prices[call.env_name])
    return total


def cheapness(sqrt_cost: float, low: float, high: float) -> float:
    """Router-R1's inverted min-max scale of sqrt(cost) between two window percentiles, in [0, 1].

    >>> cheapness(0.0, 1.0, 3.0), cheapness(2.0, 1.0, 3.0), cheapness(9.0, 1.0, 3.0), cheapness(2.0, 1.0, 1.0)
    (1.0, 0.5, 0.0, 0.5)
    """
    if high - low < FLAT_SPREAD:
        return 0.5
    return 1.0 - min(max((sqrt_cost - low) / (high - low), 0.0), 1.0)


def is_right(reward: RewardBreakdown, format_cap: float, correct_at: float) -> bool:
    """The answer counts and scores at least `correct_at` (1.0 = exact match for F1 and EM)."""
    return (reward.format >= format_cap - GATE_TOLERANCE) and reward.answer >= correct_at - GATE_TOLERANCE


def bonus_reward(reward: RewardBreakdown, c_norm: float, alpha: float, format_cap: float,
                 correct_at: float) -> RewardBreakdown:
    """Router-R1's cheapness bonus, mixed in with weight `alpha` for a right answer only.

    >>> r = bonus_reward(RewardBreakdown(1.0, 1.0, 1.0), c_norm=0.25, alpha=0.6, format_cap=1.0, correct_at=1.0)
    >>> round(r.total, 6), round(r.cost, 6)
    (0.55, -0.45)
    >>> bonus_reward(RewardBreakdown(1.0, 0.5, 0.5), 1.0, 0.6, 1.0, 1.0).cost  # not right: no bonus
    0.0
    """
    if not is_right(reward, format_cap, correct_at):
        return replace(reward, cost=0.0)
    total = reward.total * (1.0 - alpha) + c_norm * alpha
    return replace(reward, total=total, cost=total - reward.total)


def penalty_reward(reward: RewardBreakdown, cost_usd: float, scale: float, cost_cap: float,
                   keep: float, format_cap: float) -> RewardBreakdown:
    """xRouter's multiplicative penalty: the answer score times (keep - min(scale x cost, cost_cap)).

    >>> r = penalty_reward(RewardBreakdown(1.0, 0.5, 0.5), 0.1, scale=2.0, cost_cap=0.6, keep=1.0, format_cap=1.0)
    >>> round(r.total, 6), round(r.cost, 6), r.answer
    (0.4, -0.1, 0.5)
    >>> penalty_reward(RewardBreakdown(0.4, 0.5, -0.6), 0.1, 2.0, 0.6, 1.0, 1.0).total  # gate shut: unchanged
    -0.6
    """
    if reward.format < format_cap - GATE_TOLERANCE:
        return replace(reward, cost=0.0)
    factor = keep - min(scale * cost_usd, cost_cap)
    total = -1.0 + reward.format + reward.answer * factor
    return replace(reward, total=total, cost=total - reward.total)


class CostWindow:
    """The rolling window of sqrt(cost) values the bonus is scaled by (Router-R1 keeps the last
    1000 trajectories). State across training steps: the training session owns one, saves
    `values()` in each checkpoint and `load`s it on resume, so a resumed run scales alike."""

    def __init__(self, size: int, values: Iterable[float] = ()):
        self._values: deque[float] = deque(values, maxlen=size)

    def add(self, costs_usd: Iterable[float]) -> None:
        self._values.extend(math.sqrt(c) for c in costs_usd)

    def bounds(self, low_percentile: float, high_percentile: float) -> tuple[float, float]:
        """(p_low, p_high) of the window; (0, 0) when empty (cheapness 0.5)."""
        if not self._values:
            return 0.0, 0.0
        low, high = np.percentile(np.array(self._values, dtype=np.float64), [low_percentile, high_percentile])
        return float(low), float(high)

    def values(self) -> list[float]:
        return list(self._values)

    def load(self, values: Iterable[float]) -> None:
        self._values.clear()
        self._values.extend(float(v) for v in values)

    def __len__(self) -> int:
        return len(self._values)
