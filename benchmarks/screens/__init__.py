"""Data screens: which candidate questions a model can and cannot answer, before a task is built.

Run each from the repository root as a module: `python -m benchmarks.screens.NAME --help`.
"""
