"""Evaluation of a dataset with its own scorer: the scorer's score is the cell's score, with its
interval and named parts, stored in a real warehouse; a failing scorer stops the evaluation."""

from __future__ import annotations

import json

import pytest

from prompt_r1.config.env import EnvConfig
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import ScorerError
from prompt_r1.evaluation.scoring import Prediction, aggregate, primary_scores, score_predictions
from prompt_r1.evaluation.stats import bootstrap_ci, cell_seed

SCORER = """
def score(prediction, golds, metadata):
    if prediction == "boom":
        raise KeyError("city")
    hits = sum(word in prediction.split() for word in metadata["want"])
    return {"score": hits / len(metadata["want"]), "words": float(len(prediction.split()))}
"""


@pytest.fixture
def spec(tmp_path) -> str:
    (tmp_path / "words.py").write_text(SCORER)
    return f"{tmp_path / 'words.py'}:score"


def _q(i: int, spec: str | None) -> QuestionRow:
    return QuestionRow(f"q{i}", "people", "test", f"Q{i}?", ["Lyon Alice"], "custom", "scorer" if spec else "f1",
                       metadata={"want": ["Lyon", "Alice"]}, scorer=spec)


def test_the_scorer_is_the_cells_score_with_interval_and_parts(spec, warehouse) -> None:
    texts = ["Lyon Alice", "Lyon", "Paris", "Alice in Lyon", "", "nobody"]
    preds = [Prediction(_q(i, spec), "agent:base", t) for i, t in enumerate(texts)]
    preds.append(Prediction(_q(9, spec), "agent:base", "", error="HTTP 500"))  # a failure: recorded, unscored
    rows = score_predictions(preds)
    own = [1.0, 0.5, 0.0, 1.0, 0.0, 0.0]
    assert [r["score"] for r in rows[:6]] == own and rows[6]["score"] is None
    assert [r["f1"] for r in rows[:2]] == pytest.approx([1.0, 2 / 3])  # the built-in metrics stay beside it
    assert json.loads(rows[0]["parts"]) == {"words": 2.0} and rows[4]["parts"] is None  # blank: no call, no parts
    for r in rows:
        r["env_name"] = "tiny-env"
    (cell,) = aggregate(rows, EnvConfig())
    assert cell["score"] == pytest.approx(sum(own) / 6) and cell["errors"] == 1 and cell["n"] == 7
    assert (cell["ci_low"], cell["ci_high"]) == bootstrap_ci(own, seed=cell_seed("tiny-env", "agent:base", "people"))
    assert cell["ci_low"] < cell["score"] < cell["ci_high"]
    assert json.loads(cell["parts"]) == {"words": pytest.approx((2 + 1 + 1 + 3 + 1) / 5)}
    warehouse.write_eval("run1", rows, [cell])
    (stored,) = warehouse.eval_results("run1")
    assert stored["primary_metric"] == "scorer" and stored["score"] == pytest.approx(cell["score"])
    assert json.loads(stored["parts"]) == json.loads(cell["parts"])


def test_a_raising_scorer_stops_the_evaluation_naming_it(spec) -> None:
    with pytest.raises(ScorerError) as err:
        score_predictions([Prediction(_q(3, spec), "direct", "boom")])
    assert spec in str(err.value) and "'q3'" in str(err.value) and "KeyError" in str(err.value)


def test_the_baselines_optimise_the_same_score(spec) -> None:
    assert primary_scores(["Lyon", "Lyon Alice"], [_q(0, spec), _q(1, None)]) == [0.5, 1.0]
