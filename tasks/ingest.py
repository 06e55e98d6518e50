"""Ingestion task, cached on the content hash of its sources (and the warehouse file)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prefect import task

from prompt_r1.ingest import discover, file_hash, ingest
from warehouse.store import Warehouse


def _sources_key(context, parameters) -> str:
    digest = hashlib.sha256(str(parameters["db"]).encode())
    for source in parameters["sources"]:
        for path in discover(Path(source)):
            digest.update(file_hash(path).encode())
    return "ingest-" + digest.hexdigest()[:32]


@task(name="ingest-sources", cache_key_fn=_sources_key, persist_result=True)
def ingest_sources(sources: list[str], db: str) -> list[dict]:
    """Ingest files and folders into the warehouse; unchanged sources are a cache hit."""
    with Warehouse(db) as wh:
        reports = ingest(wh, sources)
    return [vars(r) for r in reports]
