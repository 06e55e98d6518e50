"""`train` flow: per step rollout -> reward -> GRPO update -> broadcast -> checkpoint, in MLflow.

The schedule is the library's (`TrainingSession.run`, the same loop as `prompt-r1 train`); the
flow adds run bookkeeping: which MLflow run to continue, metrics, and the agent's registration.

A crashed or cancelled run is continued by running the flow again with the same config: it
finds the newest unfinished training run of the experiment whose `config_hash` and `pool_hash`
tags match (same settings, same training questions), loads its last checkpoint and goes on.
Unfinished runs under other settings are left alone (and the log says why): a new run starts.
Metrics are flushed to MLflow at checkpoints only, so the redone steps are never logged twice.
"""

from __future__ import annotations

import logging
from typing import Any

import mlflow
from mlflow import MlflowClient
from prefect import flow

from prompt_r1 import load_config
from prompt_r1.config.experiment import default_db_path, run_dir
from prompt_r1.core.failures import EnvironmentFailure
from prompt_r1.policy import backend_deterministic
from prompt_r1.training.run_record import mismatches, read_record
from prompt_r1.training.session import TrainingSession, training_pool_hash
from tasks.artifacts import publish_training_metrics
from tasks.train import FlowTrainingHooks, registration_score
from tasks.ingest import ingest_sources
from tasks.tracking.registry import register_agent
from tasks.tracking.runs import MetricBuffer, log_datasets, log_run_identity, setup_mlflow, start_training_run
from warehouse.store import Warehouse

log = logging.getLogger(__name__)


def unfinished_run(experiment_id: str, config_name: str, config_hash: str, pool: str) -> str | None:
    """Newest training run of the experiment that did not finish (crashed, killed, or running)
    and was started with this config and training pool; the newer ones passed over are logged."""
    runs = MlflowClient().search_runs(
        [experiment_id], "tags.flow = 'train' and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=50)
    for run in runs:
        tags = run.data.tags
        diffs = mismatches({"config_hash": tags.get("config_hash"), "pool_hash": tags.get("pool_hash")},
                           config_hash, pool)
        record = read_record(run_dir(config_name, run.info.run_id)) or {}
        if record.get("finished_at"):  # ended after its last step, e.g. while registering
            diffs.append(f"its run folder says it finished at {record['finished_at']}")
        if not diffs:
            return run.info.run_id
        log.warning("not continuing unfinished training run %s (status %s): %s", run.info.run_id,
                    run.info.status, "; ".join(diffs))
    return None


@flow(name="train", log_prints=True)
def train_flow(config: str = "configs/smoke.yaml", overrides: dict[str, Any] | None = None,
               resume: bool = True, parent_run_id: str | None = None) -> dict[str, Any]:
    """Train the agent with GRPO; returns the MLflow run id, final checkpoint and validation."""
    cfg = load_config(config, overrides)
    exp_id = setup_mlflow(cfg.name)
    db = str(default_db_path())
    ingest_sources(list(cfg.data.sources), db, cfg.data.max_question_chars)
    with Warehouse(db) as wh:
        pool = training_pool_hash(wh, cfg)
    previous = unfinished_run(exp_id, cfg.name, cfg.hash(), pool) if resume else None
    if previous:
        run = start_training_run(run_id=previous)
        log.info("continuing unfinished training run %s (config hash %s, pool hash %s)", previous, cfg.hash(), pool)
    else:
        run = start_training_run(run_name=f"train-{cfg.name}", nested=parent_run_id is not None,
                               parent_run_id=parent_run_id,
                               tags={"flow": "train", "config_hash": cfg.hash(), "pool_hash": pool,
                                     # exact reruns whatever the environment latency (docs/determinism.md)
                                     "deterministic": str(backend_deterministic(cfg.agent)).lower()})
        log.info("starting training run %s (config hash %s, pool hash %s)", run.info.run_id, cfg.hash(), pool)
    run_id = run.info.run_id
    with run, Warehouse(db) as wh:
        if not previous:
            log_run_identity(cfg, "train", wh.source_hashes(), config)
            log_datasets(wh, cfg, "training")
        buffer = MetricBuffer(run_id)
        with TrainingSession(cfg, wh, run_id, run_dir(cfg.name, run_id), resume=True) as session:
            buffer.recover(session.ckpt_dir / f"metrics-{session.step:05d}.json")
            try:
                pool = cfg.training_environments() if cfg.train.environments else []  # per-env metrics
                hooks = FlowTrainingHooks(cfg.train.steps, buffer, session.ckpt_dir, pool, cfg.reward.format_cap)
                outcome = session.run(hooks)
            except EnvironmentFailure as err:  # the flow and MLflow run fail; nothing is registered
                mlflow.set_tag("env_failure", str(err)[:5000])
                raise
        final, val = outcome.agent, outcome.validation
        if hooks.history:
            publish_training_metrics(hooks.history)
        # never registered (or promoted) on a score computed from failures
        version, champion = (register_agent(run_id, final, registration_score(val, bool(session.val_questions)))
                             if final else (None, False))
        mlflow.set_tags({"registered_version": str(version), "champion": str(champion)})
        session.mark_finished()
    return {"run_id": run_id, "checkpoint": str(final) if final else None, "validation": val,
            "validation_before": outcome.validation_before,
            "model_version": version, "champion": champion}
