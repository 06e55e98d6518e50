"""The reward with a dataset's own scorer: the paper's format gate, the scorer's score as the answer
term, and a scorer failure that stops the run instead of scoring 0 (`rollout.reward_stage.score_trajectories`)."""

from __future__ import annotations

import pytest
import random

from prompt_r1.config.experiment import RewardConfig
from prompt_r1.core.metrics import f1_score
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import ScorerError
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.rollout.reward_stage import score_trajectories

ASK = "<think>t</think><interaction_prompt>q</interaction_prompt>"
SCORER = """
import json

def score(prediction, golds, metadata):
    if prediction == "boom":
        raise ValueError("cannot parse")
    if prediction == "big":
        return 1.5
    return {"score": len(prediction) % 5 / 4, "weight": metadata["weight"]}
"""


@pytest.fixture
def own(tmp_path) -> str:
    (tmp_path / "own_scorer.py").write_text(SCORER)
    return f"{tmp_path / 'own_scorer.py'}:score"


def _question(scorer: str | None) -> QuestionRow:
    return QuestionRow("q-1", "people", "train", "Extract it", ["Ada"], "custom", "scorer" if scorer else "f1",
                       metadata={"weight": 2}, scorer=scorer)


def _score(turns: list[str], question: QuestionRow) -> Trajectory:
    traj = Trajectory("q-1", 0, [1], agent_turns=turns)
    score_trajectories([traj], {"q-1": question}, RewardConfig())
    return traj


FIRST_TURNS = [ASK, " " + ASK, "<think>t</think>no tags"]


def test_the_scorer_is_the_answer_term_inside_the_format_gate(own) -> None:
    """Seeded trajectories (a hand-rolled property test) against a restatement of the reward."""
    rng = random.Random(47)
    gates = set()
    for _ in range(400):
        first = [rng.choice(FIRST_TURNS) for _ in range(rng.randrange(3))]
        answer = "".join(rng.choice("abc ") for _ in range(rng.randrange(10)))
        tidy = rng.random() < 0.5
        _check_one(own, first, answer, tidy)
        gates.add(len([t for t in first if t == ASK]) >= 1 and tidy and bool(answer.strip()))
    assert gates == {True, False}  # both sides of the gate were drawn


def _check_one(own: str, first: list[str], answer: str, tidy: bool) -> None:
    final = f"<think>t</think><answer>{answer}</answer>" if tidy else f"<answer>{answer}</answer>"
    got = _score(first + [final], _question(own)).reward
    # an independent restatement of the reward (DESIGN.md) with the scorer's term in place of F1
    fmt = sum(0.4 for t in first if t == ASK) + (0.5 + (0.1 if tidy else 0.0) if answer.strip() else 0.0)
    fmt = 1.0 if fmt >= 1.0 - 1e-9 else fmt
    term = len(answer.strip()) % 5 / 4 if answer.strip() else 0.0
    assert got.format == pytest.approx(fmt) and got.answer == pytest.approx(term)
    assert got.total == pytest.approx(-1 + fmt + term if fmt == 1.0 else -1 + fmt)
    # the same turns without a scorer: the paper's F1
    assert _score(first + [final], _question(None)).reward.answer == pytest.approx(f1_score(answer.strip(), ["Ada"]))


def test_a_right_answer_by_the_scorer_differs_from_f1_by_a_real_margin(own) -> None:
    turns = [ASK, "<think>t</think><answer>abcd</answer>"]
    mine, paper = _score(turns, _question(own)).reward, _score(turns, _question(None)).reward
    assert mine.total == pytest.approx(1.0) and paper.total == pytest.approx(0.0)


@pytest.mark.parametrize("answer, words", [("boom", "raised ValueError: cannot parse"), ("big", "returned 1.5")])
def test_a_failing_scorer_stops_scoring_naming_scorer_and_question(own, answer, words) -> None:
    traj = Trajectory("q-1", 0, [1], agent_turns=[ASK, f"<think>t</think><answer>{answer}</answer>"])
    with pytest.raises(ScorerError) as err:
        score_trajectories([traj], {"q-1": _question(own)}, RewardConfig())
    assert own in str(err.value) and "'q-1'" in str(err.value) and words in str(err.value)
    assert traj.reward is None  # never a 0
