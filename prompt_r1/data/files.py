"""Reading Parquet (Prompt-R1 / verl RL layout) and JSONL files in bulk for `prompt_r1.data.ingest`.

DuckDB parses the file and hands back Arrow columns; `build_table` then checks every row. When
DuckDB cannot read a file at all (text that is not UTF-8, a line that is not JSON), a slower
pass runs on that failure only, to name the row or line, so a bad file never costs the good ones.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import pyarrow as pa

from prompt_r1.data.rows import (
    DEFAULT_METRIC, ID_COLUMN, MAX_QUESTION_CHARS, PROMPT_R1_FILES, QUESTION_ROLE, Columns, IngestError,
    _not_empty, build_table, split_for,
)
from prompt_r1.core.protocol import split_question

log = logging.getLogger(__name__)


@functools.cache
def _reader() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB for reading files (opening one costs ~50 ms; callers take a cursor)."""
    return duckdb.connect()


def _arrow(sql: str, path: Path) -> pa.Table:
    """Run `sql` with `{path}` bound to the file, as an Arrow table (a quoted literal: a bound
    parameter makes DuckDB re-plan the file scan, twice as slow here)."""
    literal = "'" + str(path).replace("'", "''") + "'"
    with _reader().cursor() as cur:
        return cur.sql(sql.replace("{path}", literal)).to_arrow_table()


def _struct_fields(dtype: duckdb.typing.DuckDBPyType) -> dict[str, duckdb.typing.DuckDBPyType]:
    return dict(dtype.children) if dtype.id == "struct" else {}


def _parquet_columns(path: Path) -> Columns:
    try:
        with _reader().cursor() as cur:
            rel = cur.read_parquet(str(path))
            types = dict(zip(rel.columns, rel.types))
    except duckdb.Error as err:
        raise IngestError(f"{path}: not a readable Prompt-R1 Parquet file ({err})") from None
    layout = "(verl RL layout: see the Prompt-R1 data README)"
    prompt = types.get("prompt")
    if prompt is None or prompt.id != "list" or "content" not in _struct_fields(dict(prompt.children)["child"]):
        raise IngestError(f"{path} row 0 field prompt: expected a list of {{content, role}} messages {layout}, "
                          f"but the column is {prompt or 'missing'} in every row")
    reward = types.get("reward_model")
    if reward is None or "ground_truth" not in _struct_fields(reward):
        raise IngestError(f"{path} row 0 field reward_model: expected a struct with a `ground_truth` list of "
                          f"gold answers {layout}, but the column is {reward or 'missing'} in every row")
    id_sql = f", {ID_COLUMN}::VARCHAR AS id" if ID_COLUMN in types else ""
    if "role" in _struct_fields(dict(prompt.children)["child"]):  # the question: see QUESTION_ROLE
        turn_sql = (f"list_last(list_filter(prompt, lambda m: m.role = '{QUESTION_ROLE}')).content AS content, "
                    "list_transform(prompt, lambda m: m.role) AS roles")
    else:
        turn_sql = "CASE WHEN len(prompt) = 1 THEN prompt[1].content END AS content, NULL AS roles"
    try:
        table = _arrow(f"SELECT {turn_sql}, reward_model.ground_truth AS golds{id_sql} "
                       "FROM read_parquet({path})", path)
    except duckdb.Error as err:
        raise IngestError(_parquet_read_problem(path, err)) from None
    system = sum(1 for roles in table.column("roles").to_pylist() if roles and "system" in roles)
    if system:
        log.warning("%s: %d of %d rows start with a system message; it is not part of the question (the "
                    "question is the last `%s` message; see prompt_r1.data.rows.QUESTION_ROLE)",
                    path, system, table.num_rows, QUESTION_ROLE)
    family, metric = PROMPT_R1_FILES[path.stem]
    return Columns(table.column("content").to_pylist(), table.column("golds").to_pylist(), path.stem,
                   split_for(path), family, metric,
                   table.column("id").to_pylist() if id_sql else None, path.name, "reward_model.ground_truth")


def _parquet_read_problem(path: Path, err: duckdb.Error) -> str:
    """Name the row DuckDB could not read (text that is not UTF-8); runs only after a failure."""
    import pyarrow.parquet as pq

    try:
        for start, batch in _batches(pq.ParquetFile(path)):
            try:
                batch.to_pylist()
                continue
            except UnicodeDecodeError:
                pass
            for i in range(batch.num_rows):
                for name in batch.schema.names:
                    try:
                        batch.column(name).slice(i, 1).to_pylist()
                    except UnicodeDecodeError as bad:
                        return (f"{path} row {start + i} field {name}: text is not UTF-8 ({bad.reason} at "
                                f"byte {bad.start}); re-encode the file's strings as UTF-8")
    except Exception:  # the diagnosis is best effort; DuckDB's own message follows
        pass
    return f"{path}: not a readable Prompt-R1 Parquet file ({err})"


def _batches(pf) -> Iterable[tuple[int, pa.RecordBatch]]:
    start = 0
    for batch in pf.iter_batches(batch_size=4096):
        yield start, batch
        start += batch.num_rows


