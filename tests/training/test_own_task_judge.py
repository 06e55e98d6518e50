"""An open-ended task scored by an LLM judge end to end (configs/own-task-judge.yaml): trained one
step and evaluated from the command line with the real bundled SmolLM2-135M-Instruct as the judge.
Every evaluation row is either judged (a score in [0, 1], the judge's usage and cost in its parts)
or dropped with the judge's reason (no score, never a 0); the cell's cost includes the judge's; a
rerun's judgements all come from the reply cache. (Traces are written by the tracked flows, not by
`evaluate`: the judge's feedback on a trace is checked through MLflow in tests/flows/test_judge_traces.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/own-task-judge.yaml"


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)


def _rows(home: Path) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        return con.execute("SELECT method, question_id, prediction, score, error, parts FROM eval_predictions "
                           "ORDER BY method, question_id").fetchall()


@pytest.mark.slow
def test_train_and_evaluate_an_open_ended_task_with_a_real_judge(tmp_path) -> None:
    home = tmp_path / "runs"
    trained = _cli("train", "-c", CONFIG, home=home)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    agent = next(p for p in (home / "own-task-judge").iterdir() if (p / "agent").is_dir()) / "agent"
    evaluate = ("evaluate", "-c", CONFIG, "--agent", f"trained={agent}", "--set", "eval.limit_per_dataset=3")
    evaluated = _cli(*evaluate, home=home)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]

    import duckdb

    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        scorer = con.execute("SELECT DISTINCT scorer FROM questions WHERE dataset = 'rewrites'").fetchall()
        cells = con.execute("SELECT method, n, score, errors, cost_usd FROM eval_results ORDER BY method").fetchall()
        cached = con.execute("SELECT count(*) FROM env_cache WHERE model = 'smollm2-135m-instruct'").fetchone()[0]
    assert scorer == [("judge:judge",)]
    rows = _rows(home)
    judged = [r for r in rows if r[5] and "judge_cost_usd" in json.loads(r[5])]
    assert judged, rows  # SmolLM2 answers the direct questions, and the judge states a number for most
    for method, qid, prediction, score, error, parts in rows:
        if error is not None:  # dropped: no score, never a 0
            assert score is None and ("judge" in error or "environment" in error), (method, qid, error)
        elif parts and "judge_cost_usd" in json.loads(parts):
            assert 0.0 <= score <= 1.0 and json.loads(parts)["judge_prompt_tokens"] > 0
        else:  # a blank answer: 0 without a call, as with every scorer
            assert not prediction.strip() and score == 0.0, (method, qid, prediction)
    assert {m for m, *_ in cells} == {"direct", "agent:base", "agent:trained"} and all(n == 3 for _, n, *_ in cells)
    direct = next(c for c in cells if c[0] == "direct")  # the environment is free: its cost is the judge's
    assert direct[4] == pytest.approx(sum(json.loads(r[5])["judge_cost_usd"] for r in judged if r[0] == "direct"))
    assert direct[4] > 0
    assert cached >= len(judged)  # every verdict is in the reply cache

    # a rerun: every judgement from the reply cache (the same rows, the judge model never asked)
    again = _cli(*evaluate, home=home)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rerun = _rows(home)  # both runs' rows: the second's are the first's
    assert len(rerun) == 2 * len(rows) and set(rerun) == set(rows)
    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM env_cache WHERE model = 'smollm2-135m-instruct'").fetchone()[0] == cached
