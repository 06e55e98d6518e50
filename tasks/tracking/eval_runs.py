"""MLflow evaluation runs: a nested run per environment and per method, their tables and metrics.

`log_eval_environment` writes one environment's runs, tagged `env_model`, `env_name`, `suite`,
`method` (and `held_out`), so the MLflow UI compares environment LLMs with one filter and one
group-by; each method run carries `headline/<suite>` metrics and its cost per correct answer;
agent episodes become traces of their method's run (`tasks.tracking.traces`). The evaluation's
cells go to one MLflow table (`log_results_table`), the held-out comparisons to `heldout/*`
metrics (`log_heldout_metrics`).
"""

from __future__ import annotations

import json
from typing import Any

import mlflow

from tasks.tracking.runs import metric_key


def log_eval_environment(parent_run_id: str, env_name: str, env_model: str, suites: list[str],
                         results: list[dict[str, Any]], baselines: list[dict[str, Any]] | None = None,
                         suite_datasets: dict[str, list[str]] | None = None,
                         agents: dict[str, str] | None = None, episodes: list[dict[str, Any]] | None = None,
                         held_out: bool | None = None) -> str:
    """A nested run for one environment, with a nested run per method; returns its run id.

    Every run is tagged `env_model`, `env_name`, `suite`, `method`; an agent method's run also
    `agent_checkpoint` (its spec in `agents`, label -> spec), and all of them `held_out` when
    given (`true` when the training run of `agent:trained` never drew this environment,
    `prompt_r1.evaluation.heldout`). Each method run logs `headline/<suite>` (`headline_metrics`),
    the same name for every environment, and its cost (`cost_usd`, `usd_per_question`, `correct`,
    `usd_per_correct` when anything was correct: `compare.cost_points`).
    `baselines` (`EvalOutcome.baselines`): each optimised instruction goes to its method's run as
    params (`instruction`, `cache_key`), metrics (`train_score`, `opt_*` spend) and, all together,
    to the environment run as `baselines/<env>.json`. `episodes` (`episode_record`s, already
    capped) are logged as traces of their method's run (`tasks.tracking.traces`)."""
    from prompt_r1.evaluation.report import averages
    from tasks.tracking.traces import trace_episodes

    rows = [r for r in results if r["env_name"] == env_name]
    suite = ",".join(suites)
    common = {"env_model": env_model, "env_name": env_name, "suite": suite,
              **({"held_out": str(held_out).lower()} if held_out is not None else {})}
    with mlflow.start_run(run_name=f"eval-{env_name}", nested=True, parent_run_id=parent_run_id) as env_run:
        mlflow.set_tags({**common, "method": "all"})
        metrics = {metric_key(r["method"], r["dataset"], "score"): r["score"] for r in rows
                   if r["score"] is not None}  # None: every row of the cell failed
        with_env = [r for r in rows if not r["method"].startswith("agent_only")]
        metrics["env_error_rate"] = (sum(r.get("errors", 0) for r in with_env) / max(1, sum(r["n"] for r in with_env)))
        for method in sorted({r["method"] for r in rows}):
            avg = averages(results, env_name, method)
            metrics.update({metric_key(method, f"avg_{g}"): v for g, v in avg.items() if v is not None})
            with mlflow.start_run(run_name=f"eval-{env_name}-{method}", nested=True,
                                  parent_run_id=env_run.info.run_id):
                label = method.partition(":")[2]
                mlflow.set_tags({**common, "method": method,
                                 **({"agent_checkpoint": str(agents[label])} if label in (agents or {}) else {})})
                per = [r for r in rows if r["method"] == method]
                headline = headline_metrics(per, suite_datasets or {})
                metrics.update({metric_key(method, k): v for k, v in headline.items()})
                mlflow.log_metrics(_method_metrics(per, avg, headline))
                trace_episodes([e for e in episodes or [] if e["method"] == method])
                for b in (b for b in baselines or [] if b["env_name"] == env_name and b["method"] == method):
                    _log_baseline(b)
        mine = [b for b in baselines or [] if b["env_name"] == env_name]
        if mine:
            mlflow.log_dict(mine, f"baselines/{env_name}.json")
        mlflow.log_metrics(metrics)
        return env_run.info.run_id


def _method_metrics(per: list[dict[str, Any]], avg: dict[str, float | None],
                    headline: dict[str, float]) -> dict[str, float]:
    """One method run's metrics: its cells' scores and scorer parts per dataset, the environment's
    errors and tokens, its averages, its cost (`compare.cost_points`) and its headline."""
    from prompt_r1.evaluation.compare import cost_points

    m = {metric_key(r["dataset"], k): r[k] for r in per for k in ("score", "em", "f1", "substring", "ssim",
                                                                "ci_low", "ci_high")
         if r.get(k) is not None}
    m.update({metric_key(r["dataset"], f"part_{name}"): value for r in per  # a dataset scorer's named parts
              for name, value in json.loads(r.get("parts") or "{}").items()})
    m["env_errors"] = sum(r.get("errors", 0) for r in per)
    m.update({metric_key(f"avg_{g}"): v for g, v in avg.items() if v is not None})
    m["env_prompt_tokens"] = sum(r["env_prompt_tokens"] for r in per)
    m["env_completion_tokens"] = sum(r["env_completion_tokens"] for r in per)
    (cost,) = cost_points(per)
    m.update({k: cost[k] for k in ("cost_usd", "usd_per_question", "correct", "usd_per_correct")
              if cost[k] is not None})
    m.update(headline)
    return m


