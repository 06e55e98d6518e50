"""A mapped CSV or JSONL file that starts with a UTF-8 BOM (Excel's "CSV UTF-8", Windows editors) reads
as the same questions as without it (issue 62 item 10), with either line ending."""

from __future__ import annotations

import csv
import io
import json

import pytest

from prompt_r1.config.experiment import parse_config
from prompt_r1.data.ingest import ingest

ROWS = [{"question": f"Which option is {i}?", "answers": f"A{i}", "split": "train"} for i in range(4)]


def _text(fmt: str, newline: str) -> str:
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(ROWS[0]), lineterminator=newline)
        writer.writeheader()
        writer.writerows(ROWS)
        return out.getvalue()
    return "".join(json.dumps(r) + newline for r in ROWS)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_leading_bom_is_no_part_of_the_first_column(warehouse, tmp_path, fmt, newline) -> None:
    got = {}
    for bom in (False, True):
        path = tmp_path / f"{'bom' if bom else 'plain'}.{fmt}"
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + _text(fmt, newline).encode())
        entry = {"path": str(path), "dataset": f"d{int(bom)}{fmt}", "columns": {"question": "question",
                 "answers": "answers", "split": "split"}}
        (report,) = ingest(warehouse, parse_config({"data": {"sources": [entry]}}).data.sources)
        assert report.inserted == len(ROWS)
        got[bom] = sorted((q.question, tuple(q.golds)) for q in warehouse.questions(datasets=[entry["dataset"]]))
    assert got[True] == got[False]
