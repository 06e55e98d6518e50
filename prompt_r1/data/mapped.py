"""A user's own question file: any Parquet, JSONL or CSV file, with a column mapping in the config.

The benchmark readers (`prompt_r1.data.files`) know two fixed shapes; a user's task (fields to
extract as JSON, a multiple-choice exam) comes in whatever columns its owner wrote. A
`data.sources` entry (`DataSource`) names the file and which of its columns hold the question,
the gold answers and, optionally, the row's id, its split and the metadata its scorer reads;
`read_mapped` turns the file into the same checked question table as every other source
(`rows.build_table`), so it lands in the same warehouse tables with the same rules. A missing
column, an empty question or an unreadable row is an `IngestError` naming the file, the row (the
line, for JSONL and CSV) and the column, raised before anything is written.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from prompt_r1.config.sampling import DataSource
from prompt_r1.core.scorer import resolved_spec
from prompt_r1.core.scorer_code import code_fingerprint
from prompt_r1.data.files import _arrow, _jsonl_read_problem, _parquet_read_problem
from prompt_r1.data.rows import DEFAULT_METRIC, SCORER_METRIC, Columns, IngestError, _not_empty, build_table, split_for

SUFFIXES = (".parquet", ".jsonl", ".csv")


def mapping_text(source: DataSource) -> str:
    """How the file maps to questions, as stable text for its content hash (the scorer's file path
    resolved, so the same entry run from another folder is another source only when it means
    another file, and the hash of its code)."""
    data = source.model_dump(mode="json")
    for key in ("config", "hf_split"):  # the `hf:` keys, unset: left out, so a file's hash does not depend on them
        if data[key] is None:
            del data[key]
    if source.scorer:
        data["scorer"] = resolved_spec(source.scorer)
        # the scorer's code too: a rewritten scorer is a new version of the source (core.scorer_code)
        data["scorer_code"] = code_fingerprint(data["scorer"])
    return json.dumps(data, sort_keys=True)


def source_path(source: DataSource) -> Path:
    return Path(source.path).expanduser().resolve()


def _columns_needed(source: DataSource) -> dict[str, str]:
    """Config key -> column name, for every column the mapping reads."""
    cols = source.columns
    needed = {"question": cols.question, "answers": cols.answers}
    needed |= {key: name for key, name in (("id", cols.id), ("split", cols.split)) if name}
    needed |= {f"metadata[{i}]": name for i, name in enumerate(cols.metadata)}
    return needed


def _missing_column(path: Path, present: list[str], needed: dict[str, str], setting: str) -> None:
    for key, name in needed.items():
        if name not in present:
            raise IngestError(f"{path} row 0 column `{name}`: no such column (its columns: {', '.join(present)}); "
                              f"fix {setting}.columns.{key} or the file")


def _parquet_rows(path: Path, needed: dict[str, str], setting: str) -> tuple[dict[str, list], Callable[[int], str]]:
    try:
        with duckdb.connect() as con:
            present = con.read_parquet(str(path)).columns
    except duckdb.Error as err:
        raise IngestError(f"{path}: not a readable Parquet file ({err})") from None
    _missing_column(path, present, needed, setting)
    select = ", ".join(f'"{name}"' for name in dict.fromkeys(needed.values()))
    try:
        table = _arrow(f"SELECT {select} FROM read_parquet({{path}})", path)
    except duckdb.Error as err:
        raise IngestError(_parquet_read_problem(path, err)) from None
    return {name: table.column(name).to_pylist() for name in dict.fromkeys(needed.values())}, \
        lambda i: f"{path} row {i}"


def _jsonl_rows(path: Path, needed: dict[str, str], setting: str) -> tuple[dict[str, list], Callable[[int], str]]:
    names = list(dict.fromkeys(needed.values()))
    values: dict[str, list] = {name: [] for name in names}
    lines: list[int] = []
    try:
        with path.open(encoding="utf-8-sig") as fh:  # a leading BOM (editors on Windows) is no text
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise IngestError(f"{path} line {number}: expected a JSON object, got {type(record).__name__}")
                for key, name in needed.items():
                    if name not in record and not key.startswith("metadata"):
                        raise IngestError(f"{path} line {number} column `{name}`: no such field in this row; "
                                          f"give every row a `{name}` or fix {setting}.columns.{key}")
                for name in names:
                    values[name].append(record.get(name))
                lines.append(number)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise IngestError(_jsonl_read_problem(path, duckdb.Error("unreadable"))) from None
    return values, lambda i: f"{path} line {lines[i]}"


def _csv_rows(path: Path, needed: dict[str, str], setting: str) -> tuple[dict[str, list], Callable[[int], str]]:
    names = list(dict.fromkeys(needed.values()))
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts with a BOM, which would glue itself to the first header
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh, strict=True)
            header = next(reader, None)
            if header is None:
                raise IngestError(f"{path}: empty file (no header line); nothing was ingested")
            _missing_column(path, header, needed, setting)
            index = {name: header.index(name) for name in names}
            values: dict[str, list] = {name: [] for name in names}
            lines: list[int] = []
            start = reader.line_num + 1
            for row in reader:
                if not any(cell.strip() for cell in row):
                    start = reader.line_num + 1
                    continue
                if len(row) != len(header):
                    raise IngestError(f"{path} line {start}: {len(row)} cells for {len(header)} columns; quote cells "
                                      "that hold the delimiter or a line break")
                for name in names:
                    values[name].append(row[index[name]] if row[index[name]] != "" else None)
                lines.append(start)
                start = reader.line_num + 1
    except UnicodeDecodeError as bad:
        raise IngestError(f"{path}: not UTF-8 text (byte 0x{bad.object[bad.start]:02x} at offset {bad.start}); "
                          "save the file as UTF-8") from None
    except csv.Error as err:
        raise IngestError(f"{path} line {reader.line_num}: not readable as CSV ({err})") from None
    return values, lambda i: f"{path} line {lines[i]}"


READERS = {".parquet": _parquet_rows, ".jsonl": _jsonl_rows, ".csv": _csv_rows}


def _answers(value: Any, separator: str | None) -> Any:
    """A text cell split into several gold answers by `answers_separator`; anything else as it is."""
    if separator and isinstance(value, str):
        return [part.strip() for part in value.split(separator)]
    return value


def read_mapped(source: DataSource, setting: str, max_question_chars: int) -> pa.Table:
    """The checked question table of a user's file (see the module docstring). `setting` names the
    config entry (`data.sources[2]`) in errors."""
    path = source_path(source)
    if not path.is_file():
        raise IngestError(f"{setting}.path: no file {path}")
    if path.suffix not in READERS:
        raise IngestError(f"{path}: unsupported file type `{path.suffix}` (use {', '.join(SUFFIXES)})")
    needed = _columns_needed(source)
    values, where = READERS[path.suffix](path, needed, setting)
    cols = source.columns
    questions = values[cols.question]
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise IngestError(f"{where(i)} column `{cols.question}`: empty or missing question text "
                              f"({'not text: ' + type(q).__name__ if q is not None and not isinstance(q, str) else 'empty'}); "
                              "fill it or drop the row")
    split = source.split or split_for(path)
    splits = [s if s is not None else split for s in values[cols.split]] if cols.split else split
    if cols.split:
        bad = next((i for i, s in enumerate(splits) if not isinstance(s, str)), None)
        if bad is not None:
            raise IngestError(f"{where(bad)} column `{cols.split}`: split must be train, test or ood")
    metadata = None
    if cols.metadata:
        metadata = [{name: values[name][i] for name in cols.metadata} for i in range(len(questions))]
    ids = values[cols.id] if cols.id else None
    scorer = resolved_spec(source.scorer) if source.scorer else None
    table_cols = Columns(
        questions, [_answers(v, source.answers_separator) for v in values[cols.answers]],
        source.dataset or path.stem, splits, source.task_family,
        SCORER_METRIC if scorer else (source.primary_metric or DEFAULT_METRIC.get(source.task_family, "f1")),
        None if ids is None else [None if v is None else str(v) for v in ids], path.name, f"`{cols.answers}`",
        metadata=metadata, scorer=scorer)
    return build_table(_not_empty(table_cols, path), where, max_question_chars)
