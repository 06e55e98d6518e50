"""A row that repeats a stored text, inserted anywhere in its file, is a question of its own (issue 62
item 11): every stored question keeps its golds, and whatever referred to it still refers to a
question with its text and golds."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import pytest

from prompt_r1.data.ingest import ingest

TEXTS = ["Which planet is largest?", "Which metal is liquid?", "Who wrote Hamlet?"]


def _write(path, rows):
    path.write_text("".join(json.dumps({"question": q, "answers": golds, "task_family": "standard_qa"}) + "\n"
                            for q, golds in rows))
    return path


def _refer(warehouse, ids):
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with warehouse.transaction() as cur:
        for qid in ids:
            cur.execute(
                "INSERT INTO trajectories (run_id, step, question_id, group_index, token_ids, loss_mask, agent_turns, "
                "env_replies, answer, reward_format, reward_answer, reward_total, num_turns, stop_reason, created_at) "
                "VALUES ('r', 0, ?, 0, [1], [1], [], [], ?, 1, 1, 1, 1, 'answer', ?)", [qid, qid, now])


@pytest.mark.parametrize("seed", range(8))
def test_an_inserted_twin_never_takes_a_stored_questions_id_or_golds(warehouse, tmp_path, seed) -> None:
    rng = random.Random(seed)
    rows = [(rng.choice(TEXTS), [f"g{rng.randrange(3)}"]) for _ in range(rng.randint(1, 6))]
    path = _write(tmp_path / "qa.jsonl", rows)
    ingest(warehouse, [path])
    stored = {q.question_id: (q.question, q.golds) for q in warehouse.questions()}
    _refer(warehouse, stored)  # a trajectory on every stored question, its `answer` naming the id it was made on
    edited = list(rows)
    for _ in range(rng.randint(1, 3)):  # twins of stored texts with other golds, inserted anywhere
        text = rng.choice([q for q, _ in rows])
        edited.insert(rng.randrange(len(edited) + 1), (text, [f"other{rng.randrange(99)}"]))
    report = ingest(warehouse, [_write(path, edited)])[0]
    assert report.updated == 0 and report.removed == 0, report.describe()
    now = {q.question_id: (q.question, q.golds) for q in warehouse.questions()}
    assert sorted(now.values()) == sorted((q, g) for q, g in edited)
    for made_on, qid in warehouse.query("SELECT answer, question_id FROM trajectories"):
        assert now[qid] == stored[made_on]  # the trajectory's question: its text and its golds
