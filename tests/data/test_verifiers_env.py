"""verifiers environments as tasks, with a real verifiers (the `verifiers` extra) and a small
environment package (tests/fixtures/verifiers_env_tiny) installed for this session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the `verifiers` extra is not installed (scripts/setup.sh installs it)")

from prompt_r1.core.questions import QuestionRow  # noqa: E402
from prompt_r1.core.scorer import ScorerError  # noqa: E402
from prompt_r1.data.ingest import ingest  # noqa: E402
from prompt_r1.data.scorers import answer_scorer, score_question  # noqa: E402
from prompt_r1.data.verifiers_env import VerifiersError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tests" / "fixtures" / "verifiers_env_tiny"


@pytest.fixture(scope="session")
def env_path(tmp_path_factory) -> str:
    """The environment package, pip-installed (no dependencies: verifiers is there) into a folder
    on sys.path, as `prime env install` puts one into the venv."""
    import shutil

    target = tmp_path_factory.mktemp("vf-envs")
    source = tmp_path_factory.mktemp("vf-src") / PACKAGE.name  # pip builds in the source tree: not the repo's
    shutil.copytree(PACKAGE, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, timeout=300)
    sys.path.insert(0, str(target))
    yield str(target)
    sys.path.remove(str(target))


def test_an_environment_becomes_a_dataset_scored_by_its_rubric(warehouse, env_path) -> None:
    reports = ingest(warehouse, ["verifiers:vf-tiny-qa"])
    assert [(r.source, r.inserted) for r in reports] == [("verifiers:vf-tiny-qa:train", 4), ("verifiers:vf-tiny-qa:test", 2)]
    train = warehouse.questions(splits=["train"], datasets=["vf_tiny_qa"])
    assert [q.question for q in train][:1] == ["What is the capital of France?"]  # the env's system prompt left out
    paris = train[0]
    assert paris.golds == ["Paris"] and paris.scorer == "verifiers:vf-tiny-qa" and paris.primary_metric == "scorer"
    assert paris.metadata == {"answer": "Paris", "info": {"letters": 5}}
    # the rubric's weighted sum (exact 0.75 + right length 0.25), each function a part
    assert score_question(paris, "paris").score == pytest.approx(1.0)
    assert score_question(paris, "Lyons").score == pytest.approx(0.25)
    assert score_question(paris, "Rome").parts == {"exact": 0.0, "right_length": 0.0}
    assert all(r.skipped for r in ingest(warehouse, ["verifiers:vf-tiny-qa"]))


def test_a_rubric_that_raises_stops_the_run_naming_it(warehouse, env_path) -> None:
    ingest(warehouse, ["verifiers:vf-tiny-qa"])
    question = warehouse.questions(splits=["test"], datasets=["vf_tiny_qa"])[0]
    with pytest.raises(ScorerError) as err:
        score_question(question, "boom")
    text = str(err.value)
    assert "verifiers:vf-tiny-qa" in text and repr(question.question_id) in text and "`exact`" in text


def test_a_multi_turn_environment_is_refused(warehouse, env_path) -> None:
    with pytest.raises(VerifiersError, match="multi-turn environment whose episode is its own loop"):
        ingest(warehouse, ["verifiers:vf-tiny-loop"])
    with pytest.raises(VerifiersError, match="cannot load"):
        ingest(warehouse, ["verifiers:no-such-env"])
    assert warehouse.table_counts()["questions"] == 0
    with pytest.raises(ScorerError, match="scorer `verifiers:vf-tiny-loop`"):
        answer_scorer("verifiers:vf-tiny-loop")
    q = QuestionRow("x", "d", "test", "q", [], "custom", "scorer", scorer="verifiers:vf-tiny-loop")
    with pytest.raises(ScorerError):
        score_question(q, "7")


def test_the_command_line_ingests_an_environment(home, env_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([env_path, str(ROOT)])}
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "ingest", "verifiers:vf-tiny-qa"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "verifiers:vf-tiny-qa:train: 4 new" in ok.stdout and "vf_tiny_qa" in ok.stdout
    refused = subprocess.run([sys.executable, "-m", "flows.cli", "ingest", "verifiers:vf-tiny-loop"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "multi-turn" in refused.stdout + refused.stderr


@pytest.mark.parametrize("seed", range(30))
def test_rubric_weights_outside_zero_to_one_are_mapped_onto_it(seed) -> None:
    """verifiers' own examples weigh a right answer 1.0 plus format 0.2 (issue 62 item 10): whatever the
    weights, every score is in [0, 1], a better answer never scores lower, and weights that keep the sum
    inside [0, 1] score the plain sum."""
    import random

    from prompt_r1.data.verifiers_env import weighted_score

    rng = random.Random(seed)
    weights = [rng.choice([1.0, 0.2, 0.5, 2.0, -0.5, -1.0, 0.25]) for _ in range(rng.randint(1, 4))]
    answers = [[rng.random() for _ in weights] for _ in range(20)] + [[0.0] * len(weights), [1.0] * len(weights)]
    scores = [weighted_score(v, weights) for v in answers]
    assert all(-1e-12 <= s <= 1 + 1e-12 for s in scores)
    totals = [sum(w * x for w, x in zip(weights, v)) for v in answers]
    order = sorted(range(len(answers)), key=lambda i: totals[i])
    assert all(scores[a] <= scores[b] + 1e-12 for a, b in zip(order, order[1:]))
    if all(w >= 0 for w in weights) and sum(weights) <= 1:
        assert scores == pytest.approx(totals)
