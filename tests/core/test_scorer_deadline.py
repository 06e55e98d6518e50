"""A task's scorer never hangs a run nor ends its process (issue 62 items 14 and 8): a call past
`data.scorer_timeout_s` and a `sys.exit` (at call or import) are errors naming the scorer, for answer
scorers (plain and async) and turn scorers alike."""

from __future__ import annotations

import asyncio
import time

import pytest

from prompt_r1.config.experiment import Config, parse_config
from prompt_r1.core import scorer_deadline
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import AnswerScorer, ScorerError, load_answer_scorer
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import TurnRewardError, score_turns

QUESTION = QuestionRow("q1", "own", "train", "q?", ["a"], "custom", "scorer")


@pytest.fixture(autouse=True)
def _short_deadline():
    scorer_deadline.set_deadline(0.3)
    yield
    scorer_deadline.set_deadline(scorer_deadline.DEFAULT_DEADLINE_S)


def _hang_sync(prediction, golds, metadata):
    time.sleep(30)


async def _hang_async(prediction, golds, metadata):
    await asyncio.sleep(30)


def _exit(code):
    def score(prediction, golds, metadata):
        raise SystemExit(code)
    return score


@pytest.mark.parametrize("fn", [_hang_sync, _hang_async], ids=["sync", "async"])
def test_a_scorer_call_past_the_deadline_is_an_error_naming_it(fn) -> None:
    started = time.monotonic()
    with pytest.raises(ScorerError, match=r"scorer `my:judge` for question 'q1' did not return within 0.3s "
                                          r"\(data.scorer_timeout_s\)"):
        AnswerScorer("my:judge", fn)("an answer", ["a"], {}, "q1")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("code", [0, 1, 2, None, "bye"])
def test_a_scorer_that_calls_sys_exit_is_an_error_not_the_end_of_the_process(code) -> None:
    with pytest.raises(ScorerError, match=r"scorer `my:f` for question 'q1' called sys.exit"):
        AnswerScorer("my:f", _exit(code))("an answer", ["a"], {}, "q1")


@pytest.mark.parametrize("behaviour", ["hang", "exit"])
def test_turn_scorers_keep_the_same_rules(behaviour) -> None:
    def turns(question, trajectory):
        if behaviour == "hang":
            time.sleep(30)
        raise SystemExit(0)

    with pytest.raises(TurnRewardError, match="did not return within|called sys.exit"):
        score_turns(turns, QUESTION, Trajectory("q1", 0, []))


@pytest.mark.parametrize("at_import", ["import sys\nsys.exit(0)\n",
                                       "import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n"])
def test_a_scorer_file_that_exits_when_imported_is_named(tmp_path, at_import) -> None:
    path = tmp_path / "exits.py"
    path.write_text(at_import + "def score(p, g, m):\n    return 1.0\n")
    with pytest.raises(ScorerError, match=r"exits.py called sys.exit\(.*\): it parses command-line arguments .*__main__"):
        load_answer_scorer(f"{path}:score")


def test_fast_scorers_are_unaffected_and_the_timeout_stays_out_of_the_hash() -> None:
    assert AnswerScorer("m:f", lambda p, g, m: 0.25)("x", ["a"], {}, "q").score == 0.25
    assert parse_config({"data": {"scorer_timeout_s": 5}}).hash() == Config().hash()
    with pytest.raises(Exception, match="scorer_timeout_s"):
        parse_config({"data": {"scorer_timeout_s": 0}})
