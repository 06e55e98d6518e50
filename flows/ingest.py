"""`ingest` flow: the config's data sources (plus extra ones) into the warehouse."""

from __future__ import annotations

from prefect import flow

from prompt_r1 import load_config
from prompt_r1.config.run_home import default_db_path
from tasks.stages import ingest_sources


@flow(name="ingest", log_prints=True)
def ingest_flow(config: str = "configs/smoke.yaml", extra_sources: list[str] | None = None) -> list[dict]:
    """Ingest `data.sources` of the config and any `extra_sources` (cached on content hash)."""
    cfg = load_config(config)
    sources = list(cfg.data.sources) + list(extra_sources or [])
    return ingest_sources(sources, str(default_db_path()), cfg.data.max_question_chars)
