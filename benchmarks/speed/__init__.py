"""Speed benchmarks: each prints a ratio against a baseline run in the same process.

Run each from the repository root as a module: `python -m benchmarks.speed.NAME --help`.
"""
