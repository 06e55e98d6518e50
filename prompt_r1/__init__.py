"""prompt-r1: train a small agent LLM with GRPO to prompt a large environment LLM (Prompt-R1).

The public Python API (`prompt_r1.api`), importable from here:

- `load_config(path, overrides)` -> a validated `Config`;
- `train(cfg)` -> `TrainResult` (run id, exported agent, validation before / after);
- `evaluate(cfg, agents=...)` -> `EvalResult` (report files, result rows, `table()`);
- `load_agent(spec, cfg)` -> `Agent`, whose `ask(question)` returns an `Answer`.

The subpackages follow the paper's pipeline, each importing only those before it:
`core` (protocol, reward, GRPO maths, metrics, types) -> `config` -> `data` (ingestion, order)
and `models` (bundled models, resolver) -> `env`, `policy` and `cluster` (Ray actors) ->
`rollout` and `learner` -> `planning` (memory and GPU plans) -> `training` and `evaluation` ->
`serving` -> `api` -> `cli`. The library imports nothing of Prefect, MLflow,
`tasks/` or `flows/`; `tests/project/test_layout.py` keeps it so. Names load lazily, so importing a
small module (`prompt_r1.core.reward`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Agent", "Answer", "EvalResult", "TrainResult", "evaluate", "load_agent", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("prompt_r1.api"), name)
    raise AttributeError(f"module 'prompt_r1' has no attribute {name!r}")
