"""Data: benchmark files and Hugging Face datasets into the warehouse, and the training order.

Owns ingestion (`ingest`) and its row rules (`rows`), the bulk Parquet / JSONL readers (`files`),
a user's own mapped file (`mapped`), Hugging Face datasets (`hf`), verifiers environments as tasks
(`verifiers_env`), the scorer a dataset names (`scorers`; an LLM judge's rubric and verdict rule: `judge`), the two-hop task (`compositional`, its
first call: `first_call`), the training pool and its hash (`pool`) and the deterministic,
resumable order of training questions (`order`).

Imports: `prompt_r1.core`, `prompt_r1.config`, `warehouse`.
"""
