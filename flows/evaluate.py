"""`evaluate` flow: methods x suites x environment LLMs, one sub-run per environment.

Also the nightly `transfer-eval` job: the registered champion agent against every configured
environment (`use_champion=True`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import mlflow
from prefect import flow

from prompt_r1.models.resolver import resolve_agents
from prompt_r1 import load_config
from prompt_r1.config.run_home import default_db_path, run_dir
from prompt_r1.evaluation.report import markdown_table, write_report
from prompt_r1.config.env import EnvConfig
from prompt_r1.evaluation.evaluate import EvalAgents, EvalOutcome, evaluate
from prompt_r1.evaluation.heldout import environment_split, heldout_comparisons
from prompt_r1.core.failures import EnvironmentFailure
from tasks.artifacts import publish_eval_table
from tasks.stages import evaluate_environment, ingest_sources
from tasks.tracking.traces import episodes_to_trace
from tasks.tracking.registry import install_registry_resolver
from tasks.tracking.eval_runs import log_eval_environment, log_heldout_metrics, log_results_table
from tasks.tracking.runs import log_datasets, log_run_identity, metric_key, setup_mlflow
from warehouse.store import Warehouse

log = logging.getLogger(__name__)


@flow(name="evaluate", log_prints=True)
def evaluate_flow(config: str = "configs/smoke.yaml", agents: dict[str, str] | None = None,
                  use_champion: bool = False, overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None, ingest: bool = True) -> dict[str, Any]:
    """Evaluate; returns the MLflow run id, the results rows and the report folder.

    `agents` maps labels to agent specs (`prompt_r1.models.resolver`: folders, run ids, bundled
    models, `models:/` URIs); `use_champion` evaluates the registry's champion alone.
    `ingest=False`: the caller has ingested `data.sources` already (the pipeline, once per run).
    """
    cfg = load_config(config, overrides)
    setup_mlflow(cfg.name, cfg.tracking.uri)
    db = str(default_db_path())
    if ingest:
        ingest_sources(list(cfg.data.sources), db, cfg.data.max_question_chars)
    install_registry_resolver()  # `champion` and `models:/` specs resolve through the registry
    resolved = resolve_agents(cfg, agents, labels=["champion"] if use_champion else None)
    split = environment_split(cfg, resolved)  # held out = not in the pool agent:trained was trained on
    suite = ",".join(cfg.eval.suites)
    with mlflow.start_run(run_name=f"evaluate-{cfg.name}", nested=parent_run_id is not None,
                          parent_run_id=parent_run_id,
                          tags={"flow": "evaluate", "suite": suite, "method": "all"}) as run:
        run_id = run.info.run_id
        out = run_dir(cfg.name, run_id) / "eval"

        def each_environment(env_cfg: EnvConfig, work: Callable[[], EvalOutcome]) -> EvalOutcome:
            """One environment as its own Prefect task, then its runs in MLflow."""
            try:
                part = evaluate_environment(env_cfg, work)
            except EnvironmentFailure as err:  # the flow run fails; MLflow says why
                mlflow.log_metric(metric_key(env_cfg.name, "env_error_rate"), err.error_rate)
                mlflow.set_tag("env_failure", str(err)[:5000])
                raise
            log_eval_environment(run_id, env_cfg.name, env_cfg.model, cfg.eval.suites, part.results, part.baselines,
                                 part.suites, resolved, episodes_to_trace(part.episodes, cfg.eval.trace_episodes),
                                 held_out=split.held_out[env_cfg.name])
            return part

        with Warehouse(db) as wh:
            log_run_identity(cfg, "evaluate", wh.source_hashes(), config)
            log_datasets(wh, cfg, "evaluation")
            mlflow.log_params({f"eval_agent.{k}": v for k, v in resolved.items()})
            mlflow.set_tag("use_champion", str(use_champion))
            with EvalAgents(cfg, resolved) as opened:  # loaded once for every environment
                total = evaluate(cfg, wh, run_id, opened, log_dir=out / "logs", on_environment=each_environment)
        files = write_report(total.results, total.examples, out, total.seconds, total.predictions,
                             total.baselines, split, total.suites, total.turns)
        mlflow.log_artifacts(str(out), artifact_path="eval")
        log_results_table(total.results, {e.name: e.model for e in cfg.eval_environments()}, split.held_out)
        log_heldout_metrics(heldout_comparisons(total.predictions, split, total.suites))
        mlflow.set_tag("held_out_from", split.source[:5000])
        mlflow.flush_trace_async_logging()  # traces are exported in the background: all stored on return
        publish_eval_table(total.results, key=f"eval-{cfg.name}")
        print(markdown_table(total.results, split.held_out))
    return {"run_id": run_id, "results": total.results, "report": str(files["markdown"]),
            "report_dir": str(out), "agents": resolved}
