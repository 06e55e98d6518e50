"""A write the disk refuses (issue 62 item 15: full, or a file-size limit) is one `WarehouseError` naming
the warehouse and its free space, whichever write it hits, and nothing of that write is kept."""

from __future__ import annotations

import duckdb
import pytest

from prompt_r1.core.questions import QuestionRow
from warehouse import sources as warehouse_sources
from warehouse.store import WarehouseError

ERRORS = [duckdb.IOException('Could not write file "w.duckdb.wal": No space left on device'),
          duckdb.TransactionException("Failed to commit: Could not write file: File too large"),
          duckdb.IOException("Could not truncate file: Disk quota exceeded")]


def _rows(n: int, tag: str) -> list[QuestionRow]:
    return [QuestionRow(f"{tag}{i}", "d", "test", f"q {tag}{i}?", ["a"], "standard_qa", "f1") for i in range(n)]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("where", ["inside", "ingest"])
def test_a_refused_write_is_one_error_and_keeps_nothing(warehouse, monkeypatch, error, where) -> None:
    warehouse.add_source("first.jsonl", "h1", "d", _rows(3, "a"))
    before = warehouse.table_counts()
    if where == "inside":
        with pytest.raises(WarehouseError, match=r"writing to warehouse .* failed \(.*(MiB free|unknown)"):
            with warehouse.transaction() as cur:
                cur.execute("DELETE FROM questions")
                raise error
    else:  # the ingest's own writes, failing half-way
        def full(cur, source_file, now):
            cur.execute("DELETE FROM questions")
            raise error
        monkeypatch.setattr(warehouse_sources, "rekey_questions", full)
        with pytest.raises(WarehouseError, match="Nothing of this write was kept"):
            warehouse.add_source("second.jsonl", "h2", "d", _rows(2, "b"), rekey=True)
        monkeypatch.undo()
    assert warehouse.table_counts() == before
    assert len(warehouse.questions()) == 3


def test_other_errors_keep_their_type(warehouse) -> None:
    with pytest.raises(KeyError):
        with warehouse.transaction():
            raise KeyError("a bug")
    with pytest.raises(duckdb.CatalogException):
        with warehouse.transaction() as cur:
            cur.execute("SELECT * FROM no_such_table")
