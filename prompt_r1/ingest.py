"""Dataset ingestion: Prompt-R1 Parquet files, JSONL files and Hugging Face datasets -> warehouse.

Every source becomes rows of the `questions` table with its dataset, split, task family and
primary metric. A source is identified by the hash of its content, so re-ingesting the same
file is a no-op, and one source is one transaction: a bad row rolls the whole source back and
the error names the file and the row.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from prompt_r1.protocol import split_question
from warehouse.store import QuestionRow, Warehouse

log = logging.getLogger(__name__)

FAMILIES = ("multihop_qa", "standard_qa", "math", "generation")
DEFAULT_METRIC = {"multihop_qa": "f1", "standard_qa": "f1", "math": "em", "generation": "ssim"}

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


def question_id(dataset: str, split: str, question: str) -> str:
    """Stable id of a question.

    >>> question_id("hotpot", "test", "Who?")
    '1ee13860829e256c'
    """
    return hashlib.sha256(f"{dataset}\x1f{split}\x1f{question}".encode()).hexdigest()[:16]


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
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


def _golds(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    try:
        golds = [str(g) for g in value]  # type: ignore[union-attr]
    except TypeError:
        raise IngestError(f"{where}: gold answers must be a list of strings, got {value!r}") from None
    if not golds or not any(g.strip() for g in golds):
        raise IngestError(f"{where}: no gold answer (fix or drop the row, then ingest again)")
    return golds


def _row(dataset: str, split: str, question: str, golds: list[str], family: str, metric: str,
         index: int, where: str) -> QuestionRow:
    if not isinstance(question, str) or not question.strip():
        raise IngestError(f"{where}: empty or missing question text")
    if family not in FAMILIES:
        raise IngestError(f"{where}: task_family {family!r} is not one of {', '.join(FAMILIES)}")
    if metric not in ("f1", "em", "ssim"):
        raise IngestError(f"{where}: primary_metric {metric!r} is not one of f1, em, ssim")
    question = question.strip()
    return QuestionRow(question_id(dataset, split, question), dataset, split, question, golds,
                       family, metric, row_index=index)


def read_parquet(path: Path) -> Iterator[QuestionRow]:
    """Rows of a Prompt-R1 (verl RL layout) Parquet file."""
    import duckdb

    if path.stem not in PROMPT_R1_FILES:
        raise IngestError(
            f"{path}: unknown Prompt-R1 file name; expected one of {', '.join(PROMPT_R1_FILES)} "
            "(or convert it to JSONL with question/answers/task_family fields)"
        )
    family, metric = PROMPT_R1_FILES[path.stem]
    split = split_for(path)
    try:
        rows = duckdb.connect().execute(
            "SELECT prompt, reward_model FROM read_parquet(?)", [str(path)]).fetchall()
    except duckdb.Error as err:
        raise IngestError(f"{path}: not a readable Prompt-R1 Parquet file ({err})") from None
    for i, (prompt, reward_model) in enumerate(rows):
        where = f"{path} row {i}"
        if not prompt or not isinstance(prompt[0], dict) or not prompt[0].get("content"):
            raise IngestError(f"{where}: field `prompt` has no user message content")
        golds = _golds((reward_model or {}).get("ground_truth"), f"{where} field reward_model.ground_truth")
        yield _row(path.stem, split, split_question(prompt[0]["content"]), golds, family, metric, i, where)


def read_jsonl(path: Path) -> Iterator[QuestionRow]:
    """Rows of a JSONL file: `question`, `answers`, `task_family`; optional `dataset`, `split`,
    `primary_metric` (defaults: file stem, split from the path, the family's metric)."""
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            where = f"{path} line {i + 1}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise IngestError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise IngestError(f"{where}: expected a JSON object")
            for field in ("question", "answers", "task_family"):
                if field not in obj:
                    raise IngestError(f"{where}: missing field `{field}`")
            family = obj["task_family"]
            yield _row(obj.get("dataset", path.stem), obj.get("split", split_for(path)), obj["question"],
                       _golds(obj["answers"], f"{where} field answers"), family,
                       obj.get("primary_metric", DEFAULT_METRIC.get(family, "f1")), i, where)


def read_hf(name: str, question_col: str, answers_col: str, task_family: str, split: str = "test",
            hf_split: str = "train", config: str | None = None, dataset: str | None = None,
            ) -> tuple[str, str, list[QuestionRow]]:
    """A Hugging Face dataset (hub name, or a local folder/file for `datasets.load_dataset`).

    Returns (dataset name, content hash, rows); the hash is the dataset fingerprint + mapping.
    """
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=hf_split)
    except Exception as err:  # datasets raises many types; name the source either way
        raise IngestError(f"hf:{name}: cannot load ({type(err).__name__}: {err})") from None
    for col in (question_col, answers_col):
        if col not in ds.column_names:
            raise IngestError(f"hf:{name}: no column `{col}` (columns: {', '.join(ds.column_names)})")
    dataset = dataset or Path(name).stem.replace("/", "_")
    metric = DEFAULT_METRIC.get(task_family, "f1")
    rows = [
        _row(dataset, split, rec[question_col], _golds(rec[answers_col], f"hf:{name} row {i} column {answers_col}"),
             task_family, metric, i, f"hf:{name} row {i}")
        for i, rec in enumerate(ds)
    ]
    mapping = json.dumps([name, config, hf_split, question_col, answers_col, task_family, split])
    content_hash = hashlib.sha256(f"{ds._fingerprint}{mapping}".encode()).hexdigest()
    return dataset, content_hash, rows


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


