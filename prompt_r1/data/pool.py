"""The training pool: which questions a run trains on and validates with, and its hash.

Built once per run from the warehouse (`TrainingPool.load`) and handed down: the run choice (a
resume must see the same pool, `hash`), the MLflow dataset record and the training session all
read the same object, so a flow run never draws the pool twice. The rule: the train split of
`data.train_datasets` (when empty, the datasets the config's own `data.sources` hold: a warehouse
is shared by every config of a home, and another config's questions are not this task's), shuffled by a seed derived from the config's,
capped at `data.max_train_questions`, and a `data.validation_fraction` share held out for
validation (at least one question when the fraction is set, never the whole pool).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import Config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.seeding import derive_seed

if TYPE_CHECKING:  # the caller opens the warehouse; the pool only reads through it
    from warehouse.store import Warehouse


def pool_hash(train_ids: list[str], val_ids: list[str]) -> str:
    """Short hash of the training pool, order included (data positions index into it).

    >>> pool_hash(["a", "b"], ["c"]) == pool_hash(["a", "b"], ["c"])
    True
    >>> pool_hash(["a", "b"], ["c"]) == pool_hash(["b", "a"], ["c"])
    False
    >>> pool_hash(["a", "b"], ["c"]) == pool_hash(["a"], ["b", "c"])
    False
    """
    blob = json.dumps({"train": list(train_ids), "validation": list(val_ids)})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TrainingPool:
    """The questions of one run: `train` in the order the data order indexes, `validation` held out."""

    train: list[QuestionRow]
    validation: list[QuestionRow]

    @property
    def hash(self) -> str:
        """Identifies the pool (train + validation ids, in order): a resume must see the same."""
        return pool_hash([q.question_id for q in self.train], [q.question_id for q in self.validation])

    @classmethod
    def load(cls, warehouse: "Warehouse", cfg: Config) -> "TrainingPool":
        """The pool `cfg` trains on, from the warehouse's train split (see the module docstring)."""
        from prompt_r1.data.ingest import source_datasets

        datasets = cfg.data.train_datasets or source_datasets(warehouse, cfg.data.sources)
        pool = warehouse.questions(splits=["train"], datasets=datasets) if datasets else []
        if not pool:
            chosen = "data.train_datasets" if cfg.data.train_datasets else "the datasets of data.sources"
            raise ConfigError(f"no train-split questions in {chosen} ({', '.join(datasets) or 'none'}; data.sources: "
                              f"{cfg.data.sources}); add a source with a train split to data.sources (a train/ "
                              "folder, or a mapping's `split: train` / `columns.split`), or name the datasets to "
                              "train on in data.train_datasets")
        random.Random(derive_seed("training_pool", cfg.seed)).shuffle(pool)
        if cfg.data.max_train_questions:
            pool = pool[: cfg.data.max_train_questions]
        fraction = cfg.data.validation_fraction
        n_val = min(len(pool) - 1, max(1, round(len(pool) * fraction))) if fraction else 0
        return cls(pool[n_val:], pool[:n_val])
