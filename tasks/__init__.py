"""Prefect tasks: thin wrappers that call `prompt_r1/` and `warehouse/`, nothing clever."""
