"""Prompt-optimisation baselines the paper compares with: OPRO, GEPA and TextGrad.

`optimised_instruction` returns the instruction a method evaluates: from the warehouse when the
same method already optimised against the same endpoints, budget and training questions, else
by running the optimiser (then stored, unless an environment call of it failed). An optimisation
that environment failures made no result raises `OptimisationFailed` and is never stored, so the
next run optimises again (see `base.check_optimisation`). The evaluation itself is the `cot` code
path with that instruction (`prompt_r1.evaluation.evaluate`).

Modules: `base` (the cache, the budget and the checks every method shares), `opro`,
`gepa_adapter` and `textgrad_opt`.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack

from prompt_r1.evaluation.baselines.base import (
    SEED_INSTRUCTION, BaselineError, Budget, Optimised, OptimisationFailed, baseline_prompt, check_optimisation,
    instruction_key, training_questions,
)
from prompt_r1.config.experiment import Config

log = logging.getLogger(__name__)

METHODS = ("opro", "gepa", "textgrad")
__all__ = ["METHODS", "SEED_INSTRUCTION", "BaselineError", "Optimised", "OptimisationFailed", "baseline_prompt",
           "optimised_instruction"]


async def optimised_instruction(method: str, env, cfg: Config, warehouse) -> Optimised:
    """The optimised instruction of `method` against `env` (reused from the warehouse when valid).

    Raises `OptimisationFailed` (nothing stored) when environment failures made the optimisation no
    result; one with a few failed calls within `max_error_rate` is returned but not stored."""
    from prompt_r1.env import open_environment

    bcfg = cfg.eval.baselines
    from prompt_r1.data.ingest import source_datasets

    # the training rule (`TrainingPool.load`): the config's own datasets, never a shared warehouse's others
    datasets = bcfg.train_datasets or cfg.data.train_datasets or source_datasets(warehouse, cfg.data.sources)
    questions = training_questions(warehouse, bcfg, datasets)
    optimizer_cfg = bcfg.optimizer or env.cfg
    key = instruction_key(method, env.cfg, optimizer_cfg, bcfg, questions)
    stored = warehouse.baseline_get(key)
    if stored is not None:
        log.info("%s: reusing the instruction optimised in %s", method, stored["created_at"])
        return Optimised(method, stored["instruction"], stored["train_score"],
                         json.loads(stored["spend"]), json.loads(stored["history"]), key, cached=True)
    budget = Budget(bcfg.max_env_calls, bcfg.max_usd)
    with ExitStack() as stack:
        optimizer_env = env if bcfg.optimizer is None else stack.enter_context(open_environment(bcfg.optimizer, warehouse))
        try:
            if method == "opro":
                from prompt_r1.evaluation.baselines.opro import optimise
            elif method == "gepa":
                from prompt_r1.evaluation.baselines.gepa_adapter import optimise
            elif method == "textgrad":
                from prompt_r1.evaluation.baselines.textgrad_opt import optimise
            else:
                raise BaselineError(f"unknown baseline {method!r} (use one of {', '.join(METHODS)})")
            result = await optimise(env, optimizer_env, questions, bcfg, budget)
        finally:
            if optimizer_env is not env:
                await optimizer_env.aclose()
    result.cache_key = key
    if check_optimisation(budget, result):  # raises OptimisationFailed: a failure is never cached
        warehouse.baseline_put(key, method, env.cfg.name, result.instruction, result.train_score,
                               json.dumps(result.spend), json.dumps(result.history))
    else:
        log.warning("%s: %d of %d optimisation calls failed (within max_error_rate): its instruction is "
                    "evaluated in this run but not stored; the next run optimises again", method,
                    result.spend["env_errors"], result.spend["env_calls"])
    log.info("%s: instruction scored %s on %d training questions, spend %s", method, result.train_score,
             len(questions), result.spend)
    return result