RESULTS_TABLE = "eval/results_table.json"


def log_results_table(results: list[dict[str, Any]], env_models: dict[str, str],
                      held_out: dict[str, bool] | None = None) -> None:
    """The evaluation's cells as one MLflow table in the active run (`RESULTS_TABLE`): environment
    x method x dataset with the environment's model (`env_models`: name -> model), whether it was
    held out from training (`held_out`: name -> bool), score, 95% interval, n, failed rows and cost,
    which the run's artifact view sorts and filters."""
    import pandas as pd

    from tasks.artifacts import eval_table_rows

    rows = [{"env_model": env_models.get(r["env_name"], ""),
             **({"held_out": str(held_out[r["env_name"]]).lower()} if r["env_name"] in (held_out or {}) else {}),
             **r} for r in eval_table_rows(results)]
    mlflow.log_table(pd.DataFrame(rows), artifact_file=RESULTS_TABLE)


def heldout_metric_names(row: dict[str, Any]) -> str:
    """The MLflow name of one `heldout_comparisons` row: `heldout/mean/<suite>/vs_<method>`,
    `heldout/worst/...`, `trainedon/mean/...`, `heldout/env/<env>/...` (every environment, held out or not).

    >>> heldout_metric_names({"scope": "held-out worst", "suite": "sample", "method": "agent:base", "env_name": "e"})
    'heldout/worst/sample/vs_agent-base'
    >>> heldout_metric_names({"scope": "env", "suite": "sample", "method": "direct", "env_name": "e"})
    'heldout/env/e/sample/vs_direct'
    """
    vs = f"vs_{row['method']}"
    if row["scope"] == "env":
        return metric_key("heldout", "env", row["env_name"], row["suite"], vs)
    group, stat = {"held-out mean": ("heldout", "mean"), "held-out worst": ("heldout", "worst"),
                   "trained-on mean": ("trainedon", "mean")}[row["scope"]]
    return metric_key(group, stat, row["suite"], vs)


def log_heldout_metrics(rows: list[dict[str, Any]]) -> None:
    """`agent:trained` − method on held-out environments (`heldout_comparisons` rows) as metrics of
    the active run: the difference under `heldout_metric_names`, its interval as `.../ci_low`,
    `.../ci_high`; the worst environment's name as the tag `heldout/worst/<suite>/vs_<method>/env`."""
    metrics = {}
    for r in rows:
        if r["diff"] is None:
            continue
        name = heldout_metric_names(r)
        metrics.update({name: r["diff"], f"{name}/ci_low": r["ci_low"], f"{name}/ci_high": r["ci_high"]})
        if r["scope"] == "held-out worst":
            mlflow.set_tag(f"{name}/env", r["env_name"])
    if metrics:
        mlflow.log_metrics(metrics)


def headline_metrics(cells: list[dict[str, Any]], suite_datasets: dict[str, list[str]]) -> dict[str, float]:
    """`headline/<suite>`: the mean primary score of one method's cells over the suite's datasets
    (cells whose every row failed are left out; a suite with none gets no metric).

    >>> cells = [{"dataset": "a", "score": 0.2}, {"dataset": "b", "score": 0.6}, {"dataset": "c", "score": None}]
    >>> headline_metrics(cells, {"sample": ["a", "b", "c"], "ood": ["c"]})
    {'headline/sample': 0.4}
    """
    out = {}
    for suite, datasets in suite_datasets.items():
        scores = [c["score"] for c in cells if c["dataset"] in datasets and c["score"] is not None]
        if scores:
            out[metric_key("headline", suite)] = sum(scores) / len(scores)
    return out


def _log_baseline(b: dict[str, Any]) -> None:
    """One optimised instruction in the active run (MLflow params hold at most 6000 characters)."""
    mlflow.log_params({"instruction": b["instruction"][:6000], "cache_key": b["cache_key"],
                       "instruction_cached": str(b["cached"])})
    if b.get("error"):  # the optimisation failed: no instruction was evaluated
        mlflow.set_tag("optimisation_error", b["error"][:5000])
    spend = {f"opt_{k}": b[k] for k in ("env_calls", "prompt_tokens", "completion_tokens", "cost_usd", "env_errors")
             if k in b}
    mlflow.log_metrics({**spend, **({"train_score": b["train_score"]} if b["train_score"] is not None else {})})
