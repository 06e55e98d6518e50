"""Dataset ingestion: Prompt-R1 Parquet files, JSONL files and Hugging Face datasets -> warehouse.

Every source becomes rows of the `questions` table with its dataset, split, task family and
primary metric. One source row is one question, even when two rows share their text: its id is
a hash of (dataset, split, row key), the row key being the source's own `id` value when it has
an `id` column and `<file name>:<row index>` otherwise. So re-ingesting finds the same ids, and a
corrected file updates its questions in place (the report says how many).

A source is identified by the hash of its content and of how that content maps to questions,
so re-ingesting an unchanged source is a no-op. Sources are read in bulk (DuckDB reads Parquet
and JSONL itself, see `ingest_files`; HF datasets are Arrow already), every row is checked in one
pass over the columns (`build_table`), and one source is one transaction: a bad row rolls the whole source back and the error
names the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from prompt_r1.config import DataConfig
from warehouse.store import QUESTION_COLUMNS, Warehouse

log = logging.getLogger(__name__)

FAMILIES = ("multihop_qa", "standard_qa", "math", "generation")
METRICS = ("f1", "em", "ssim")
SPLITS = ("train", "test", "ood")
DEFAULT_METRIC = {"multihop_qa": "f1", "standard_qa": "f1", "math": "em", "generation": "ssim"}
MAX_QUESTION_CHARS: int = DataConfig.model_fields["max_question_chars"].default
ID_COLUMN = "id"  # a source column with this name gives each row its key
# Part of every content hash: when the way rows become questions changes, sources re-ingest.
INGEST_FORMAT = 2

# The reference release: file stem -> (task family, primary metric). See shared data README.
PROMPT_R1_FILES: dict[str, tuple[str, str]] = {
    "2WikiMultihopQA": ("multihop_qa", "f1"),
    "hotpot": ("multihop_qa", "f1"),
    "MusiQue": ("standard_qa", "f1"),
    "PopQA": ("standard_qa", "f1"),
    "gsm8k": ("math", "em"),
    "DAPO-Math": ("math", "em"),
    "BookSum": ("generation", "ssim"),
    "WritingPrompts": ("generation", "ssim"),
    "squad_v2_ood": ("standard_qa", "f1"),
    "triviaqa_ood": ("standard_qa", "em"),
    "MathQA_ood": ("math", "em"),
    "Xsum_ood": ("generation", "ssim"),
    # The training pool: mixed, mostly competition math, rewarded with F1.
    "validation": ("math", "f1"),
}
IN_DOMAIN = [s for s in PROMPT_R1_FILES if not s.endswith("_ood") and s != "validation"]
OOD = [s for s in PROMPT_R1_FILES if s.endswith("_ood")]


class IngestError(ValueError):
    """A source that cannot be ingested; the message names the file, row and field."""


@dataclass
class IngestReport:
    source: str
    dataset: str
    inserted: int
    skipped: bool  # already ingested (same content hash)
    updated: int = 0  # stored questions whose text, gold answers or labels changed
    removed: int = 0  # questions of an earlier version of this source that it no longer holds

    def describe(self) -> str:
        """What the ingest changed, in words.

        >>> IngestReport("f.jsonl", "f", 0, False, updated=2).describe()
        '0 new, 2 updated (question text, gold answers or labels changed)'
        """
        if self.skipped:
            return "already ingested (same content)"
        parts = [f"{self.inserted} new"]
        if self.updated:
            parts.append(f"{self.updated} updated (question text, gold answers or labels changed)")
        if self.removed:
            parts.append(f"{self.removed} removed (no longer in the source)")
        return ", ".join(parts)


@dataclass
class Columns:
    """One source read in bulk, one list entry per row; a plain string is the value of every row."""

    questions: list
    golds: list
    dataset: str | list
    split: str | list
    task_family: str | list
    primary_metric: str | list
    ids: list | None  # the source's own `id` column, when it has one
    key_prefix: str  # row key without an id column: f"{key_prefix}:{row index}"
    gold_field: str  # where the gold answers come from, for error messages


def question_id(dataset: str, split: str, row_key: str) -> str:
    """Stable id of one source row.

    >>> question_id("hotpot", "test", "hotpot.parquet:0")
    '43d58b68b8d957a8'
    """
    return hashlib.sha256(f"{dataset}\x1f{split}\x1f{row_key}".encode()).hexdigest()[:16]


def source_hash(path: Path) -> str:
    """Content hash of a file together with what its path decides (dataset name, split), so two
    files with the same bytes but different names, empty ones included, are different sources."""
    digest = hashlib.sha256(f"{INGEST_FORMAT}\x1f{path.name}\x1f{split_for(path)}\x1f".encode())
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_for(path: Path) -> str:
    """`_ood` files are split `ood`, files under a `train/` folder are `train`, the rest `test`."""
    if path.stem.endswith("_ood"):
        return "ood"
    if path.parent.name == "train":
        return "train"
    return "test"


def _golds(value: object) -> list[str]:
    """Gold answers of one row: a string or a list of strings (numbers are written as text).

    >>> _golds(["4", 4])
    ['4', '4']
    >>> _golds([" "])
    Traceback (most recent call last):
    ...
    ValueError: no gold answer (fix or drop the row, then ingest again)
    """
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if value is None:
        value = []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"gold answers must be a string or a list of strings, "
                         f"got {type(value).__name__} {str(value)[:80]!r}")
    golds = []
    for g in value:
        if isinstance(g, str):
            golds.append(g)
        elif isinstance(g, (int, float)) and not isinstance(g, bool):
            golds.append(str(g))
        else:
            raise ValueError(f"gold answer {str(g)[:80]!r} is not a string")
    if not any(g.strip() for g in golds):
        raise ValueError("no gold answer (fix or drop the row, then ingest again)")
    return golds


def _check_labels(values: str | list, allowed: Sequence[str], field: str, where: Callable[[int], str]) -> None:
    """Every row's `field` is one of `allowed`; else the first offending row is named."""
    rows = [values] if isinstance(values, str) else values
    bad = set(rows) - set(allowed)
    if bad:
        i = next(i for i, v in enumerate(rows) if v in bad)
        raise IngestError(f"{where(i)}: {field} {rows[i]!r} is not one of {', '.join(allowed)}")


