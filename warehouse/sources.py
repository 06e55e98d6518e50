"""How one source's questions are written: the Arrow columns they arrive in, what counts as a
changed question, and the re-keying of questions stored under ids their source no longer gives.

`Warehouse.add_source` opens the transaction and calls `write_source`; the source is the truth
about its rows (new ones inserted, changed ones updated in place, missing ones removed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from prompt_r1.core.questions import QuestionRow

# Columns of the Arrow table a source's questions arrive in (`add_source`), in table order.
QUESTION_COLUMNS = pa.schema([
    ("question_id", pa.string()), ("dataset", pa.string()), ("split", pa.string()),
    ("question", pa.string()), ("golds", pa.list_(pa.string())), ("task_family", pa.string()),
    ("primary_metric", pa.string()), ("row_index", pa.int64()),
    ("metadata", pa.string()), ("scorer", pa.string()),  # JSON object or null; import path or null
])
# A question counts as updated when one of these differs from the stored row (a row that only
# moved in its file is rewritten, not counted).
_CONTENT = ("dataset", "split", "question", "golds", "task_family", "primary_metric", "metadata", "scorer")
# Tables that refer to questions by id: a re-keyed question's rows follow it.
_QUESTION_REFS = ("trajectories", "env_calls", "eval_predictions")


def questions_table(rows: Iterable[QuestionRow]) -> pa.Table:
    """QuestionRows as the Arrow table `add_source` takes."""
    rows = list(rows)
    cells = {name: [getattr(r, name) for r in rows] for name in QUESTION_COLUMNS.names}
    cells["metadata"] = [None if m is None else json.dumps(m, sort_keys=True, default=str) for m in cells["metadata"]]
    return pa.table(cells, schema=QUESTION_COLUMNS)


@dataclass(frozen=True)
class SourceCounts:
    """What writing one source changed: questions new, changed in place, dropped (gone from the
    source), and present already with the same content."""

    inserted: int
    updated: int
    removed: int
    unchanged: int
    rekeyed: int = 0  # stored under another id before (an earlier row-key rule), found by their text


def write_source(cur: duckdb.DuckDBPyConnection, source_file: str, content_hash: str, dataset: str,
                 table: pa.Table, rekey: bool, now: datetime) -> SourceCounts:
    """`table`'s questions as `source_file`'s, in the open transaction `cur` (`Warehouse.add_source`)."""
    table = table.select(QUESTION_COLUMNS.names).cast(QUESTION_COLUMNS)
    changed = " OR ".join(f"i.{c} IS DISTINCT FROM q.{c}" for c in _CONTENT)
    cur.register("incoming", table)
    try:
        rekeyed = rekey_questions(cur, source_file, now) if rekey else 0
        inserted, updated = cur.execute(
            f"SELECT count(*) FILTER (WHERE q.question_id IS NULL), "
            f"count(*) FILTER (WHERE q.question_id IS NOT NULL AND ({changed})) "
            "FROM incoming i LEFT JOIN questions q USING (question_id)").fetchone()
        # Only changed rows are rewritten (an upsert of every row costs ~10x on 100k rows).
        cur.execute(
            "UPDATE questions q SET " + ", ".join(f"{c} = i.{c}" for c in _CONTENT)
            + f", row_index = i.row_index, ingested_at = ? FROM incoming i WHERE q.question_id = i.question_id "
            f"AND ({changed} OR i.row_index IS DISTINCT FROM q.row_index)", [now])
        cur.execute(
            "UPDATE questions q SET source_file = ?, source_hash = ? FROM incoming i "
            "WHERE q.question_id = i.question_id", [source_file, content_hash])
        cur.execute(
            "INSERT INTO questions (question_id, dataset, split, question, golds, task_family, primary_metric, "
            "source_file, source_hash, row_index, ingested_at, metadata, scorer) "
            "SELECT question_id, dataset, split, question, golds, task_family, "
            "primary_metric, ?, ?, row_index, ?, metadata, scorer FROM incoming i "
            "ANTI JOIN questions q USING (question_id)",
            [source_file, content_hash, now])
        removed = cur.execute(
            "DELETE FROM questions WHERE source_file = ? AND question_id NOT IN "
            "(SELECT question_id FROM incoming)", [source_file]).fetchone()[0]
    finally:
        cur.unregister("incoming")
    cur.execute("DELETE FROM sources WHERE source_file = ?", [source_file])
    cur.execute("INSERT INTO sources VALUES (?,?,?,?,?)",
                [source_file, content_hash, dataset, table.num_rows, now])
    return SourceCounts(inserted - rekeyed, updated, removed - rekeyed, table.num_rows - inserted - updated, rekeyed)


def rekey_questions(cur: duckdb.DuckDBPyConnection, source_file: str, now: datetime) -> int:
    """Point the rows that refer to `source_file`'s questions stored under ids `incoming` no
    longer has at the ids `incoming` gives the same (dataset, split, text, golds, repeat), else
    the same (dataset, split, text, repeat); returns
    how many questions were re-keyed. The stored questions themselves are then replaced by
    `add_source`'s insert and removal, like any other change."""
    # by (dataset, split, text, golds, repeat) first: a twin inserted above a stored row is not it;
    # then the rest by (dataset, split, text, repeat): a repeated text whose golds were corrected
    cur.execute(
        "CREATE OR REPLACE TEMP TABLE renames AS "
        "WITH stored AS (SELECT question_id AS old_id, dataset, split, question, golds, row_index FROM questions "
        "  WHERE source_file = ? AND question_id NOT IN (SELECT question_id FROM incoming)), "
        "fresh AS (SELECT question_id AS new_id, dataset, split, question, golds, row_index FROM incoming "
        "  WHERE question_id NOT IN (SELECT question_id FROM questions)), "
        "s1 AS (SELECT old_id, dataset, split, question, golds, ROW_NUMBER() OVER "
        "  (PARTITION BY dataset, split, question, golds ORDER BY row_index, old_id) AS n FROM stored), "
        "f1 AS (SELECT new_id, dataset, split, question, golds, ROW_NUMBER() OVER "
        "  (PARTITION BY dataset, split, question, golds ORDER BY row_index) AS n FROM fresh), "
        "by_golds AS (SELECT old_id, new_id FROM s1 JOIN f1 USING (dataset, split, question, golds, n)), "
        "s2 AS (SELECT old_id, dataset, split, question, ROW_NUMBER() OVER "
        "  (PARTITION BY dataset, split, question ORDER BY row_index, old_id) AS n FROM stored "
        "  WHERE old_id NOT IN (SELECT old_id FROM by_golds)), "
        "f2 AS (SELECT new_id, dataset, split, question, ROW_NUMBER() OVER "
        "  (PARTITION BY dataset, split, question ORDER BY row_index) AS n FROM fresh "
        "  WHERE new_id NOT IN (SELECT new_id FROM by_golds)) "
        "SELECT old_id, new_id FROM by_golds UNION ALL "
        "SELECT old_id, new_id FROM s2 JOIN f2 USING (dataset, split, question, n)", [source_file])
    count = cur.execute("SELECT count(*) FROM renames").fetchone()[0]
    if count:
        for ref in _QUESTION_REFS:
            cur.execute(f"UPDATE {ref} t SET question_id = r.new_id FROM renames r WHERE t.question_id = r.old_id")
        cur.execute("INSERT OR REPLACE INTO question_renames SELECT old_id, new_id, ?, ? FROM renames",
                    [source_file, now])
    cur.execute("DROP TABLE renames")
    return count
