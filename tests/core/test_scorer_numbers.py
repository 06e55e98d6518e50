"""A scorer may return any real number type in [0, 1] (issue 62 item 10): numpy's scalars of every
width are accepted and stored as floats; booleans, strings and non-finite values are still refused."""

from __future__ import annotations

import numpy as np
import pytest

from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import ScorerError, check_answer_score
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import TurnRewardError, score_turns

FLOATS = [np.float16, np.float32, np.float64, float]
INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, int]
CASES = [(kind, value) for kind in FLOATS for value in (0, 1, 0.25, 0.4285714)] + \
    [(kind, value) for kind in INTEGERS for value in (0, 1)]


@pytest.mark.parametrize("kind,value", CASES, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_any_real_number_type_in_range_is_a_score(kind, value) -> None:
    got = check_answer_score(kind(value), "s")
    assert isinstance(got.score, float) and got.score == pytest.approx(float(kind(value)))
    parts = check_answer_score({"score": kind(value), "extra": kind(value)}, "s").parts
    assert isinstance(parts["extra"], float)
    question = QuestionRow("q", "d", "train", "q?", ["a"], "custom", "f1")
    trajectory = Trajectory("q", 0, [], agent_turns=["t"])
    assert score_turns(lambda q, t: [kind(value)], question, trajectory) == [pytest.approx(float(kind(value)))]


@pytest.mark.parametrize("bad", [True, np.bool_(True), "0.5", np.float32("nan"), np.float64("inf"), np.float32(1.5),
                                 np.int64(2), None, [0.5]], ids=repr)
def test_non_numbers_and_values_out_of_range_are_still_refused(bad) -> None:
    with pytest.raises(ScorerError, match="returned"):
        check_answer_score(bad, "s")
    question = QuestionRow("q", "d", "train", "q?", ["a"], "custom", "f1")
    if bad is not None:
        with pytest.raises(TurnRewardError):
            score_turns(lambda q, t: [bad], question, Trajectory("q", 0, [], agent_turns=["t"]))
