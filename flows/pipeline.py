"""`pipeline` flow, the main job: ingest -> train -> evaluate (base vs trained vs baselines)."""

from __future__ import annotations

from typing import Any

import mlflow
from prefect import flow

from flows.evaluate import evaluate_flow
from flows.train import train_flow
from prompt_r1.config import default_db_path, load_config
from tasks.ingest import ingest_sources
from tasks.tracking import log_run_identity, setup_mlflow
from warehouse.store import Warehouse


@flow(name="pipeline", log_prints=True)
def pipeline_flow(config: str = "configs/demo.yaml", data: str | None = None,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the whole job for one config; `data` adds a folder (e.g. ../shared/data/prompt-r1)."""
    cfg = load_config(config, overrides)
    setup_mlflow(cfg.name)
    db = str(default_db_path())
    ingest_sources(list(cfg.data.sources) + ([data] if data else []), db)
    with mlflow.start_run(run_name=f"pipeline-{cfg.name}", tags={"flow": "pipeline"}) as parent:
        with Warehouse(db) as wh:
            hashes = wh.source_hashes()
        log_run_identity(cfg, "pipeline", hashes, config)
        trained = train_flow(config, overrides, resume=False, parent_run_id=parent.info.run_id)
        agents = {"trained": trained["checkpoint"]} if trained["checkpoint"] else {}
        evaluated = evaluate_flow(config, agents, overrides=overrides, parent_run_id=parent.info.run_id)
        mlflow.log_metrics({f"final_{k}": v for k, v in trained["validation"].items()})
    return {"run_id": parent.info.run_id, "train": trained, "evaluate": evaluated}
