"""Experiments: learning runs with pre-registered criteria, environment pools, cost sweeps.

Run each from the repository root as a module: `python -m benchmarks.experiments.NAME --help`.
"""
