"""Which questions an evaluation asks: the datasets of its suites, and how many of each.

Stated once for `evaluate`, the MLflow dataset record (`tasks.tracking.runs.log_datasets`) and the
demo's checks, so that what is logged as evaluated is what was evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prompt_r1.config.experiment import Config
from prompt_r1.core.failures import UserError
from prompt_r1.core.questions import QuestionRow
from prompt_r1.data.rows import IN_DOMAIN, OOD
from warehouse.store import Warehouse


class EvalError(UserError, ValueError):
    """An evaluation request that cannot run (unknown suite, no questions ingested...)."""


def suite_datasets(warehouse: Warehouse, suites: Sequence[str]) -> list[tuple[str, str]]:
    """(dataset, split) pairs of the named suites, checked against what is ingested."""
    present = {(r["dataset"], r["split"]) for r in warehouse.question_summary()}
    wanted: list[tuple[str, str]] = []
    for suite in suites:
        if suite == "in_domain":
            names = [(d, "test") for d in IN_DOMAIN]
        elif suite == "ood":
            names = [(d, "ood") for d in OOD]
        elif suite == "sample":
            names = sorted(p for p in present if p[0].startswith("sample_") and p[1] == "test")
        else:
            names = sorted(p for p in present if p[0] == suite and p[1] != "train")
            if not names:
                raise EvalError(f"unknown suite or dataset `{suite}` (use in_domain, ood, sample, or an ingested dataset)")
        missing = [d for d, s in names if (d, s) not in present]
        if missing:
            raise EvalError(f"suite `{suite}` needs datasets not in the warehouse: {', '.join(missing)}. "
                            "Ingest them first, e.g. `prompt-r1 ingest path/to/prompt-r1-data`.")
        wanted += [n for n in names if n not in wanted]
    return wanted


def select_questions(warehouse: Warehouse, suites: Sequence[str], limit: int | None,
                     dataset_limits: Mapping[str, int] | None = None) -> list[QuestionRow]:
    """The first `limit` questions of each dataset of `suites` (`dataset_limits` for those it names)."""
    named = suite_datasets(warehouse, suites)
    dataset_limits = dataset_limits or {}
    out: list[QuestionRow] = []
    for dataset, split in named:
        out += warehouse.questions(splits=[split], datasets=[dataset],
                                   limit_per_dataset=dataset_limits.get(dataset, limit))
    return out


def check_dataset_limits(warehouse: Warehouse, cfg: Config) -> None:
    """`eval.dataset_limits` may only name datasets that `eval.suites` evaluates: a typo would
    otherwise leave the limit it meant to set silently at `limit_per_dataset`."""
    evaluated = {d for d, _ in suite_datasets(warehouse, cfg.eval.suites)}
    unknown = sorted(set(cfg.eval.dataset_limits) - evaluated)
    if unknown:
        raise EvalError(f"eval.dataset_limits names {', '.join(unknown)}, which no suite of eval.suites "
                        f"({', '.join(cfg.eval.suites)}) evaluates; evaluated: {', '.join(sorted(evaluated))}")
