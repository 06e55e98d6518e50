"""Benchmarks by kind: `speed/`, `experiments/`, `gpu/`, `screens/`; `scratch` is their shared
harness (a temporary run home). Run each from the repository root as a module, e.g.
`python -m benchmarks.speed.grpo_step`; results go to `benchmarks/results/`, and BENCHMARKS.md
records each command with its figures.
"""
