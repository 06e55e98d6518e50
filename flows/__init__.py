"""Prefect flows: ingest -> train -> evaluate, and the end-to-end pipeline (the main job)."""
