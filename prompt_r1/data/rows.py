"""The row rules of ingestion: what a question row must hold, its id, its split, and the checks.

Every source (Parquet, JSONL, Hugging Face dataset) ends as the same Arrow table, built and
checked here in one pass over the columns (`build_table`), so a bad row is named by file, row
and field before anything is written. Readers (`prompt_r1.data.files`) and ingestion
(`prompt_r1.data.ingest`) both build on these rules.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from prompt_r1.config.experiment import DataConfig
from prompt_r1.core.failures import UserError
from warehouse.sources import QUESTION_COLUMNS

FAMILIES = ("multihop_qa", "standard_qa", "math", "generation", "custom")  # custom: a user's own task
SCORER_METRIC = "scorer"  # the primary metric of a dataset scored by its own scorer (`core.scorer`)
METRICS = ("f1", "em", "ssim", SCORER_METRIC)
SPLITS = ("train", "test", "ood")
DEFAULT_METRIC = {"multihop_qa": "f1", "standard_qa": "f1", "math": "em", "generation": "ssim"}
MAX_QUESTION_CHARS: int = DataConfig.model_fields["max_question_chars"].default
ID_COLUMN = "id"  # a source column with this name gives each row its key
# Part of every content hash: when the way rows become questions changes, sources re-ingest.
INGEST_FORMAT = 4
# Arrow schema metadata of a built table whose ids come from the rows' text (no `id` column): the
# warehouse then re-keys questions it stored for the same source under other ids, by their text.
KEYED_BY_CONTENT = {b"prompt_r1.row_keys": b"content"}
QUESTION_ROLE = "user"
"""A row given as chat messages ({role, content}, the Parquet `prompt` column) holds its question in
the LAST message of this role, as chat datasets mean it. System messages and earlier turns are the
dataset's instructions and examples for the model that answers, like the Prompt-R1 instruction that
`split_question` removes from the user turn: the agent brings its own instruction and the environment
its `system_prompt`, so they are not part of the question and are not stored (ingest logs how many
rows had a system message). A list of messages without roles is read only when it holds one message."""

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


class IngestError(UserError, ValueError):
    """A source that cannot be ingested; the message names the file, row and field."""


@dataclass
class IngestReport:
    source: str
    dataset: str
    inserted: int
    skipped: bool  # already ingested (same content hash)
    updated: int = 0  # stored questions whose text, gold answers or labels changed
    removed: int = 0  # questions of an earlier version of this source that it no longer holds
    rekeyed: int = 0  # questions stored under their earlier positional id, now keyed by their text

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
        if self.rekeyed:
            parts.append(f"{self.rekeyed} re-keyed by their text (their trajectories and predictions follow them)")
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
    key_prefix: str  # names the source (a file name, `hf:<name>`) in every row key without an id column
    gold_field: str  # where the gold answers come from, for error messages
    metadata: list | None = None  # per row: a dict of metadata columns (or None)
    scorer: str | None = None  # the dataset's answer scorer, an import path (`core.scorer`)
    golds_optional: bool = False  # a source whose scorer judges without gold answers (verifiers rubrics)


def question_id(dataset: str, split: str, row_key: str) -> str:
    """Stable id of one source row.

    >>> question_id("hotpot", "test", "hotpot.parquet:0")
    '43d58b68b8d957a8'
    """
    return hashlib.sha256(f"{dataset}\x1f{split}\x1f{row_key}".encode()).hexdigest()[:16]


def source_hash(path: Path, mapping: str = "") -> str:
    """Content hash of a file together with what its path decides (dataset name, split), so two
    files with the same bytes but different names, empty ones included, are different sources.
    `mapping` is how a user's file maps to questions (its config entry): changing it re-ingests."""
    digest = hashlib.sha256(f"{INGEST_FORMAT}\x1f{path.name}\x1f{split_for(path)}\x1f{mapping}".encode())
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


