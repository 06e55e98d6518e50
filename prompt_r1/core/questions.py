"""The question type the library works on: one benchmark question with its gold answers.

Rollouts, evaluation, baselines and serving all take `QuestionRow`s; the warehouse stores and
returns them, converting to and from its own rows at its edge (`warehouse/store.py`). Keeping the
type here means the library needs the warehouse only where it reads or writes, never for a type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QuestionRow:
    """One question: its id, where it comes from, the text, gold answers and how it is scored
    (`primary_metric`, or `scorer`, an import path, when its dataset brings its own: `core.scorer`).

    >>> QuestionRow("q1", "nq", "test", "Capital of France?", ["Paris"], "qa", "em").golds
    ['Paris']
    """

    question_id: str
    dataset: str
    split: str
    question: str
    golds: list[str]
    task_family: str
    primary_metric: str
    source_file: str = ""
    source_hash: str = ""
    row_index: int = 0
    metadata: dict[str, Any] | None = None  # the source row's metadata columns, for the dataset's scorer
    scorer: str | None = None  # the dataset's own answer scorer (`core.scorer`); None = the built-in metrics
