"""Ids of rows without an `id` column come from their text, and warehouses keyed the old way
(by line position) are re-keyed with everything that refers to their questions.

The rule restated independently: a row's id depends on its dataset, split, text, and which
repeat of that (dataset, split, text) it is in file order, and on nothing else; a text that
repeats in its file is told apart by its golds too (and the repeat of that text and golds). So an
edited file keeps the id of every key both versions hold, and a row whose key changed form (its
text began or stopped repeating) is re-keyed with everything that refers to it.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import question_id, source_hash

TEXTS = [f"Which city is number {k}?" for k in range(12)]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _record(rng):
    return {"question": rng.choice(TEXTS), "answers": [f"a{rng.randrange(4)}"], "task_family": "standard_qa",
            "dataset": rng.choice(["d1", "d2"])}


def _keys(records):
    """(dataset, text, golds or None, repeat) of each row: the restated rule's key."""
    counts: dict = {}
    for r in records:
        counts[(r["dataset"], r["question"])] = counts.get((r["dataset"], r["question"]), 0) + 1
    seen: dict = {}
    out = []
    for r in records:
        repeats = counts[(r["dataset"], r["question"])] > 1
        k = (r["dataset"], r["question"], tuple(r["answers"]) if repeats else None)
        seen[k] = seen.get(k, -1) + 1
        out.append((*k, seen[k]))
    return out


def _stored_ids(warehouse, path):
    return {q.row_index: q.question_id for q in warehouse.questions() if q.source_file == str(path)}


def test_editing_a_file_changes_only_the_ids_of_rows_edited(warehouse, tmp_path):
    rng = random.Random(3)
    for case in range(20):
        path = tmp_path / f"case{case}.jsonl"
        records = [_record(rng) for _ in range(rng.randint(2, 25))]
        ingest(warehouse, [_jsonl(path, records)])
        stored = _stored_ids(warehouse, path)
        before = {key: stored[i] for i, key in enumerate(_keys(records))}
        edited = list(records)
        for _ in range(rng.randint(1, 4)):  # insert, delete or move a line anywhere
            what = rng.choice(["insert", "delete", "move"])
            if what == "insert" or len(edited) < 2:
                edited.insert(rng.randrange(len(edited) + 1), _record(rng))
            elif what == "delete":
                edited.pop(rng.randrange(len(edited)))
            else:
                edited.insert(rng.randrange(len(edited)), edited.pop(rng.randrange(len(edited))))
        report = ingest(warehouse, [_jsonl(path, edited)])[0]
        ids = _stored_ids(warehouse, path)
        after = {key: ids[i] for i, key in enumerate(_keys(edited))}
        assert all(after[k] == before[k] for k in after.keys() & before.keys()), case
        assert len(set(ids.values())) == len(edited)
        # a key that changed form is one re-keyed question, neither new nor removed
        assert (report.inserted + report.rekeyed, report.removed + report.rekeyed) == (
            len(after.keys() - before.keys()), len(before.keys() - after.keys())), case
        texts = {q.question_id: (q.dataset, q.question) for q in warehouse.questions()}
        renames = warehouse.query("SELECT old_id, new_id FROM question_renames WHERE source_file = ?", [str(path)])
        old_texts = {v: k[:2] for k, v in before.items()}
        assert all(old_texts[old] == texts[new] for old, new in renames if old in old_texts and new in texts)


def test_inserting_a_line_at_the_top_is_one_new_question(warehouse, tmp_path):
    records = [{"question": t, "answers": ["x"], "task_family": "standard_qa"} for t in TEXTS]
    path = _jsonl(tmp_path / "qa.jsonl", records)
    ingest(warehouse, [path])
    before = {q.question: q.question_id for q in warehouse.questions()}
    report = ingest(warehouse, [_jsonl(path, [{**records[0], "question": "A new first line?"}] + records)])[0]
    assert report.describe() == "1 new"
    after = {q.question: q.question_id for q in warehouse.questions()}
    assert {t: after[t] for t in before} == before


def _legacy_warehouse(warehouse, path, records):
    """The warehouse as the earlier positional rule (`<file name>:<row index>`) left it: the
    source's questions, a trajectory, an environment call and a prediction for each."""
    from warehouse.sources import questions_table
    from prompt_r1.core.questions import QuestionRow

    rows = [QuestionRow(question_id=question_id(r["dataset"], "test", f"{path.name}:{i}"), dataset=r["dataset"],
                        split="test", question=r["question"], golds=r["answers"], task_family="standard_qa",
                        primary_metric="f1", row_index=i) for i, r in enumerate(records)]
    warehouse.add_source(str(path), "an earlier format's hash", "d1", questions_table(rows))
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with warehouse.transaction() as cur:
        _refer(cur, rows, now)
    return rows


def _refer(cur, rows, now):
    for i, row in enumerate(rows):
        cur.execute(
            "INSERT INTO trajectories (run_id, step, question_id, group_index, token_ids, loss_mask, agent_turns, "
            "env_replies, answer, reward_format, reward_answer, reward_total, num_turns, stop_reason, created_at) "
            "VALUES ('r', 0, ?, 0, [1], [1], [], [], ?, 1, 1, 1, 1, 'answer', ?)", [row.question_id, f"ans{i}", now])
        cur.execute(
            "INSERT INTO env_calls VALUES ('r', 0, ?, 0, 0, 'env', 'm', 1, 1, 0.1, 1, false, NULL, ?)",
            [row.question_id, now])
        cur.execute(
            "INSERT INTO eval_predictions (run_id, env_name, method, dataset, question_id, prediction, primary_metric, "
            "score, num_turns, env_prompt_tokens, env_completion_tokens, created_at) "
            "VALUES ('e', 'env', 'direct', ?, ?, ?, 'f1', 0.5, 1, 1, 1, ?)",
            [row.dataset, row.question_id, f"pred{i}", now])


def test_a_warehouse_keyed_by_line_position_is_rekeyed_losing_nothing(warehouse, tmp_path):
    rng = random.Random(5)
    for case in range(6):
        path = tmp_path / f"legacy{case}.jsonl"
        records = [_record(rng) for _ in range(rng.randint(3, 20))]  # repeats included
        _jsonl(path, records)
        legacy = _legacy_warehouse(warehouse, path, records)
        old_ids = {row.question_id for row in legacy}

        report = ingest(warehouse, [path])[0]
        assert (report.inserted, report.updated, report.removed, report.rekeyed) == (0, 0, 0, len(records))
        assert "re-keyed" in report.describe()
        new_ids = _stored_ids(warehouse, path)
        assert not old_ids & set(new_ids.values())
        # every row that referred to line i now refers to line i's question under its new id
        for table, value in (("trajectories", "answer"), ("eval_predictions", "prediction")):
            got = dict(warehouse.query(f"SELECT {value}, question_id FROM {table} WHERE question_id IN "
                                       f"(SELECT question_id FROM questions WHERE source_file = ?)", [str(path)]))
            assert got == {f"{'ans' if table == 'trajectories' else 'pred'}{i}": new_ids[i]
                           for i in range(len(records))}, table
        called = [r[0] for r in warehouse.query("SELECT question_id FROM env_calls")]
        assert not old_ids & set(called) and set(new_ids.values()) <= set(called)
        renames = dict(warehouse.query("SELECT old_id, new_id FROM question_renames WHERE source_file = ?",
                                       [str(path)]))
        assert renames == {row.question_id: new_ids[row.row_index] for row in legacy}
        assert ingest(warehouse, [path])[0].skipped
        assert source_hash(path) != "an earlier format's hash"
