"""Dataset ingestion: Prompt-R1 Parquet files, JSONL files, Hugging Face datasets, a user's own
Parquet / JSONL / CSV file with a column mapping (`data.mapped`) and verifiers environments
(`data.verifiers_env`) -> warehouse.

Every source becomes rows of the `questions` table with its dataset, split, task family and
primary metric. One source row is one question, even when two rows share their text: its id is
a hash of (dataset, split, row key), the row key being the source's own `id` value when it has
an `id` column, and otherwise the question text's hash with which repeat of that text the row is
(`content_keys`): inserting, removing or moving a line changes no other question's id. So
re-ingesting finds the same ids, and a corrected file updates its questions in place (the report
says how many). Questions a warehouse stored under the earlier positional key
(`<file name>:<row index>`) are re-keyed by their text when their source is next ingested, with
every row that refers to them (`Warehouse.add_source`).

A source is identified by the hash of its content and of how that content maps to questions,
so re-ingesting an unchanged source is a no-op. Sources are read in bulk (DuckDB reads Parquet
and JSONL itself, see `prompt_r1.data.files`; HF datasets are Arrow already), every row is checked in one
pass over the columns (`build_table`), and one source is one transaction: a bad row rolls the whole source back and the error
names the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from prompt_r1.config.sampling import HF_PREFIX, DataSource
from prompt_r1.config.judge import judge_name
from prompt_r1.core.scorer import resolved_spec
from prompt_r1.data.files import READERS
from prompt_r1.data.mapped import mapping_text, read_mapped, source_path
from prompt_r1.data.verifiers_env import PREFIX as VERIFIERS, dataset_name
from prompt_r1.data.rows import (
    DEFAULT_METRIC, ID_COLUMN, INGEST_FORMAT, KEYED_BY_CONTENT, MAX_QUESTION_CHARS, Columns, IngestError, IngestReport, _not_empty,
    build_table, source_hash,
)
from warehouse.store import Warehouse

log = logging.getLogger(__name__)

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
    by_content = (table.schema.metadata or {}).items() >= KEYED_BY_CONTENT.items()
    counts = wh.add_source(source, content_hash, dataset, table, rekey=by_content)
    report = IngestReport(source, dataset, counts.inserted, False, counts.updated, counts.removed, counts.rekeyed)
    (log.warning if counts.updated or counts.removed or counts.rekeyed else log.info)(
        "%s: %s", source, report.describe())
    return report


def ingest_file(wh: Warehouse, path: Path, max_question_chars: int = MAX_QUESTION_CHARS) -> IngestReport:
    path = path.resolve()
    reader = READERS.get(path.suffix)
    if reader is None:
        raise IngestError(f"{path}: unsupported file type (use .parquet or .jsonl)")
    content_hash = source_hash(path)
    if wh.source_ingested(content_hash):
        log.info("already ingested, skipping: %s", path)
        return IngestReport(str(path), path.stem, 0, True)
    return _store(wh, str(path), content_hash, reader(path, max_question_chars))


def ingest(wh: Warehouse, sources: Iterable[str | Path | DataSource],
           max_question_chars: int = MAX_QUESTION_CHARS) -> list[IngestReport]:
    """Ingest `data.sources` entries: files and folders, `verifiers:<env id>`, and a user's file
    with its column mapping (`DataSource`); each file is its own transaction, so earlier ones stay."""
    reports = []
    for i, source in enumerate(sources):
        if str(source).startswith(HF_PREFIX):  # a bare `hf:NAME`: the entry's defaults
            source = DataSource(path=str(source))
        if isinstance(source, DataSource) and source.path.startswith(HF_PREFIX):
            reports.append(ingest_hf_source(wh, source, f"data.sources[{i}]", max_question_chars))
        elif isinstance(source, DataSource):
            reports.append(ingest_mapped(wh, source, f"data.sources[{i}]", max_question_chars))
        elif str(source).startswith(VERIFIERS):
            reports.extend(ingest_verifiers(wh, str(source)[len(VERIFIERS):], max_question_chars))
        else:
            for path in discover(Path(source)):
                reports.append(ingest_file(wh, path, max_question_chars))
    return reports


def source_datasets(wh: Warehouse, sources: Iterable[str | Path | DataSource]) -> list[str]:
    """The datasets `data.sources` put in the warehouse: a mapping's `dataset`, a verifiers
    environment's name, and for a file or folder the datasets stored from its files. A run trains on
    these when `data.train_datasets` is empty, so questions that other configs ingested into a shared
    warehouse never join its pool."""
    datasets: list[str] = []
    files: list[str] = []
    for source in sources:
        if isinstance(source, DataSource):
            datasets.append(source.dataset or source_path(source).stem)
        elif str(source).startswith(VERIFIERS):
            datasets.append(dataset_name(str(source)[len(VERIFIERS):]))
        else:
            files.extend(str(path.resolve()) for path in discover(Path(source)))
    return sorted(set(datasets) | set(wh.source_datasets(files)))


def mapped_label(path: Path, dataset: str) -> str:
    """The warehouse's `source_file` of a mapped source: the file and the dataset it feeds, so two
    entries that map one file to two datasets are two sources, and neither removes the other's
    questions as "no longer in the source".

    >>> mapped_label(Path("/d/caps.jsonl"), "caps_strict")
    '/d/caps.jsonl#caps_strict'
    """
    return f"{path}#{dataset}"


def ingest_mapped(wh: Warehouse, source: DataSource, setting: str = "data.sources[]",
                  max_question_chars: int = MAX_QUESTION_CHARS) -> IngestReport:
    """A user's Parquet / JSONL / CSV file through its column mapping (`prompt_r1.data.mapped`). A new
    version's scorer is loaded first, so one that cannot be imported is named before anything is written."""
    from prompt_r1.core.scorer import ScorerError
    from prompt_r1.data.scorers import answer_scorer

    path = source_path(source)
    if not path.is_file():
        raise IngestError(f"{setting}.path: no file {path}")
    content_hash = source_hash(path, mapping_text(source))
    if wh.source_ingested(content_hash):  # training and evaluation check the scorer again before use
        log.info("already ingested, skipping: %s", path)
        return IngestReport(str(path), source.dataset or path.stem, 0, True)
    if source.scorer and judge_name(source.scorer) is None:  # a judge: data.judges, checked with the config
        try:
            answer_scorer(resolved_spec(source.scorer))
        except ScorerError as err:
            raise IngestError(f"{setting}.scorer: {err}") from None
    dataset = source.dataset or path.stem
    label = mapped_label(path, dataset)
    wh.adopt_questions(str(path), label, dataset)  # stored by an older version under the path alone
    return _store(wh, label, content_hash, read_mapped(source, setting, max_question_chars))


