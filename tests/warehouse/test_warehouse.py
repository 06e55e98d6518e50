"""Warehouse module: transactions, per-step replacement, cache, eval rows, source upserts, and
the file lock (read-only readers, bounded waits, errors naming the holder)."""

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from prompt_r1.core.questions import QuestionRow
from warehouse.sources import SourceCounts
from warehouse.store import Warehouse, WarehouseError, WarehouseLockedError

ROOT = Path(__file__).resolve().parents[2]


def _traj(qid, g, total=0.5):
    return {"question_id": qid, "group_index": g, "token_ids": [1, 2, 3], "loss_mask": [1, 0, 1],
            "agent_turns": ["a"], "env_replies": [], "answer": "x", "stop_reason": "answered",
            "reward": {"format": 1.0, "answer": total, "total": total}}


@pytest.mark.parametrize("seed", range(5))
def test_step_rewards_against_a_restatement(warehouse, seed):
    """Per step and environment: every trajectory counted, failures counted and left out of the
    means; another run's rows never mixed in."""
    import random

    rng = random.Random(seed)
    kept = []
    for run in ("run", "other"):
        for step in range(rng.randint(1, 4)):
            trajs = []
            for g in range(rng.randint(1, 12)):
                t = {**_traj(f"q{g}", g, round(rng.uniform(-1, 1), 3)), "env_name": rng.choice(["a", "b"])}
                if rng.random() < 0.2:
                    t = {**t, "reward": None, "error": "timeout", "stop_reason": "env_error"}
                trajs.append(t)
            warehouse.replace_step(run, step, trajs, [])
            kept += [(run, step, t) for t in trajs]
    expected = []
    for step, env in sorted({(s, t["env_name"]) for r, s, t in kept if r == "run"}):
        mine = [t for r, s, t in kept if r == "run" and s == step and t["env_name"] == env]
        scored = [t["reward"] for t in mine if t["reward"]]
        mean = (lambda key: sum(x[key] for x in scored) / len(scored) if scored else None)
        expected.append((step, env, len(mine), len(mine) - len(scored), mean("total"), mean("answer")))
    got = warehouse.step_rewards("run")
    assert [(r["step"], r["env_name"], r["trajectories"], r["errors"]) for r in got] == [e[:4] for e in expected]
    for row, (*_, total, answer) in zip(got, expected):
        assert row["reward_mean"] == pytest.approx(total) and row["answer_mean"] == pytest.approx(answer)


def test_transaction_rolls_back(warehouse):
    with pytest.raises(RuntimeError):
        with warehouse.transaction() as cur:
            cur.execute("INSERT INTO sources VALUES ('f', 'h', 'd', 0, now())")
            raise RuntimeError("boom")
    assert warehouse.table_counts()["sources"] == 0


def test_replace_step_is_idempotent(warehouse):
    call = {"question_id": "q", "group_index": 0, "turn": 0, "env_name": "e", "model": "m",
            "prompt_tokens": 3, "completion_tokens": 4, "latency_s": 0.1, "attempts": 1,
            "cached": False, "error": None}
    for _ in range(2):
        warehouse.replace_step("run", 0, [_traj("q", 0), _traj("q", 1)], [call])
    warehouse.replace_step("run", 1, [_traj("q", 0)], [])
    counts = warehouse.table_counts()
    assert counts["trajectories"] == 3 and counts["env_calls"] == 1
    assert warehouse.steps_recorded("run") == [0, 1]
    warehouse.delete_steps_after("run", 0)
    assert warehouse.steps_recorded("run") == [0]


def test_cache_and_questions(warehouse):
    assert warehouse.cache_get("k") is None
    warehouse.cache_put("k", "m", "reply", 5, 6)
    warehouse.cache_put("k", "m", "other", 1, 1)  # first write wins
    assert warehouse.cache_get("k") == ("reply", 5, 6)
    rows = [QuestionRow(f"id{i}", "ds", "test", f"q{i}", ["a"], "math", "em", row_index=i) for i in range(5)]
    warehouse.add_source("f", "hash", "ds", rows)
    assert [q.question_id for q in warehouse.questions(limit_per_dataset=2)] == ["id0", "id1"]


def test_add_source_upserts_in_place_and_drops_gone_rows(warehouse):
    rows = [QuestionRow(f"id{i}", "ds", "test", f"q{i}", ["a"], "math", "em", row_index=i) for i in range(5)]
    assert warehouse.add_source("f", "h1", "ds", rows) == SourceCounts(5, 0, 0, 0)
    fixed = rows[:3]
    fixed[1] = QuestionRow("id1", "ds", "test", "q1", ["b"], "math", "em", row_index=1)
    assert warehouse.add_source("f", "h2", "ds", fixed) == SourceCounts(0, 1, 2, 2)
    assert [q.golds for q in warehouse.questions()] == [["a"], ["b"], ["a"]]
    assert warehouse.query("SELECT content_hash FROM sources") == [("h2",)]


HOLD = """import sys, time
from warehouse.store import Warehouse
with Warehouse(sys.argv[1], read_only=sys.argv[2] == "ro"):
    print("holding", flush=True)
    time.sleep(float(sys.argv[3]))
"""


@contextmanager
def holder(path, mode, seconds):
    """Another process holding the warehouse (read-only or writing) for `seconds`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode, str(seconds)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "holding"  # the child exits (EOF) if it cannot open
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_second_writer_waits_bounded_then_names_the_holder(home):
    path = home / "locked.duckdb"
    Warehouse(path).close()
    with holder(path, "rw", 60) as proc:
        start = time.monotonic()
        with pytest.raises(WarehouseLockedError) as err:
            Warehouse(path, wait_s=1.0)
        assert 0.9 < time.monotonic() - start < 10
        assert f"PID {proc.pid}" in str(err.value) and str(path) in str(err.value)
        assert isinstance(err.value, WarehouseError)


def test_writer_gets_the_file_once_the_holder_finishes(home):
    path = home / "busy.duckdb"
    Warehouse(path).close()
    with holder(path, "rw", 1.5):
        start = time.monotonic()
        with Warehouse(path, wait_s=30) as wh:
            assert wh.table_counts()["questions"] == 0
        assert time.monotonic() - start > 0.3


def test_cli_summary_reads_only_and_second_writer_exits_2(home):
    exe = [sys.executable, "-m", "prompt_r1.cli"]
    db = home / "warehouse.duckdb"
    assert subprocess.run(exe + ["ingest", "data/sample"], capture_output=True, text=True, cwd=ROOT).returncode == 0
    with holder(db, "ro", 60):  # a reader elsewhere: summary (a reader too) still works
        out = subprocess.run(exe + ["summary", "--lock-wait", "5"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "'questions': 40" in out.stdout
    with holder(db, "rw", 60) as proc:
        out = subprocess.run(exe + ["ingest", "data/sample", "--lock-wait", "1"], capture_output=True,
                             text=True, cwd=ROOT)
        assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
        assert f"PID {proc.pid}" in out.stdout and "in use by" in out.stdout


def test_summary_of_missing_warehouse_is_a_clear_error(home):
    out = subprocess.run([sys.executable, "-m", "prompt_r1.cli", "summary"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "no warehouse at" in out.stdout
    assert not (home / "warehouse.duckdb").exists()  # a reader creates nothing
