"""A user's own Parquet / JSONL / CSV file through a column mapping, into a real DuckDB warehouse."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import random

from prompt_r1.config.experiment import parse_config
from prompt_r1.config.sampling import DataSource
from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import IngestError, question_id
from warehouse.store import Warehouse

ROWS = [
    {"qid": "a1", "q": "Which option is a fruit? A) bolt B) pear", "gold": "B", "level": "easy", "split": "train"},
    {"qid": "a2", "q": "Which option is a metal? A) iron B) silk", "gold": "A", "level": "hard", "split": "train"},
    {"qid": "a3", "q": "Which option swims? A) trout B) oak", "gold": "A|trout", "level": "easy", "split": "test"},
]
MAPPING = {"dataset": "exam", "columns": {"question": "q", "answers": "gold", "id": "qid", "split": "split",
                                          "metadata": ["level"]},
           "answers_separator": "|", "scorer": "prompt_r1.core.metrics:exact_match"}


def write(path, rows, fmt: str) -> str:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def source(path: str, **changes) -> DataSource:
    return DataSource.model_validate({**MAPPING, "path": path, **changes})


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_each_format_lands_as_the_same_questions(warehouse, tmp_path, fmt) -> None:
    path = write(tmp_path / f"exam.{fmt}", ROWS, fmt)
    (report,) = ingest(warehouse, [source(path)])
    assert report.inserted == 3 and report.dataset == "exam"
    got = {q.question_id: q for q in warehouse.questions(datasets=["exam"])}
    assert set(got) == {question_id("exam", r["split"], f"id:{r['qid']}") for r in ROWS}
    by_text = {q.question: q for q in got.values()}
    swim = by_text[ROWS[2]["q"]]
    assert swim.golds == ["A", "trout"] and swim.split == "test" and swim.metadata == {"level": "easy"}
    assert swim.scorer == "prompt_r1.core.metrics:exact_match" and swim.primary_metric == "scorer"
    assert swim.task_family == "custom"
    assert ingest(warehouse, [source(path)])[0].skipped  # unchanged file and mapping: a no-op


def test_a_file_scorer_is_stored_resolved_and_a_changed_mapping_updates_in_place(warehouse, tmp_path,
                                                                                 monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "judge.py").write_text("def score(p, golds, meta):\n    return 1.0\n")
    path = write(tmp_path / "exam.jsonl", ROWS, "jsonl")
    ingest(warehouse, [source(path, scorer="judge.py:score")])  # relative: read from the working directory
    assert {q.scorer for q in warehouse.questions()} == {f"{tmp_path / 'judge.py'}:score"}
    ids = sorted(q.question_id for q in warehouse.questions())
    (report,) = ingest(warehouse, [source(path, scorer=None, primary_metric="em")])
    assert report.updated == 3 and report.inserted == 0
    assert sorted(q.question_id for q in warehouse.questions()) == ids
    assert {(q.scorer, q.primary_metric) for q in warehouse.questions()} == {(None, "em")}


BAD = [
    ("jsonl", lambda rows: [{k: v for k, v in r.items() if k != "q"} if i == 1 else r for i, r in enumerate(rows)],
     ["line 2", "column `q`", "no such field"]),
    ("jsonl", lambda rows: [{**r, "q": "  "} if i == 2 else r for i, r in enumerate(rows)],
     ["line 3", "column `q`", "empty or missing question"]),
    ("csv", lambda rows: [{**r, "q": ""} if i == 0 else r for i, r in enumerate(rows)],
     ["line 2", "column `q`", "empty or missing question"]),
    ("parquet", lambda rows: [{k: v for k, v in r.items() if k != "gold"} for r in rows],
     ["row 0", "column `gold`", "no such column", "columns.answers"]),
    ("csv", lambda rows: [{k: v for k, v in r.items() if k != "level"} for r in rows],
     ["row 0", "column `level`", "columns.metadata[0]"]),
    ("jsonl", lambda rows: [{**r, "split": "dev"} if i == 1 else r for i, r in enumerate(rows)],
     ["line 2", "split 'dev'"]),
    ("jsonl", lambda rows: [{**r, "gold": " "} if i == 1 else r for i, r in enumerate(rows)],
     ["line 2", "`gold`", "no gold answer"]),
]


@pytest.mark.parametrize("fmt, spoil, words", BAD)
def test_a_bad_row_names_file_row_and_column_and_loses_nothing(warehouse, tmp_path, fmt, spoil, words) -> None:
    good = write(tmp_path / f"good.{fmt}", ROWS, fmt)
    ingest(warehouse, [source(good, dataset="kept")])
    before = warehouse.query("SELECT * FROM questions ORDER BY question_id")
    path = write(tmp_path / f"exam.{fmt}", spoil(ROWS), fmt)
    with pytest.raises(IngestError) as err:
        ingest(warehouse, [source(path)])
    assert str(tmp_path / f"exam.{fmt}") in str(err.value)
    for word in words:
        assert word in str(err.value)
    assert warehouse.query("SELECT * FROM questions ORDER BY question_id") == before


@pytest.mark.parametrize("text, words", [
    (b'{"qid": "a1", "q": "x?", "gold": "y", "level": 1, "split": "test"}\n{"qid": "a2", "q": \n', ["line 2", "not valid JSON"]),
    (b'{"qid": "a1", "q": "caf\xe9?", "gold": "y", "level": 1, "split": "test"}\n', ["line 1", "not UTF-8"]),
])
def test_an_unreadable_jsonl_line_is_named(warehouse, tmp_path, text, words) -> None:
    (tmp_path / "exam.jsonl").write_bytes(text)
    with pytest.raises(IngestError) as err:
        ingest(warehouse, [source(str(tmp_path / "exam.jsonl"))])
    assert all(w in str(err.value) for w in words)
    assert warehouse.table_counts()["questions"] == 0


def test_a_csv_row_with_too_many_cells_is_named(warehouse, tmp_path) -> None:
    (tmp_path / "exam.csv").write_text("qid,q,gold,level,split\na1,x?,y,easy,test\na2,x, y?,y,easy,test\n")
    with pytest.raises(IngestError, match=r"exam.csv line 3: 6 cells for 5 columns"):
        ingest(warehouse, [source(str(tmp_path / "exam.csv"))])


def test_a_scorer_that_cannot_be_imported_fails_at_ingest(warehouse, tmp_path) -> None:
    path = write(tmp_path / "exam.jsonl", ROWS, "jsonl")
    with pytest.raises(IngestError) as err:
        ingest(warehouse, [source(path, scorer="no_such_pkg.judge:score")])
    assert "data.sources[0].scorer" in str(err.value) and "no_such_pkg.judge:score" in str(err.value)
    assert warehouse.table_counts()["questions"] == 0


def test_the_config_takes_a_mapping_beside_plain_sources_and_keeps_old_hashes() -> None:
    plain = parse_config({"data": {"sources": ["data/sample"]}})
    assert plain.hash() == parse_config({}).hash()
    mixed = parse_config({"data": {"sources": ["data/sample", {**MAPPING, "path": "exam.csv"}]}})
    assert isinstance(mixed.data.sources[1], DataSource) and mixed.data.sources[1].columns.metadata == ["level"]
    with pytest.raises(ValueError, match="both set"):
        parse_config({"data": {"sources": [{**MAPPING, "path": "x.csv", "primary_metric": "em"}]}})


ALPHABET = "ab ,\"'|;\té€\u2028{}[]\\"  # delimiters, quotes, escapes, non-ASCII, a Unicode line separator


def _text(rng: random.Random) -> str:
    while True:
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 16)))
        if text.strip() and text.replace("|", "").strip():
            return text


def test_jsonl_and_csv_give_the_same_rows_as_written(tmp_path) -> None:
    """Seeded random files (a hand-rolled property test) against an independent restatement: every
    row's stripped text, its golds split at the separator, its split."""
    rng = random.Random(47)
    for case in range(20):
        data = []
        for i in range(rng.randrange(1, 7)):
            golds = [_text(rng).replace("|", "/") for _ in range(rng.randrange(1, 4))]
            data.append({"qid": f"r{i}", "q": _text(rng), "gold": "|".join(golds), "level": "x",
                         "split": rng.choice(["train", "test"])})
        expected = {(r["qid"], r["q"].strip(), tuple(p.strip() for p in r["gold"].split("|")), r["split"])
                    for r in data}
        for fmt in ("jsonl", "csv"):
            with Warehouse(tmp_path / f"{fmt}-{case}.duckdb") as wh:
                ingest(wh, [source(write(tmp_path / f"exam-{case}.{fmt}", data, fmt))])
                by_id = {q.question_id: q for q in wh.questions()}
                got = {(qid, by_id[question_id("exam", split, f"id:{qid}")].question,
                        tuple(by_id[question_id("exam", split, f"id:{qid}")].golds), split)
                       for qid, _, _, split in expected}
                assert got == expected, (fmt, data)
