"""A task's own scorer: the one import-path resolver and the answer scorer's contract (`core.scorer`)."""

from __future__ import annotations

import math

import pytest
import random

from prompt_r1.core.scorer import (AnswerScore, AnswerScorer, ScorerError, check_answer_score, load_answer_scorer,
                                   load_callable, resolved_spec)
from prompt_r1.core.turn_credit import TurnRewardError, load_turn_scorer


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_file_outside_the_package_is_a_scorer_by_path(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "my task"
    folder.mkdir()
    _write(folder / "helpers.py", "def same(a, b):\n    return float(a == b)\n")
    _write(folder / "scorer.py", "from helpers import same\n\ndef score(p, golds, meta):\n    return same(p, golds[0])\n")
    monkeypatch.chdir(tmp_path)
    fn = load_callable("my task/scorer.py:score", "data.sources[0].scorer")
    assert fn("x", ["x"], {}) == 1.0 and fn("x", ["y"], {}) == 0.0  # it imports its neighbour
    assert resolved_spec("my task/scorer.py:score") == f"{folder / 'scorer.py'}:score"
    # the same file is one module, and another folder's scorer.py is another
    assert load_callable(f"{folder}/scorer.py:score", "s") is fn
    other = tmp_path / "other"
    other.mkdir()
    _write(other / "scorer.py", "def score(p, g, m):\n    return 0.5\n")
    assert load_callable("other/scorer.py:score", "s")("x", [], {}) == 0.5


@pytest.mark.parametrize("spec, words", [
    ("nothing_here.py:score", "no file"),
    ("prompt_r1.core.metrics", "not an import path"),
    ("no_such_module_xyz:score", "cannot import module `no_such_module_xyz`"),
    ("prompt_r1.core.metrics:no_such_fn", "has no function `no_such_fn`"),
])
def test_a_scorer_that_cannot_be_loaded_is_named(tmp_path, monkeypatch, spec, words) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScorerError) as err:
        load_answer_scorer(spec)
    assert f"`{spec}`" in str(err.value) and words in str(err.value)


def test_a_scorer_file_that_raises_on_import_is_named(tmp_path) -> None:
    path = _write(tmp_path / "broken.py", "raise RuntimeError('half written')\n")
    with pytest.raises(ScorerError, match="raised RuntimeError: half written"):
        load_callable(f"{path}:score", "s")


def test_the_turn_scorer_takes_the_same_door(tmp_path) -> None:
    path = _write(tmp_path / "turns.py", "def turns(question, trajectory):\n    return []\n")
    assert load_turn_scorer(f"{path}:turns").__name__ == "turns"
    with pytest.raises(TurnRewardError, match="reward.turn.scorer.*no file"):
        load_turn_scorer(str(tmp_path / "missing.py") + ":turns")


def _contract(value) -> float | None:
    """An independent restatement: the primary score the contract accepts, or None."""
    if isinstance(value, dict):
        if "score" not in value or any(type(v) not in (int, float) or v != v or v in (math.inf, -math.inf)
                                       for k, v in value.items() if k != "score"):
            return None
        value = value["score"]
    if type(value) not in (int, float) or not (0 <= value <= 1):
        return None
    return float(value)


def _values(rng: random.Random, depth: int = 0):
    """Seeded draws over what a scorer might return: numbers in and out of range, NaN, infinities,
    bools, None, text, and dicts of those with or without `score` (a hand-rolled property test)."""
    pick = rng.randrange(9 if depth == 0 else 8)
    if pick == 8:
        return {rng.choice(["score", "valid_json", "len"]): _values(rng, 1) for _ in range(rng.randrange(4))}
    return [rng.uniform(-0.5, 1.5), rng.random(), rng.randint(-3, 3), math.nan, rng.choice([math.inf, -math.inf]),
            rng.choice([True, False]), None, rng.choice(["", "1", "0.5"])][pick]


def test_the_contract_accepts_exactly_a_number_in_0_1() -> None:
    rng = random.Random(47)
    outcomes = set()
    for _ in range(3000):
        value = _values(rng)
        expected = _contract(value)
        outcomes.add((type(value).__name__, expected is not None))
        if expected is None:
            with pytest.raises(ScorerError):
                check_answer_score(value, "scorer `f`")
        else:
            got = check_answer_score(value, "scorer `f`")
            assert got.score == expected
            assert got.parts == ({k: float(v) for k, v in value.items() if k != "score"}
                                 if isinstance(value, dict) else {})
    # every kind was both accepted and refused somewhere (bools, None and text only refused)
    assert {("float", True), ("float", False), ("int", True), ("int", False), ("dict", True), ("dict", False),
            ("bool", False), ("NoneType", False), ("str", False)} <= outcomes


def test_a_raising_or_out_of_range_scorer_stops_naming_the_scorer_and_question() -> None:
    def judge(prediction, golds, metadata):
        if prediction == "boom":
            raise KeyError("fields")
        return {"score": 2.0} if prediction == "big" else len(metadata["fields"]) / 4

    scorer = AnswerScorer("tasks.people:judge", judge)
    assert scorer("  {} ", ["x"], {"fields": [1, 2, 3]}, "q7") == AnswerScore(0.75)
    for bad, words in [("boom", "raised KeyError"), ("big", "returned 2.0")]:
        with pytest.raises(ScorerError) as err:
            scorer(bad, ["x"], {"fields": []}, "q7")
        assert "`tasks.people:judge`" in str(err.value) and "'q7'" in str(err.value) and words in str(err.value)


def test_a_blank_answer_scores_0_without_calling_the_scorer() -> None:
    calls = []
    scorer = AnswerScorer("s:f", lambda *args: calls.append(args) or 1.0)
    assert scorer("   ", ["x"], None, "q1") == AnswerScore(0.0) and calls == []
    assert scorer(" y ", ["x"], None, "q1").score == 1.0 and calls == [("y", ["x"], {})]


def test_an_async_scorer_is_awaited_even_inside_a_running_loop() -> None:
    import asyncio

    async def judge(prediction, golds, metadata):
        await asyncio.sleep(0)
        return 0.25

    async def inside():
        return AnswerScorer("s:judge", judge)("x", [], {}, "q1")

    assert asyncio.run(inside()).score == 0.25
