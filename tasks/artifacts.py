"""Prefect artifacts: what a flow run shows in the Prefect UI beside its logs.

- `publish_eval_table`: the evaluation results as a table artifact (one row per environment x
  method x dataset cell, with the score's 95% interval `ci_low`/`ci_high`) and as the report's
  Markdown table;
- `training_progress`: one progress artifact per training flow run, created at the first step
  and updated at each later one, its description carrying the step's headline metrics;
- `publish_training_metrics`: the per-step training metrics as a table artifact at the end.

Artifact keys are versioned by Prefect: a key names the latest table of a config, and older
versions stay in the artifact's history. Keys take lowercase letters, digits and dashes only
(`artifact_key`). These functions need a Prefect API (a flow run's, or the test harness's).
"""

from __future__ import annotations

import math
import re
from typing import Any
from uuid import UUID

from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)

EVAL_COLUMNS = ("env_name", "method", "dataset", "primary_metric", "n", "score", "ci_low", "ci_high", "em",
                "f1", "errors", "env_prompt_tokens", "env_completion_tokens", "cost_usd")
PROGRESS_METRICS = ("reward_mean", "answer_mean", "pg_loss", "kl", "env_error_rate")  # shown in the description

# Progress artifact of each (flow run, key): created once, then updated.
_progress_ids: dict[tuple[str, str], UUID] = {}


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits, dashes) from free-form parts.

    >>> artifact_key("eval", "Smoke_Config.v2")
    'eval-smoke-config-v2'
    >>> artifact_key("train", "--odd  name--")
    'train-odd-name'
    """
    text = "-".join(parts).lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def _cell(value: Any, digits: int = 4) -> Any:
    """A table value: floats rounded (NaN as None, which the UI shows empty), others unchanged.

    >>> _cell(0.123456), _cell(float("nan")), _cell(3), _cell(None), _cell("cot")
    (0.1235, None, 3, None, 'cot')
    """
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    return value


def eval_table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results cells (`prompt_r1.evaluation.scoring.aggregate` rows) reduced to `EVAL_COLUMNS`, sorted.

    >>> rows = eval_table_rows([{"env_name": "e", "method": "direct", "dataset": "nq", "n": 4,
    ...                          "score": 0.5, "ci_low": 0.12345, "ci_high": 0.9, "errors": 0}])
    >>> rows[0]["ci_low"], rows[0]["score"], rows[0]["f1"], list(rows[0])[:3]
    (0.1235, 0.5, None, ['env_name', 'method', 'dataset'])
    """
    rows = [{c: _cell(r.get(c)) for c in EVAL_COLUMNS} for r in results]
    return sorted(rows, key=lambda r: (str(r["env_name"]), str(r["method"]), str(r["dataset"])))


def publish_eval_table(rows: list[dict[str, Any]], key: str) -> UUID:
    """Publish evaluation results as a table artifact `key` and a Markdown artifact `key`-report
    (the report's table: scores x 100 with their 95% intervals). Returns the table's id."""
    from prompt_r1.evaluation.report import markdown_table

    key = artifact_key(key)
    table = eval_table_rows(rows)
    described = "Evaluation cells: score = mean primary metric over scored questions, [ci_low, ci_high] its " \
                "95% bootstrap interval, errors = failed environment calls left out of the means."
    artifact_id = create_table_artifact(table, key=key, description=described)
    create_markdown_artifact(markdown_table(rows) if rows else "_no results_", key=artifact_key(key, "report"),
                             description="Evaluation report (scores x 100, 95% interval in brackets).")
    return artifact_id


def _flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.get_id() or "no-flow-run")


def progress_text(step: int, total: int, metrics: dict[str, float]) -> str:
    """The progress artifact's description: the step and its headline metrics.

    >>> progress_text(2, 10, {"reward_mean": 0.51234, "pg_loss": -0.1, "other": 3})
    'step 3 of 10: reward_mean=0.5123 pg_loss=-0.1'
    """
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in PROGRESS_METRICS if isinstance(metrics.get(k), (int, float)))
    return f"step {step + 1} of {total}" + (f": {shown}" if shown else "")


def training_progress(step: int, total: int, metrics: dict[str, float], key: str = "training-progress") -> UUID:
    """Show that training step `step` (0-based) of `total` is done: the first call in a flow run
    creates the progress artifact `key`, later calls update it (progress in percent). A resumed
    run is a new flow run and starts its own artifact at the step it resumes from."""
    if total < 1 or not 0 <= step < total:
        raise ValueError(f"training_progress: step {step} is outside 0..{total - 1} (total={total})")
    progress = 100.0 * (step + 1) / total
    text = progress_text(step, total, metrics)
    slot = (_flow_run_id(), artifact_key(key))
    if slot not in _progress_ids:
        _progress_ids[slot] = create_progress_artifact(progress, key=slot[1], description=text)
    else:
        update_progress_artifact(_progress_ids[slot], progress, description=text)
    return _progress_ids[slot]


def training_metrics_table(history: list[tuple[int, dict[str, float]]]) -> list[dict[str, Any]]:
    """One row per step (sorted; the last entry of a step wins), one column per metric seen.

    >>> training_metrics_table([(1, {"loss": 0.5}), (0, {"loss": 0.7, "reward_mean": 0.2})])
    [{'step': 0, 'loss': 0.7, 'reward_mean': 0.2}, {'step': 1, 'loss': 0.5, 'reward_mean': None}]
    """
    by_step = {step: metrics for step, metrics in history}
    columns = sorted({k for metrics in by_step.values() for k in metrics})
    return [{"step": step, **{k: _cell(by_step[step].get(k)) for k in columns}} for step in sorted(by_step)]


def publish_training_metrics(history: list[tuple[int, dict[str, float]]], key: str = "training-metrics") -> UUID:
    """Publish per-step training metrics (`(step, {name: value})` pairs, e.g. what the flow
    logged to MLflow) as a table artifact `key`. Returns its id."""
    return create_table_artifact(training_metrics_table(history), key=artifact_key(key),
                                 description="Per-step training metrics (one row per GRPO step).")
