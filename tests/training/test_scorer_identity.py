"""A run's scorers' code is part of its identity (issue 62 item 7): a resume after a dataset scorer
or the turn scorer was rewritten is refused like a config change, and `--force` records it; a
rewritten mapped-source scorer is a new version of that source."""

from __future__ import annotations

import json
import random

import pytest

from prompt_r1.config.experiment import parse_config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.data.ingest import ingest
from prompt_r1.data.scorers import scorer_fingerprints
from prompt_r1.training.run_folder import ResumeError, open_run, read_record

EDITS = [
    lambda text: text.replace("return 0.5", "return 1.0"),      # another value
    lambda text: text + "\n# a comment\n",                       # a comment only: still other code
    lambda text: text.replace("def score", "def helper(x):\n    return x\n\n\ndef score"),
]


def _scorer(path, body: str = "return 0.5"):
    path.write_text(f"def score(prediction, golds, metadata):\n    {body}\n\n\ndef turns(question, trajectory):\n"
                    "    return []\n")
    return path


def _questions(spec: str) -> list[QuestionRow]:
    return [QuestionRow(f"q{i}", "own", "train", f"q {i}?", ["a"], "custom", "scorer", scorer=spec) for i in range(3)]


CODE_SPECS = ["turn", "indicators", "scaffold"]  # the further import paths the session fingerprints, in its order


@pytest.mark.parametrize("which", ["dataset", *CODE_SPECS])
@pytest.mark.parametrize("edit", range(len(EDITS)))
def test_a_resume_after_the_scorers_code_changed_is_refused_and_force_records_it(tmp_path, which, edit) -> None:
    file = _scorer(tmp_path / "scorer.py")
    code_specs: list[str | None] = [None] * len(CODE_SPECS)
    if which != "dataset":
        code_specs[CODE_SPECS.index(which)] = f"{file}:turns"
    questions = _questions(f"{file}:score" if which == "dataset" else None)
    run = tmp_path / "run"
    first = scorer_fingerprints(questions, *code_specs)
    assert len(first) == 1
    open_run(run, "c", "h", "p", resume=False, scorers=first)
    open_run(run, "c", "h", "p", resume=True, scorers=scorer_fingerprints(questions, *code_specs))  # unchanged: fine
    file.write_text(EDITS[edit](file.read_text()))
    second = scorer_fingerprints(questions, *code_specs)
    with pytest.raises(ResumeError, match=r"scorer code .*scorer.py:(score|turns) \w+ -> \w+.*--force"):
        open_run(run, "c", "h", "p", resume=True, scorers=second)
    open_run(run, "c", "h", "p", resume=True, force=True, scorers=second)
    record = read_record(run)
    assert record["scorers"] == second and record["forced"][-1]["from_scorers"] == first
    open_run(run, "c", "h", "p", resume=True, scorers=second)  # the new code is the run's from now on


def test_a_run_of_an_older_version_without_a_scorer_record_resumes_and_is_recorded(tmp_path) -> None:
    run = tmp_path / "run"
    open_run(run, "c", "h", "p", resume=False)
    record = read_record(run)
    record.pop("scorers")
    (run / "run.json").write_text(json.dumps(record))
    now = {"m:f": "abc"}
    open_run(run, "c", "h", "p", resume=True, scorers=now)
    assert read_record(run)["scorers"] == now


@pytest.mark.parametrize("seed", range(3))
def test_a_rewritten_mapped_scorer_is_a_new_version_of_its_source(warehouse, tmp_path, seed) -> None:
    rng = random.Random(seed)
    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}?", "a": "x", "split": "train"}) + "\n"
                            for i in range(rng.randint(1, 5))))
    file = _scorer(tmp_path / "scorer.py")
    entry = {"path": str(data), "dataset": "own", "columns": {"question": "q", "answers": "a", "split": "split"},
             "scorer": f"{file}:score"}
    cfg = parse_config({"data": {"sources": [entry]}})
    assert not ingest(warehouse, cfg.data.sources)[0].skipped
    assert ingest(warehouse, cfg.data.sources)[0].skipped  # unchanged: a no-op
    before = warehouse.source_hashes()["own"]
    file.write_text(EDITS[rng.randrange(len(EDITS))](file.read_text()))
    report = ingest(warehouse, cfg.data.sources)[0]
    assert not report.skipped and report.inserted == 0 and report.updated == 0
    assert warehouse.source_hashes()["own"] != before
