"""A user's task end to end (configs/own-task.yaml): questions from a file in a folder outside the
package, scored by a function in that folder, trained and evaluated from the command line as the
README shows; and a scorer that goes missing stops the run before any model loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_train_and_evaluate_a_task_defined_by_a_data_file_and_a_scorer(tmp_path) -> None:
    home = tmp_path / "runs"
    trained = _cli("train", "-c", "configs/own-task.yaml", "--set", "train.steps=1", cwd=ROOT, home=home)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    run = next(p for p in (home / "own-task").iterdir() if (p / "agent").is_dir())
    evaluated = _cli("evaluate", "-c", "configs/own-task.yaml", "--agent", f"trained={run / 'agent'}",
                     "--set", "eval.limit_per_dataset=2", cwd=ROOT, home=home)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    import duckdb

    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        questions = con.execute("SELECT split, count(*), any_value(scorer), any_value(metadata) FROM questions "
                                "WHERE dataset = 'people' GROUP BY split ORDER BY split").fetchall()
        cells = con.execute("SELECT method, primary_metric, n, score, ci_low, ci_high FROM eval_results "
                            "ORDER BY method").fetchall()
        trajectories = con.execute("SELECT count(*), count(reward_total) FROM trajectories").fetchone()
    assert [(s, n) for s, n, _, _ in questions] == [("test", 4), ("train", 8)]
    assert questions[0][2] == f"{ROOT / 'examples' / 'own-task' / 'scorer.py'}:score"
    assert json.loads(questions[0][3]) == {"fields": ["name", "age", "city"]}
    assert trajectories[0] > 0 and trajectories[0] == trajectories[1]  # every trajectory got the task's reward
    assert {m for m, *_ in cells} == {"direct", "agent:base", "agent:trained"}
    for method, metric, n, score, low, high in cells:
        assert metric == "scorer" and n == 2 and 0.0 <= low <= score <= high <= 1.0, method


def test_a_scorer_that_cannot_be_imported_stops_training_before_any_model(tmp_path) -> None:
    """Ingested with its scorer, which then goes missing: the next `train` (a fresh process, as a
    user's next command) stops at the pre-flight, exit 2, naming the scorer and the dataset."""
    import prompt_r1
    from prompt_r1.api import open_warehouse
    from prompt_r1.data.ingest import ingest

    folder = tmp_path / "task"
    shutil.copytree(ROOT / "examples" / "own-task", folder)
    entry = {**prompt_r1.load_config(ROOT / "configs" / "own-task.yaml").data.sources[0].model_dump(mode="json"),
             "path": str(folder / "people.jsonl"), "scorer": f"{folder / 'scorer.py'}:score"}
    home = tmp_path / "runs"
    with open_warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, [prompt_r1.load_config(ROOT / "configs" / "own-task.yaml",
                                          {"data.sources": [entry]}).data.sources[0]])
    (folder / "scorer.py").unlink()
    run = _cli("train", "-c", "configs/own-task.yaml", "--set", f"data.sources={json.dumps([entry])}", cwd=ROOT,
               home=home)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-3000:]
    flat = out.replace("\n", "")
    # named where it is known first: at ingest, by its setting and file (or, ingested earlier, by its dataset)
    assert ("data.sources[0].scorer" in flat and "scorer.py" in flat) or (
        f"{folder / 'scorer.py'}:score" in flat and "dataset people" in out)
    assert not (home / "own-task").exists() or not any((home / "own-task").rglob("checkpoints/*"))
