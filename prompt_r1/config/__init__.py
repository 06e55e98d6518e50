"""Typed configuration: one pydantic model tree per experiment, validated once at the edge.

Owns the shared strict base and the config error (`base`), the rule of which fields identify a
run (`identity`: what `Config.hash` leaves out, stated on each field), the sections (`sampling`: data,
agent; `rollout`; `reward`; `training`: train; `evaluation`: eval; `env`: one environment) and the
whole experiment (`experiment`: the tree and YAML loading with `--set` overrides; every section
is importable from it), an LLM judge's settings (`judge`), the `tracking` section (`tracking`), and the run home (`run_home`: where
a run's files go, run folders and ids). `docs/config.md` lists every key, generated from these
models by `docs`.

Imports: `prompt_r1.core` only.
"""
