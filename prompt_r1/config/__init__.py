"""Typed configuration: one pydantic model tree per experiment, validated once at the edge.

Owns the shared strict base and the config error (`base`), one environment's settings (`env`)
and the whole experiment (`experiment`: every section, YAML loading with `--set` overrides, run
folders and ids). `docs/config.md` lists every key, generated from these models.

Imports: `prompt_r1.core` only.
"""
