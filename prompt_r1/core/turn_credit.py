"""Turn-level credit (MT-GRPO, arXiv 2505.11821): a small per-turn reward that moves only the
tokens of the turn it judges.

GRPO gives every token of a trajectory one advantage, so in a three-turn episode the turn that
made the difference (on the two-hop task, the follow-up call that names what the first reply
said) earns the same credit as the turns around it. Here a task may also score each agent turn t
of a trajectory, r_t in [0, 1] or None (the task says nothing about that turn), from the
trajectory alone. Within a GRPO group, per turn index t, over the members whose r_t is not None:

    A_t = r_t - mean_group(r_t)                   (no std division, as Dr.GRPO: the weight is the scale)
    token advantage = A + weight * A_t            on the sampled tokens of turn t
    token advantage = A                           on every other token (None turns, inserted tokens)

where A is the outcome advantage GRPO computes as always. A group of one, or a turn that only one
member of the group reached, has A_t = 0. A group uniform in the outcome and in every turn's
defined r_t carries no signal (`informative`). Studies of 3B-7B search agents found strong
intermediate rewards over-correct, so the weight stays small (MT-GRPO uses 1.0; start near 0.5).

A turn's tokens are the t-th maximal run of loss-mask-1 tokens of the response: agent turns are
sampled back to back with the environment's inserted reply (mask 0) between them, and every
sampled turn has at least one token (`turn_spans`).

The scorer is any function named by import path (`package.module:function` or
`path/to/file.py:function`, `load_turn_scorer`: the same door as a dataset's answer scorer),
called as `scorer(question, trajectory)` with the `QuestionRow` and the `Trajectory`; it returns one
value per agent turn. A question the scorer does not define raises inside the scorer, and that
error stops the run naming the setting: a turn reward a task does not define is never a silent 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from prompt_r1.core.scorer_deadline import call_with_deadline
from prompt_r1.core.scorer import ScorerError, is_real_number, load_callable

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.core.trajectory import Trajectory

TurnRewards = Sequence[float | None]
TurnScorer = Callable[["QuestionRow", "Trajectory"], TurnRewards]
SETTING = "reward.turn.scorer"


class TurnRewardError(ScorerError):
    """A turn scorer that cannot be loaded, or that fails or answers out of contract for a question."""


def load_turn_scorer(spec: str, setting: str = SETTING) -> TurnScorer:
    """The function `spec` names (`package.module:function` or `path/to/file.py:function`, resolved by
    `core.scorer.load_callable`, the one resolver of task code), or a `TurnRewardError` naming `setting`.

    >>> load_turn_scorer("prompt_r1.data.compositional:follow_up_turn_rewards").__name__
    'follow_up_turn_rewards'
    >>> load_turn_scorer("no_such_module_here:f")
    Traceback (most recent call last):
    ...
    prompt_r1.core.turn_credit.TurnRewardError: reward.turn.scorer: cannot import module `no_such_module_here` (No module named 'no_such_module_here'); name an importable module as `package.module:function`
    """
    return load_callable(spec, setting, TurnRewardError)


def score_turns(scorer: TurnScorer, question: QuestionRow, trajectory: Trajectory,
                setting: str = SETTING) -> list[float | None]:
    """`scorer`'s turn rewards for one trajectory, checked: one value per agent turn, each None or a
    finite number in [0, 1]. Anything else (or an exception) is a `TurnRewardError` naming the
    setting, the question and what came back."""
    where = f"{setting} for question {question.question_id!r} (dataset {question.dataset})"
    try:
        values = list(call_with_deadline(lambda: scorer(question, trajectory), where, TurnRewardError))
    except TurnRewardError:
        raise
    except Exception as err:  # the task's own code: its failure stops the run, never a silent 0
        raise TurnRewardError(f"{where} raised {type(err).__name__}: {err}") from err
    if len(values) != len(trajectory.agent_turns):
        raise TurnRewardError(f"{where} returned {len(values)} value(s) for {len(trajectory.agent_turns)} "
                              "agent turn(s); return one value (or None) per turn")
    for value in values:
        if value is None:
            continue
        if not is_real_number(value) or not math.isfinite(value) \
                or not 0.0 <= value <= 1.0:
            raise TurnRewardError(f"{where} returned {value!r}; each turn reward must be None or a number in [0, 1]")
    return [None if v is None else float(v) for v in values]


def turn_advantages(turn_rewards: Sequence[TurnRewards], group_ids: Sequence[Hashable]) -> list[list[float]]:
    """A_t per trajectory and turn: r_t minus the mean of r_t over the group members that define it;
    0.0 where r_t is None.

    >>> turn_advantages([[None, 1.0], [None, 0.0], [None, 0.5, None], [1.0]], ["a", "a", "a", "b"])
    [[0.0, 0.5], [0.0, -0.5], [0.0, 0.0, 0.0], [0.0]]
    """
    sums: dict[tuple[Hashable, int], float] = {}
    counts: dict[tuple[Hashable, int], int] = {}
    for rewards, group in zip(turn_rewards, group_ids, strict=True):
        for t, r in enumerate(rewards):
            if r is not None:
                sums[group, t] = sums.get((group, t), 0.0) + r
                counts[group, t] = counts.get((group, t), 0) + 1
    return [[0.0 if r is None else r - sums[group, t] / counts[group, t] for t, r in enumerate(rewards)]
            for rewards, group in zip(turn_rewards, group_ids, strict=True)]


def informative(rewards: Sequence[float], turn_rewards: Sequence[TurnRewards],
                group_ids: Sequence[Hashable]) -> list[bool]:
    """Per trajectory: does its group carry a signal, in the outcome or in some turn's reward?
    (>= 2 members, and the outcomes differ or some turn's defined rewards differ.) The outcome
    part is `core.grpo.informative_groups`, the rule the paper's GRPO uses.

    >>> informative([1.0, 1.0, 0.0, 0.0], [[None, 1.0], [None, 0.5], [None], [None]], ["a", "a", "b", "b"])
    [True, True, False, False]
    """
    import torch

    from prompt_r1.core.grpo import informative_groups

    index = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    outcome = informative_groups(torch.tensor(list(rewards), dtype=torch.float64),
                                 torch.tensor([index[g] for g in group_ids])).tolist()
    members: dict[Hashable, int] = {}
    seen: dict[tuple[Hashable, int], set[float]] = {}
    for turns, group in zip(turn_rewards, group_ids, strict=True):
        members[group] = members.get(group, 0) + 1
        for t, r in enumerate(turns):
            if r is not None:
                seen.setdefault((group, t), set()).add(float(r))
    varied = {group for (group, _), values in seen.items() if len(values) > 1}
    return [o or (members[g] > 1 and g in varied) for o, g in zip(outcome, group_ids)]


def turn_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of 1s: the sampled tokens of each agent turn, in order.

    >>> turn_spans([1, 1, 0, 0, 1, 0, 1, 1])
    [(0, 2), (4, 5), (6, 8)]
    """
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def token_advantages(outcome: float, turn_adv: Sequence[float], loss_mask: Sequence[int],
                     weight: float) -> list[float]:
    """One advantage per response token: `outcome` everywhere, plus `weight * turn_adv[t]` on the
    tokens of agent turn t.

    >>> token_advantages(0.5, [0.0, -1.0], [1, 1, 0, 1], weight=0.5)
    [0.5, 0.5, 0.5, 0.0]
    """
    spans = turn_spans(loss_mask)
    if len(spans) != len(turn_adv):
        raise ValueError(f"{len(turn_adv)} turn advantage(s) for a response with {len(spans)} sampled turn(s)")
    out = [float(outcome)] * len(loss_mask)
    for (start, end), adv in zip(spans, turn_adv):
        for i in range(start, end):
            out[i] = outcome + weight * adv
    return out
