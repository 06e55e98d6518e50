"""Warehouse module: transactions, per-step replacement, cache, eval rows, locked-file errors."""

import pytest

from warehouse.store import QuestionRow, Warehouse, WarehouseError


def _traj(qid, g, total=0.5):
    return {"question_id": qid, "group_index": g, "token_ids": [1, 2, 3], "loss_mask": [1, 0, 1],
            "agent_turns": ["a"], "env_replies": [], "answer": "x", "stop_reason": "answered",
            "reward": {"format": 1.0, "answer": total, "total": total}}


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


def test_second_process_gets_clear_error(home):
    import subprocess
    import sys

    path = home / "locked.duckdb"
    with Warehouse(path):
        code = f"from warehouse.store import Warehouse; Warehouse({str(path)!r})"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "cannot open warehouse" in out.stderr and str(path) in out.stderr
    assert WarehouseError.__name__ in out.stderr
