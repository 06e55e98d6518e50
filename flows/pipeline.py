"""`pipeline` flow, the main job: ingest -> train -> evaluate (base vs trained vs baselines).

Ingestion runs once, here; the train and evaluate flows it calls read the warehouse it filled.

When an evaluation environment is the training environment's managed vLLM server, that server
stays up from training through evaluation instead of being stopped and started again.

A scheduled pipeline run that crashed and is retried (`tasks.recovery`) reopens its own MLflow
run and its train subflow continues its own training run from the last checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import mlflow
from prefect import flow

from flows.evaluate import evaluate_flow
from flows.train import train_flow
from prompt_r1 import load_config
from prompt_r1.config.run_home import default_db_path, run_dir
from prompt_r1.env.vllm_server import keep_server
from tasks.recovery import OWNER_TAG, check_attempts, scheduled_run
from tasks.stages import ingest_sources
from tasks.tracking.runs import log_run_identity, owned_run, setup_mlflow
from warehouse.store import Warehouse


@flow(name="pipeline", log_prints=True)
def pipeline_flow(config: str = "configs/demo.yaml", data: str | None = None,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the whole job for one config; `data` adds a folder (e.g. path/to/prompt-r1-data)."""
    scheduled = scheduled_run()
    check_attempts(scheduled)
    cfg = load_config(config, overrides)
    exp_id = setup_mlflow(cfg.name, cfg.tracking.uri)
    db = str(default_db_path())
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    ingest_sources(list(cfg.data.sources) + ([data] if data else []), db, cfg.data.max_question_chars)
    seconds["ingest"] = time.perf_counter() - t0
    owner = scheduled.flow_run_id if scheduled else None
    reopened = owned_run(exp_id, "pipeline", owner)
    opened = (mlflow.start_run(run_id=reopened) if reopened else
              mlflow.start_run(run_name=f"pipeline-{cfg.name}",
                               tags={"flow": "pipeline", **({OWNER_TAG: owner} if owner else {})}))
    with opened as parent:
        with Warehouse(db) as wh:
            hashes = wh.source_hashes()
        if not reopened:  # a retry's run has its identity already (MLflow params are written once)
            log_run_identity(cfg, "pipeline", hashes, config)
        log_dir = run_dir(cfg.name, parent.info.run_id) / "logs"
        with keep_server(cfg.environment, cfg.eval_environments(), log_dir):
            t0 = time.perf_counter()
            trained = train_flow(config, overrides, resume=False, parent_run_id=parent.info.run_id, ingest=False)
            seconds["train"] = time.perf_counter() - t0
            agents = {"trained": trained["checkpoint"]} if trained["checkpoint"] else {}
            t0 = time.perf_counter()
            evaluated = evaluate_flow(config, agents, overrides=overrides, parent_run_id=parent.info.run_id,
                                      ingest=False)
            seconds["evaluate"] = time.perf_counter() - t0
        mlflow.log_metrics({f"final_{k}": v for k, v in trained["validation"].items()})
        mlflow.log_metrics({f"base_{k}": v for k, v in trained["validation_before"].items()})
        mlflow.log_metrics({f"stage_seconds/{k}": v for k, v in seconds.items()})
    return {"run_id": parent.info.run_id, "train": trained, "evaluate": evaluated, "seconds": seconds}