def ingest_file(wh: Warehouse, path: Path) -> IngestReport:
    path = path.resolve()
    content_hash = file_hash(path)
    if wh.source_ingested(content_hash):
        log.info("already ingested, skipping: %s", path)
        return IngestReport(str(path), path.stem, 0, True)
    if path.suffix == ".parquet":
        rows = list(read_parquet(path))
    elif path.suffix == ".jsonl":
        rows = list(read_jsonl(path))
    else:
        raise IngestError(f"{path}: unsupported file type (use .parquet or .jsonl)")
    rows = _merged(rows, path)
    dataset = rows[0].dataset if rows else path.stem
    inserted = wh.add_source(str(path), content_hash, dataset,
                             [_with_source(r, str(path), content_hash) for r in rows])
    log.info("ingested %d questions from %s", inserted, path)
    return IngestReport(str(path), dataset, inserted, False)


def merge_duplicates(rows: list[QuestionRow]) -> list[QuestionRow]:
    """One row per question (same id): the first occurrence, with the gold answers of all of them.

    Some published files repeat a question with a different reference answer (BookSum has 2
    such questions, the training pool 6); both references are valid, and scoring takes the max
    over golds, so none is dropped.

    >>> a = QuestionRow("q1", "d", "test", "Q?", ["x"], "standard_qa", "f1", row_index=0)
    >>> b = QuestionRow("q1", "d", "test", "Q?", ["y", "x"], "standard_qa", "f1", row_index=5)
    >>> [(r.row_index, r.golds) for r in merge_duplicates([a, b])]
    [(0, ['x', 'y'])]
    """
    merged: dict[str, QuestionRow] = {}
    for row in rows:
        first = merged.setdefault(row.question_id, row)
        if first is not row:
            extra = [g for g in row.golds if g not in first.golds]
            if extra:
                merged[row.question_id] = replace(first, golds=first.golds + extra)
    return list(merged.values())


def _merged(rows: list[QuestionRow], source: object) -> list[QuestionRow]:
    unique = merge_duplicates(rows)
    if len(unique) < len(rows):
        log.info("%s: %d repeated questions merged into their first occurrence (gold answers combined)",
                 source, len(rows) - len(unique))
    return unique


def _with_source(row: QuestionRow, source_file: str, content_hash: str) -> QuestionRow:
    return replace(row, source_file=source_file, source_hash=content_hash)


def ingest(wh: Warehouse, sources: Iterable[str | Path]) -> list[IngestReport]:
    """Ingest files and folders; each file is its own transaction, so earlier ones stay."""
    reports = []
    for source in sources:
        for path in discover(Path(source)):
            reports.append(ingest_file(wh, path))
    return reports


def ingest_hf(wh: Warehouse, name: str, **mapping: str) -> IngestReport:
    dataset, content_hash, rows = read_hf(name, **mapping)
    if wh.source_ingested(content_hash):
        return IngestReport(f"hf:{name}", dataset, 0, True)
    rows = [_with_source(r, f"hf:{name}", content_hash) for r in _merged(rows, f"hf:{name}")]
    return IngestReport(f"hf:{name}", dataset, wh.add_source(f"hf:{name}", content_hash, dataset, rows), False)