def read_parquet(path: Path, max_question_chars: int = MAX_QUESTION_CHARS) -> pa.Table:
    """Questions of a Prompt-R1 (verl RL layout) Parquet file."""
    if path.stem not in PROMPT_R1_FILES:
        raise IngestError(
            f"{path}: unknown Prompt-R1 file name; expected one of {', '.join(PROMPT_R1_FILES)} "
            "(or convert it to JSONL with question/answers/task_family fields)"
        )
    cols = _parquet_columns(path)
    where = lambda i: f"{path} row {i}"  # noqa: E731
    for i, content in enumerate(cols.questions):
        if not isinstance(content, str) or not content:
            raise IngestError(f"{where(i)}: field `prompt` has no `{QUESTION_ROLE}` message with content (the "
                              "question is the last message whose role is user; a list without roles must "
                              "hold exactly one message)")
    cols.questions = [split_question(c) for c in cols.questions]
    return build_table(_not_empty(cols, path), where, max_question_chars)


# JSONL: DuckDB parses each line; the SQL below checks each record's shape and names the first
# problem of each row, so the Python pass only sees well-typed values.
_SCALAR = "'VARCHAR', 'BIGINT', 'UBIGINT', 'DOUBLE'"
_JSONL_SQL = f"""
SELECT j->>'$.question' AS question,
       CASE json_type(j, '$.answers') WHEN 'ARRAY' THEN json_extract_string(j, '$.answers[*]')
            ELSE [j->>'$.answers'] END AS golds,
       j->>'$.dataset' AS dataset, j->>'$.split' AS split, j->>'$.task_family' AS task_family,
       j->>'$.primary_metric' AS primary_metric, j->>'$.{ID_COLUMN}' AS id,
       CASE
         WHEN json_type(j) <> 'OBJECT' THEN 'expected a JSON object, got ' || lower(json_type(j))
         WHEN json_type(j, '$.question') IS NULL THEN 'missing field `question`'
         WHEN json_type(j, '$.answers') IS NULL THEN 'missing field `answers`'
         WHEN json_type(j, '$.task_family') IS NULL THEN 'missing field `task_family`'
         WHEN json_type(j, '$.question') <> 'VARCHAR'
           THEN 'field `question` must be a string, got ' || lower(json_type(j, '$.question'))
         WHEN json_type(j, '$.answers') NOT IN ('ARRAY', 'NULL', {_SCALAR})
           THEN 'field `answers` must be a string or a list of strings, got ' || lower(json_type(j, '$.answers'))
         WHEN json_type(j, '$.answers') = 'ARRAY' AND list_bool_or(list_transform(
                json_extract(j, '$.answers[*]'), lambda x: json_type(x) NOT IN ({_SCALAR})))
           THEN 'field `answers` holds a null, list or object; gold answers are strings'
         WHEN json_type(j, '$.{ID_COLUMN}') NOT IN ({_SCALAR})
           THEN 'field `{ID_COLUMN}` must be a string or a number'
         ELSE 'field `' || list_first(list_filter(
                ['dataset', 'split', 'task_family', 'primary_metric'],
                lambda f: json_type(j, '$.' || f) IS NOT NULL AND json_type(j, '$.' || f) <> 'VARCHAR'))
              || '` must be a string' END AS problem
FROM (SELECT json AS j FROM read_json_objects({{path}}, format = 'newline_delimited',
                                                maximum_object_size = 1073741824))
"""


def _line_of(path: Path, record: int) -> int:
    """Physical line (from 1) of the record-th non-blank line; runs only to word an error."""
    seen = -1
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip(b" \t\r\n"):
                seen += 1
                if seen == record:
                    return number
    return record + 1


def _jsonl_read_problem(path: Path, err: duckdb.Error) -> str:
    """Name the line DuckDB could not parse (not UTF-8, not JSON); runs only after a failure."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                return (f"{path} line {number}: not UTF-8 text (byte 0x{raw[bad.start]:02x} at column "
                        f"{bad.start + 1}); save the file as UTF-8")
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as bad:
                return f"{path} line {number}: not valid JSON ({bad.msg} at column {bad.colno})"
    return f"{path}: not readable as JSONL ({err})"


def read_jsonl(path: Path, max_question_chars: int = MAX_QUESTION_CHARS) -> pa.Table:
    """Questions of a JSONL file: `question`, `answers`, `task_family`; optional `dataset`,
    `split`, `primary_metric`, `id` (defaults: file stem, split from the path, the family's
    metric, the line's position)."""
    try:
        table = _arrow(_JSONL_SQL, path)
    except duckdb.Error as err:
        raise IngestError(_jsonl_read_problem(path, err)) from None
    where = lambda i: f"{path} line {_line_of(path, i)}"  # noqa: E731
    problems = table.column("problem").to_pylist()
    bad = next((i for i, p in enumerate(problems) if p), None)
    if bad is not None:
        raise IngestError(f"{where(bad)}: {problems[bad]}")
    families = table.column("task_family").to_pylist()
    ids = table.column("id").to_pylist()
    default_split, stem = split_for(path), path.stem
    cols = Columns(
        table.column("question").to_pylist(), table.column("golds").to_pylist(),
        [d or stem for d in table.column("dataset").to_pylist()],
        [s or default_split for s in table.column("split").to_pylist()],
        families,
        [m or DEFAULT_METRIC.get(f, "f1") for m, f in zip(table.column("primary_metric").to_pylist(), families)],
        None if all(v is None for v in ids) else ids, path.name, "answers",
    )
    return build_table(_not_empty(cols, path), where, max_question_chars)


READERS: dict[str, Callable[[Path, int], pa.Table]] = {".parquet": read_parquet, ".jsonl": read_jsonl}