def _golds(value: object, optional: bool = False) -> list[str]:
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
    if not optional and not any(g.strip() for g in golds):
        raise ValueError("no gold answer (fix or drop the row, then ingest again)")
    return [g for g in golds if g.strip()] if optional else golds


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
                and not q[-1].isspace() and all(type(x) is str for x in g) and any(x.strip() for x in g) \
                and not cols.golds_optional:
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
            golds.append(_golds(g, cols.golds_optional))
        except ValueError as err:
            raise IngestError(f"{where(i)} field {cols.gold_field}: {err}") from None
    per_row = {f: getattr(cols, f) if isinstance(getattr(cols, f), list) else [getattr(cols, f)] * n
               for f in ("dataset", "split", "task_family", "primary_metric")}
    keys = _row_keys(cols, where) if cols.ids is not None else \
        content_keys(cols.key_prefix, list(zip(per_row["dataset"], per_row["split"], questions)), golds)
    ids = [question_id(d, s, k) for d, s, k in zip(per_row["dataset"], per_row["split"], keys)]
    table = pa.table({"question_id": ids, **{f: per_row[f] for f in ("dataset", "split")},
                      "question": questions, "golds": golds,
                      **{f: per_row[f] for f in ("task_family", "primary_metric")},
                      "row_index": list(range(n)), "metadata": _metadata_json(cols, where),
                      "scorer": [cols.scorer] * n}, schema=QUESTION_COLUMNS)
    return table if cols.ids is not None else table.replace_schema_metadata(KEYED_BY_CONTENT)


def _metadata_json(cols: Columns, where: Callable[[int], str]) -> list[str | None]:
    """Each row's metadata as a JSON object (sorted keys, so an unchanged row stores the same text)."""
    if cols.metadata is None:
        return [None] * len(cols.questions)
    out = []
    for i, meta in enumerate(cols.metadata):
        try:
            out.append(None if meta is None else json.dumps(meta, sort_keys=True, ensure_ascii=False, allow_nan=False, default=str))
        except (TypeError, ValueError) as err:
            raise IngestError(f"{where(i)}: metadata cannot be stored as JSON ({err})") from None
    return out


def content_keys(source: str, rows: list[tuple[str, str, str]], golds: list[list[str]] | None = None) -> list[str]:
    """Row keys of a source without an `id` column, from its name and each row's (dataset,
    split, question text): the text's hash, so inserting, removing or moving a row leaves every
    other row's key as it was. A text that repeats within its dataset and split is told apart by its
    gold answers too (and which repeat of that text and golds it is, 0 for the first): a twin inserted
    above a stored row then gets a key of its own instead of taking the stored row's id and golds.

    >>> content_keys("qa.jsonl", [("d", "test", "Q1"), ("d", "test", "Q2")])
    ['qa.jsonl:text:32d833f348ce377c#0', 'qa.jsonl:text:8845886be6cbcf28#0']
    >>> content_keys("qa.jsonl", [("d", "test", "Q1"), ("d", "test", "Q1"), ("d", "test", "Q1")],
    ...              [["a"], ["b"], ["a"]])  # doctest: +NORMALIZE_WHITESPACE
    ['qa.jsonl:text:32d833f348ce377c:golds:0eb5b8d6f81bc677#0',
     'qa.jsonl:text:32d833f348ce377c:golds:a8950f05d3443e79#0',
     'qa.jsonl:text:32d833f348ce377c:golds:0eb5b8d6f81bc677#1']
    """
    counts: dict[tuple[str, str, str], int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    seen: dict[tuple, int] = {}
    keys = []
    for i, row in enumerate(rows):
        text = hashlib.sha256(row[2].encode()).hexdigest()[:16]
        if counts[row] > 1 and golds is not None:
            gold = hashlib.sha256(json.dumps(list(golds[i])).encode()).hexdigest()[:16]
            key: tuple = (*row, gold)
            n = seen[key] = seen.get(key, -1) + 1
            keys.append(f"{source}:text:{text}:golds:{gold}#{n}")
        else:
            n = seen[row] = seen.get(row, -1) + 1
            keys.append(f"{source}:text:{text}#{n}")
    return keys


def _row_keys(cols: Columns, where: Callable[[int], str]) -> list[str]:
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