def build_table(cols: Columns, where: Callable[[int], str], max_question_chars: int) -> pa.Table:
    """Check every row of a source and turn it into the warehouse's question table.

    `where(i)` names row i for error messages (file and row or line).
    """
    n = len(cols.questions)
    _check_labels(cols.task_family, FAMILIES, "task_family", where)
    _check_labels(cols.primary_metric, METRICS, "primary_metric", where)
    _check_labels(cols.split, SPLITS, "split", where)
    questions, golds = [], []
    for i, (q, g) in enumerate(zip(cols.questions, cols.golds)):
        if type(q) is str and type(g) is list and 0 < len(q) <= max_question_chars and not q[0].isspace() \
                and not q[-1].isspace() and all(type(x) is str for x in g) and any(x.strip() for x in g):
            questions.append(q)  # the common case, checked without the slower general path
            golds.append(g)
            continue
        if not isinstance(q, str) or not q.strip():
            raise IngestError(f"{where(i)}: empty or missing question text")
        q = q.strip()
        if len(q) > max_question_chars:
            raise IngestError(
                f"{where(i)}: question is {len(q):,} characters, over the limit of {max_question_chars:,} "
                "(shorten or drop the row, or raise data.max_question_chars / --max-question-chars)")
        questions.append(q)
        try:
            golds.append(_golds(g))
        except ValueError as err:
            raise IngestError(f"{where(i)} field {cols.gold_field}: {err}") from None
    keys = _row_keys(cols, where)
    per_row = {f: getattr(cols, f) if isinstance(getattr(cols, f), list) else [getattr(cols, f)] * n
               for f in ("dataset", "split", "task_family", "primary_metric")}
    ids = [question_id(d, s, k) for d, s, k in zip(per_row["dataset"], per_row["split"], keys)]
    return pa.table({"question_id": ids, **{f: per_row[f] for f in ("dataset", "split")},
                     "question": questions, "golds": golds,
                     **{f: per_row[f] for f in ("task_family", "primary_metric")},
                     "row_index": list(range(n))}, schema=QUESTION_COLUMNS)


def _row_keys(cols: Columns, where: Callable[[int], str]) -> list[str]:
    if cols.ids is None:
        return [f"{cols.key_prefix}:{i}" for i in range(len(cols.questions))]
    seen: dict[str, int] = {}
    for i, value in enumerate(cols.ids):
        if value is None or str(value).strip() == "":
            raise IngestError(f"{where(i)}: field `{ID_COLUMN}` is empty; give every row an id or none")
        first = seen.setdefault(str(value), i)
        if first != i:
            raise IngestError(f"{where(i)}: `{ID_COLUMN}` {str(value)!r} repeats {where(first)}; ids must be unique")
    return [f"{ID_COLUMN}:{v}" for v in cols.ids]


