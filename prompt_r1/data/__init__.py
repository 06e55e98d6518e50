"""Data: benchmark files and Hugging Face datasets into the warehouse, and the training order.

Owns the row rules and ingestion (`ingest`), the bulk Parquet / JSONL readers (`files`) and the
deterministic, resumable order of training questions (`order`).

Imports: `prompt_r1.core`, `prompt_r1.config`, `warehouse`.
"""
