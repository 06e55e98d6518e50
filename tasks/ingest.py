"""Ingestion task, cached on the content hash of each source file.

The cache lives in the warehouse itself (`sources` is keyed on the file's sha256), not in
Prefect's result store: a Prefect-side cache keyed on file hashes would go stale when the
warehouse file is deleted or replaced (it did: a fresh clone at the same path skipped ingestion).
So the task always runs, and each unchanged source is a no-op that costs one hash.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import MAX_QUESTION_CHARS
from warehouse.store import Warehouse


@task(name="ingest-sources", cache_policy=NO_CACHE)
def ingest_sources(sources: list, db: str, max_question_chars: int = MAX_QUESTION_CHARS) -> list[dict]:
    """Ingest files and folders into the warehouse; already-ingested content is skipped."""
    with Warehouse(db) as wh:
        reports = ingest(wh, sources, max_question_chars=max_question_chars)
    return [vars(r) for r in reports]
