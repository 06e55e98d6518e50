"""The reward stage: the one room where a batch of trajectories is scored.

Everything a task says about a trajectory is applied here and nowhere else, for training,
validation and evaluation alike:
- the outcome reward (`score_trajectories`): the dual-constrained reward of the agent's turns, its
  answer term token F1 against the golds or the dataset's own scorer (`data.scorers`), then the cost
  part (`reward.cost`);
- the turn rewards (`reward.turn.scorer`, `core.turn_credit`), one per agent turn;
- the indicators (`reward.turn.indicators`): a task's yes/no facts about a trajectory (the two-hop
  task's: did the first call decompose, did anything leak), which steps and evaluation report as
  shares and which never enter the reward.

A trajectory an environment failure ended is never scored: a failure is not an answer. Nor is one
whose LLM judgement failed (`data.judge`: the judge's call failed, or its verdict states no score):
it gets that failure as its `error` and no reward, a dropped sample, never a 0. Training
is strict: a question the turn scorer does not define stops the run (`check`, before any model
loads). Evaluation is lenient: a dataset the task's turn scorer does not define gets no turn rewards
and no indicators, never an invented 0 (`defines`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prompt_r1.config.reward import RewardConfig
from prompt_r1.core.cost_reward import (CostWindow, Prices, bonus_reward, cheapness, penalty_reward,
                                        trajectory_cost)
from prompt_r1.core.reward import compute_reward
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import TurnRewardError, TurnScorer, load_turn_scorer, score_turns
from prompt_r1.core.scorer import AnswerScore
from prompt_r1.data.judge import JudgeFailure
from prompt_r1.data.scorers import check_scorers, score_many

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow

Indicators = Callable[["QuestionRow", Trajectory], Mapping[str, Any]]
INDICATORS = "reward.turn.indicators"


class RewardStage:
    """Scores batches under one `RewardConfig`; holds the task's loaded turn scorer and indicators.

    `prices` (env name -> per-1k prices) and `cost_window` (the training session's rolling window,
    None = a window of each batch alone) serve `reward.cost`; `strict` makes a question the turn
    scorer does not define an error instead of a trajectory without turn rewards."""

    def __init__(self, reward_cfg: RewardConfig, prices: Prices | None = None,
                 cost_window: CostWindow | None = None, strict: bool = True):
        self.cfg, self.prices, self.cost_window, self.strict = reward_cfg, prices, cost_window, strict
        turn = reward_cfg.turn
        self.turn_scorer: TurnScorer | None = load_turn_scorer(turn.scorer) if turn.scorer else None
        self.indicators_fn: Indicators | None = (
            load_turn_scorer(turn.indicators, INDICATORS) if turn.indicators else None)
        self._defined: dict[tuple[str, str, str], bool] = {}
        self.judge_stats: dict[str, float] = {}  # the last batch's LLM judge cost and dropped samples (step metrics)

    def check(self, questions: Sequence[QuestionRow], timeout_s: float | None = None) -> None:
        """Before any model loads: every dataset scorer loads (`timeout_s`, `data.scorer_timeout_s`,
        becomes every scorer call's deadline), and (strict) the turn scorer defines every question
        (called once with an empty trajectory; it raises for a question it does not define)."""
        check_scorers(list(questions), timeout_s)
        if self.turn_scorer is not None and self.strict:
            for question in questions:
                score_turns(self.turn_scorer, question, Trajectory(question.question_id, 0, []))

    def defines(self, question: QuestionRow) -> bool:
        """Does the task's turn scorer judge this question (its check with an empty trajectory passes)?"""
        if self.turn_scorer is None:
            return False
        key = (question.question_id, question.dataset, question.question)
        if key not in self._defined:
            try:
                score_turns(self.turn_scorer, question, Trajectory(question.question_id, 0, []))
                self._defined[key] = True
            except TurnRewardError:
                if self.strict:
                    raise
                self._defined[key] = False
        return self._defined[key]

    def score(self, trajectories: Sequence[Trajectory], questions_by_id: Mapping[str, QuestionRow]) -> None:
        """The whole stage on one batch: outcome rewards (with cost), then each scored trajectory's
        turn rewards where the task defines its question."""
        self.judge_stats = score_trajectories(trajectories, questions_by_id, self.cfg, self.prices, self.cost_window)
        for t in trajectories:
            if t.reward is not None and self.defines(questions_by_id[t.question_id]):
                t.turn_rewards = score_turns(self.turn_scorer, questions_by_id[t.question_id], t)

    def turn_rewards(self, question: QuestionRow, trajectory: Trajectory) -> list[float | None] | None:
        """The turn rewards of one (scored) trajectory, or None when the task does not define its question."""
        return score_turns(self.turn_scorer, question, trajectory) if self.defines(question) else None

    def indicators(self, question: QuestionRow, trajectory: Trajectory) -> dict[str, bool | None]:
        """The task's indicators of one trajectory (`reward.turn.indicators`), checked: names -> True,
        False or None; {} without indicators or for a question the turn scorer does not define."""
        if self.indicators_fn is None or not self.defines(question):
            return {}
        where = f"{INDICATORS} for question {question.question_id!r}"
        try:
            values = dict(self.indicators_fn(question, trajectory))
        except Exception as err:  # the task's own code: its failure stops the run, never a silent share
            raise TurnRewardError(f"{where} raised {type(err).__name__}: {err}") from err
        for name, value in values.items():
            if not isinstance(name, str) or not (value is None or isinstance(value, bool)):
                raise TurnRewardError(f"{where} returned {name!r}: {value!r}; return a dict of name -> True, "
                                      "False or None")
        return values


def indicator_shares(records: Sequence[Mapping[str, bool | None]]) -> dict[str, float]:
    """Per indicator name, the share of True over the records that define it (not None).

    >>> indicator_shares([{"a": True, "b": None}, {"a": False, "b": True}, {}])
    {'a': 0.5, 'b': 1.0}
    """
    seen: dict[str, list[bool]] = {}
    for record in records:
        for name, value in record.items():
            if value is not None:
                seen.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in sorted(seen.items())}


