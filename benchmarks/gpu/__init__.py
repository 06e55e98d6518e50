"""GPU checks: what a GPU host measures (the bf16 peak, the learner's step, FSDP, weight sync).

Run each from the repository root as a module: `python -m benchmarks.gpu.NAME --help`.
"""
