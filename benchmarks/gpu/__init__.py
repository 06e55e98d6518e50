"""GPU checks: what a GPU host measures (the bf16 peak, the learner's step, FSDP, weight sync).

Modules: `gpu_check` (the driver: runs, deadlines, the summary) with `check_parts` (its parts) and
`runner` (each part's commands under its deadline); `gpu_learner`, `gpu_fsdp` (what the parts run).
Run each from the repository root as a module: `python -m benchmarks.gpu.NAME --help`.
"""