def _own_scores(trajectories: Sequence[Trajectory], questions_by_id: Mapping[str, QuestionRow],
                weights: Mapping[str, Any]) -> dict[int, AnswerScore | JudgeFailure]:
    """The dataset scorer's result for each trajectory whose reward asks for it, in one batch
    (`score_many`: an LLM judge's calls go out together): a first pass of `compute_reward` records
    which answers its answer term would score (only at the format cap), the batch scores them."""
    wanted: list[tuple[Trajectory, QuestionRow, str]] = []
    for traj in trajectories:
        question = questions_by_id[traj.question_id]
        if question.scorer is None:
            continue
        asked: list[str] = []
        compute_reward(traj.agent_turns, question.golds, **weights,
                       answer_score=lambda answer, seen=asked: seen.append(answer) or 0.0)
        if asked:
            wanted.append((traj, question, asked[0]))
    results = score_many([(q, answer) for _, q, answer in wanted])
    return {id(t): r for (t, _, _), r in zip(wanted, results)}


def score_trajectories(trajectories: Sequence[Trajectory], questions_by_id: Mapping[str, QuestionRow],
                       reward_cfg: RewardConfig, prices: Prices | None = None,
                       cost_window: CostWindow | None = None) -> dict[str, float]:
    """The outcome part of the stage: set each trajectory's `reward` from its agent turns and its
    question (`compute_reward` with `reward_cfg`'s weights): the answer term is token F1 against the
    golds, or the score of the dataset's own scorer when it names one (`data.scorers`; a scorer
    failure raises `ScorerError`, never a 0). Trajectories ended by an environment failure (`error`
    set) are left unscored: a failure is not an answer.

    With `reward_cfg.cost.mode` other than `off`, the scored trajectories' costs (their successful
    calls at `prices`, env name -> per-1k prices) then enter the reward (`core.cost_reward`):
    `bonus` first adds every scored trajectory's sqrt(cost) to `cost_window` (the training
    session's rolling window; None = a window of this batch alone), then scales each against
    the window's percentiles; `penalty` needs no window.

    Returns, when an LLM judge scored any answer, `judge_cost_usd` (its calls at its prices) and
    `judge_dropped` (trajectories whose judgement failed), for the step's metrics; else {}."""
    weights = reward_cfg.format_weights()
    for traj in trajectories:
        if traj.error is None and traj.question_id not in questions_by_id:
            raise KeyError(f"no question {traj.question_id!r}: pass every question the trajectories answer")
    own = _own_scores([t for t in trajectories if t.error is None], questions_by_id, weights)
    for traj in trajectories:
        if traj.error is not None:
            continue
        question = questions_by_id[traj.question_id]
        if isinstance(mine := own.get(id(traj)), JudgeFailure):
            traj.error = str(mine)  # a dropped sample: no reward, never a 0
            continue
        answer_score = None if question.scorer is None else (lambda _answer, m=mine: m.score)
        traj.reward = compute_reward(traj.agent_turns, question.golds, **weights, answer_score=answer_score)
    judged = [r for t in trajectories if (r := own.get(id(t))) is not None
              and (isinstance(r, JudgeFailure) or "judge_cost_usd" in r.parts)]
    stats = {"judge_cost_usd": sum(r.parts["judge_cost_usd"] for r in judged if not isinstance(r, JudgeFailure)),
             "judge_dropped": float(sum(isinstance(r, JudgeFailure) for r in judged))} if judged else {}
    _cost_terms(trajectories, reward_cfg, prices, cost_window)
    return stats


def _cost_terms(trajectories: Sequence[Trajectory], reward_cfg: RewardConfig, prices: Prices | None,
                cost_window: CostWindow | None) -> None:
    """`reward.cost` on the scored trajectories (see `score_trajectories`)."""
    cost = reward_cfg.cost
    if cost.mode == "off":
        return
    if prices is None:
        raise ValueError(f"reward.cost.mode is {cost.mode!r} but no environment prices were passed to score_trajectories")
    scored = [t for t in trajectories if t.reward is not None]
    costs = [trajectory_cost(t.env_calls, prices) for t in scored]
    cap = reward_cfg.format_cap
    if cost.mode == "penalty":
        for traj, usd in zip(scored, costs, strict=True):
            traj.reward = penalty_reward(traj.reward, usd, cost.penalty_scale, cost.penalty_cap, cost.penalty_keep, cap)
        return
    window = cost_window if cost_window is not None else CostWindow(cost.window)
    window.add(costs)  # the whole batch first: a group's members are scaled alike, whatever their order
    low, high = window.bounds(cost.low_percentile, cost.high_percentile)
    for traj, usd in zip(scored, costs, strict=True):
        traj.reward = bonus_reward(traj.reward, cheapness(math.sqrt(usd), low, high), cost.alpha, cap, cost.correct_at)