def ingest_verifiers(wh: Warehouse, env_id: str, max_question_chars: int = MAX_QUESTION_CHARS) -> list[IngestReport]:
    """An installed verifiers environment's dataset (train) and eval dataset (test), scored by its
    rubric (`prompt_r1.data.verifiers_env`)."""
    from prompt_r1.data.verifiers_env import read_verifiers

    reports = []
    for label, content_hash, table in read_verifiers(env_id, max_question_chars):
        if wh.source_ingested(content_hash):
            reports.append(IngestReport(label, table.column("dataset")[0].as_py(), 0, True))
        else:
            reports.append(_store(wh, label, content_hash, table))
    return reports


def ingest_hf(wh: Warehouse, name: str, max_question_chars: int = MAX_QUESTION_CHARS,
              **mapping: str) -> IngestReport:
    label, content_hash, table = read_hf(name, max_question_chars=max_question_chars, **mapping)
    if wh.source_ingested(content_hash):
        return IngestReport(label, table.column("dataset")[0].as_py(), 0, True)
    return _store(wh, label, content_hash, table)


def ingest_hf_source(wh: Warehouse, source: DataSource, setting: str = "data.sources[]",
                     max_question_chars: int = MAX_QUESTION_CHARS) -> IngestReport:
    """An `hf:` entry of `data.sources` or of `prompt-r1 ingest` (`prompt_r1.data.hf`); its scorer
    is loaded first, so one that cannot be imported is named before anything is written."""
    from prompt_r1.core.scorer import ScorerError
    from prompt_r1.data.hf import read_hf_source
    from prompt_r1.data.scorers import answer_scorer

    if source.scorer and judge_name(source.scorer) is None:  # a judge: data.judges, checked with the config
        try:
            answer_scorer(resolved_spec(source.scorer))
        except ScorerError as err:
            raise IngestError(f"{setting}.scorer: {err}") from None
    label, content_hash, table = read_hf_source(source, setting, max_question_chars)
    if wh.source_ingested(content_hash):
        log.info("already ingested, skipping: %s", label)
        return IngestReport(label, table.column("dataset")[0].as_py(), 0, True)
    return _store(wh, label, content_hash, table)