def _not_empty(cols: Columns, source: object) -> Columns:
    if not cols.questions:
        raise IngestError(f"{source}: no rows (empty file); nothing was ingested. Remove it or fill it.")
    return cols


def read_hf(name: str, question_col: str, answers_col: str, task_family: str, split: str = "test",
            hf_split: str = "train", config: str | None = None, dataset: str | None = None,
            max_question_chars: int = MAX_QUESTION_CHARS) -> tuple[str, str, pa.Table]:
    """A Hugging Face dataset (hub name, or a local folder/file for `datasets.load_dataset`).

    Returns (source label, content hash, questions); the hash is the dataset fingerprint +
    mapping. An `id` column, when the dataset has one, keys the rows.
    """
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=hf_split)
    except Exception as err:  # datasets raises many types; name the source either way
        raise IngestError(f"hf:{name}: cannot load ({type(err).__name__}: {err})") from None
    for col in (question_col, answers_col):
        if col not in ds.column_names:
            raise IngestError(f"hf:{name}: no column `{col}` (columns: {', '.join(ds.column_names)})")
    label = f"hf:{name}:{config or ''}:{hf_split}"
    has_id = ID_COLUMN in ds.column_names and ID_COLUMN not in (question_col, answers_col)
    table = ds.select_columns([question_col, answers_col] + ([ID_COLUMN] if has_id else [])) \
              .with_format("arrow")[:]
    dataset = dataset or Path(name).stem.replace("/", "_")
    cols = Columns(table.column(question_col).to_pylist(), table.column(answers_col).to_pylist(),
                   dataset, split, task_family, DEFAULT_METRIC.get(task_family, "f1"),
                   table.column(ID_COLUMN).to_pylist() if has_id else None, label, answers_col)
    where = lambda i: f"hf:{name} row {i}"  # noqa: E731
    mapping = json.dumps([INGEST_FORMAT, name, config, hf_split, question_col, answers_col, task_family, split])
    content_hash = hashlib.sha256(f"{ds._fingerprint}{mapping}".encode()).hexdigest()
    return label, content_hash, build_table(_not_empty(cols, f"hf:{name}"), where, max_question_chars)


def discover(source: Path) -> list[Path]:
    """Files to ingest under a path: Parquet and JSONL, sorted for a stable order."""
    if source.is_file():
        return [source]
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix in (".parquet", ".jsonl"))
        if not files:
            raise IngestError(f"{source}: no .parquet or .jsonl files inside")
        return files
    raise IngestError(f"{source}: no such file or directory")


def _store(wh: Warehouse, source: str, content_hash: str, table: pa.Table) -> IngestReport:
    dataset = table.column("dataset")[0].as_py()
    counts = wh.add_source(source, content_hash, dataset, table)
    report = IngestReport(source, dataset, counts.inserted, False, counts.updated, counts.removed)
    (log.warning if counts.updated or counts.removed else log.info)("%s: %s", source, report.describe())
    return report


def ingest_file(wh: Warehouse, path: Path, max_question_chars: int = MAX_QUESTION_CHARS) -> IngestReport:
    from prompt_r1.ingest_files import READERS  # it builds on this module's row rules

    path = path.resolve()
    reader = READERS.get(path.suffix)
    if reader is None:
        raise IngestError(f"{path}: unsupported file type (use .parquet or .jsonl)")
    content_hash = source_hash(path)
    if wh.source_ingested(content_hash):
        log.info("already ingested, skipping: %s", path)
        return IngestReport(str(path), path.stem, 0, True)
    return _store(wh, str(path), content_hash, reader(path, max_question_chars))


def ingest(wh: Warehouse, sources: Iterable[str | Path],
           max_question_chars: int = MAX_QUESTION_CHARS) -> list[IngestReport]:
    """Ingest files and folders; each file is its own transaction, so earlier ones stay."""
    reports = []
    for source in sources:
        for path in discover(Path(source)):
            reports.append(ingest_file(wh, path, max_question_chars))
    return reports


def ingest_hf(wh: Warehouse, name: str, max_question_chars: int = MAX_QUESTION_CHARS,
              **mapping: str) -> IngestReport:
    label, content_hash, table = read_hf(name, max_question_chars=max_question_chars, **mapping)
    if wh.source_ingested(content_hash):
        return IngestReport(label, table.column("dataset")[0].as_py(), 0, True)
    return _store(wh, label, content_hash, table)
