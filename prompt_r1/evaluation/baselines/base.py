"""What every prompt-optimisation baseline (OPRO, GEPA, TextGrad) shares.

Each baseline optimises one instruction on training questions against the evaluation
environment, then is evaluated like `cot`: the instruction follows the question, and the
prediction is the text after the last `Answer:` (`prompt_r1.evaluation.answers.extract_cot_answer`).

- `Budget`: counts environment calls (optimiser calls included) and dollars; a call is refused
  (`BudgetExhausted`) before it would pass `max_env_calls`, so the count stops exactly at the
  budget. Dollars are known only after a call, so with `max_usd` set, calls run one at a time
  and the spend passes `max_usd` by at most one call.
- `score_instruction`: the mean primary score of an instruction over the training questions;
  a failed environment call makes the whole candidate unscored (a failure is not a 0).
- `check_optimisation`: whether an optimisation may be stored for reuse (none of its environment
  calls failed), may only be used in this run (a few failed, within `max_error_rate`, and a
  candidate was scored), or failed (`OptimisationFailed`: too many failed calls, or failures left
  no candidate scored, so the seed instruction would stand in for a result). A failed
  optimisation is never stored.
- `instruction_key`: what makes an optimised instruction reusable: the method, the endpoints
  (evaluation and optimiser), the budget settings and the training questions' content.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from prompt_r1.config.experiment import BaselinesConfig
from prompt_r1.env.base import cost_usd, endpoint_identity, sampling_settings
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.failures import EnvironmentFailure, UserError, check_error_rate
from prompt_r1.evaluation.scoring import primary_scores
from prompt_r1.core.questions import QuestionRow

log = logging.getLogger(__name__)

CALL_DEADLINE_S = 3600.0  # one environment call from an optimiser's thread, budget waits included
SEED_INSTRUCTION = ("Think step by step. Then write the final answer on the last line as "
                    "'Answer: <your answer>'.")


class BudgetExhausted(RuntimeError):
    """The optimisation budget allows no further environment call."""


class BaselineError(UserError, RuntimeError):
    """A baseline cannot run (missing optional package, no training questions...)."""


class OptimisationFailed(RuntimeError):
    """Environment failures made an optimisation no result; `result` holds its spend and history
    (its instruction is only the fallback the optimiser returned) and `first_error` the first
    failed call's reason."""

    def __init__(self, message: str, result: "Optimised", first_error: str):
        super().__init__(message)
        self.result, self.first_error = result, first_error


def baseline_prompt(question: str, instruction: str) -> str:
    """The user message of a baseline: the question, then the instruction (as `cot` does).

    >>> baseline_prompt("2+2?", "Answer briefly.")
    '2+2?\\nAnswer briefly.'
    """
    return f"{question}\n{instruction}"


@dataclass
class Budget:
    """Environment calls and dollars spent by one optimisation, with hard limits."""

    max_calls: int
    max_usd: float | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    outcomes: list[tuple[str, float, str | None]] = field(default_factory=list, repr=False)
    """One per call made: (environment name, its max_error_rate, the call's error or None)."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def left(self) -> int:
        return self.max_calls - self.calls

    async def call(self, env, messages: list[dict[str, str]], turn: int = 0):
        """`env.reply(messages)` if the budget allows it (else `BudgetExhausted`); records the spend."""
        if self.max_usd is not None:
            async with self._lock:  # one call at a time: the dollar check sees every earlier cost
                return await self._call(env, messages, turn)
        return await self._call(env, messages, turn)

    async def _call(self, env, messages, turn):
        if self.calls >= self.max_calls or (self.max_usd is not None and self.usd >= self.max_usd):
            raise BudgetExhausted(f"budget spent: {self.calls}/{self.max_calls} calls, ${self.usd:.4f}"
                                  + (f"/${self.max_usd:g}" if self.max_usd is not None else ""))
        self.calls += 1  # counted before the await: concurrent callers cannot pass the limit
        reply = await env.reply(messages, turn)
        self.outcomes.append((env.cfg.name, env.cfg.max_error_rate, reply.call.error))
        self.prompt_tokens += reply.call.prompt_tokens
        self.completion_tokens += reply.call.completion_tokens
        self.usd += cost_usd(env.cfg, reply.call.prompt_tokens, reply.call.completion_tokens)
        return reply

    def spend(self) -> dict[str, Any]:
        return {"env_calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cost_usd": self.usd,
                "env_errors": sum(1 for *_, error in self.outcomes if error)}


def blocking_caller(env, budget: Budget, loop: asyncio.AbstractEventLoop, deadline_s: float = CALL_DEADLINE_S):
    """`call(messages) -> EnvReply` for synchronous optimiser packages (GEPA, TextGrad) running in
    a worker thread: each call runs `budget.call` on `loop`, which owns the async clients."""

    def call(messages: list[dict[str, str]]):
        return asyncio.run_coroutine_threadsafe(budget.call(env, messages), loop).result(timeout=deadline_s)

    return call


@dataclass
class Scored:
    """One candidate instruction, its training score and per-question replies."""

    instruction: str
    score: float
    per_question: list[float | None]  # None: the question's LLM judgement failed (left out of `score`)
    replies: list[str]


async def score_instruction(env, budget: Budget, questions: list[QuestionRow], instruction: str) -> Scored | None:
    """Mean primary score of `instruction` on `questions`; None when a call failed. A question whose
    LLM judgement failed is a dropped sample (`primary_scores`): left out of the mean, never a 0; None
    when every one was dropped.

    Raises `BudgetExhausted` when the budget cannot cover every question (checked first, so
    no call is spent on a candidate that could not be scored completely).
    """
    from prompt_r1.evaluation.answers import extract_cot_answer

    if budget.left() < len(questions):
        raise BudgetExhausted(f"{budget.left()} calls left, {len(questions)} needed to score a candidate")
    replies = await asyncio.gather(*[
        budget.call(env, [{"role": "user", "content": baseline_prompt(q.question, instruction)}]) for q in questions])
    if any(r.call.error is not None for r in replies):
        return None
    texts = [r.text for r in replies]
    per = primary_scores([extract_cot_answer(t) for t in texts], questions)
    kept = [s for s in per if s is not None]
    if len(kept) < len(per):
        log.warning("candidate instruction: %d of %d judgements failed (dropped, not scored 0)",
                    len(per) - len(kept), len(per))
    return Scored(instruction, sum(kept) / len(kept), per, texts) if kept else None


def training_questions(warehouse, cfg: BaselinesConfig, datasets: list[str] | None) -> list[QuestionRow]:
    """The first `cfg.train_questions` train-split questions, spread round-robin over datasets."""
    pool = warehouse.questions(splits=["train"], datasets=datasets or None)
    if not pool:
        raise BaselineError("baselines need train-split questions: ingest a train/ folder first "
                            "(e.g. `prompt-r1 ingest path/to/prompt-r1-data`)")
    by_ds: dict[str, list[QuestionRow]] = {}
    for q in pool:
        by_ds.setdefault(q.dataset, []).append(q)
    out: list[QuestionRow] = []
    lists = [by_ds[d] for d in sorted(by_ds)]
    i = 0
    while len(out) < min(cfg.train_questions, len(pool)):
        for lst in lists:
            if i < len(lst) and len(out) < cfg.train_questions:
                out.append(lst[i])
        i += 1
    return out


def instruction_key(method: str, env_cfg: EnvConfig, optimizer_cfg: EnvConfig, cfg: BaselinesConfig,
                    questions: list[QuestionRow]) -> str:
    """sha256 over what determines an optimised instruction; a change in any part re-optimises."""
    data = hashlib.sha256(json.dumps([[q.question_id, q.question, q.golds] for q in questions]).encode()).hexdigest()
    payload = {"method": method, "env": [endpoint_identity(env_cfg), sampling_settings(env_cfg)],
               "optimizer": [endpoint_identity(optimizer_cfg), sampling_settings(optimizer_cfg)],
               "budget": cfg.model_dump(mode="json", exclude={"optimizer"}), "train": data}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class Optimised:
    """What an optimiser returns: the instruction to evaluate, its training score, the spend."""

    method: str
    instruction: str
    train_score: float | None
    spend: dict[str, Any]
    history: list[dict[str, Any]]
    cache_key: str = ""
    cached: bool = False


def check_optimisation(budget: Budget, result: Optimised) -> bool:
    """Whether `result` may be stored for reuse: True when none of the optimisation's environment
    calls failed; False when some failed but it is still a result (each environment's share of
    failed calls within its `max_error_rate`, and a candidate scored on every training question):
    it is evaluated in this run and the next run optimises again.

    Raises `OptimisationFailed` when the failures make it no result: an environment's share of
    failed calls passes its `max_error_rate`, or failures left no candidate scored (the seed
    instruction the optimiser falls back to would stand in for an optimised one).

    >>> ok = Optimised("opro", "Think.", 0.5, {}, [])
    >>> b = Budget(10, outcomes=[("e", 0.05, None)] * 3)
    >>> check_optimisation(b, ok)
    True
    >>> b.outcomes = [("e", 0.5, None)] * 3 + [("e", 0.5, "HTTP 500")]
    >>> check_optimisation(b, ok)
    False
    >>> b.outcomes = [("e", 0.05, None)] * 3 + [("e", 0.05, "HTTP 500")]
    >>> check_optimisation(b, ok)
    Traceback (most recent call last):
    ...
    prompt_r1.evaluation.baselines.base.OptimisationFailed: opro optimisation failed: environment `e`: 1 of 4 calls failed in the opro optimisation (25% > its max_error_rate 5%); first error: HTTP 500
    """
    failed = [error for *_, error in budget.outcomes if error]
    if not failed:
        return True
    by_env: dict[str, tuple[float, list[str | None]]] = {}
    for name, limit, error in budget.outcomes:
        by_env.setdefault(name, (limit, []))[1].append(error)
    for name, (limit, errors) in by_env.items():
        try:
            check_error_rate(name, errors, limit, f"the {result.method} optimisation")
        except EnvironmentFailure as err:
            raise OptimisationFailed(f"{result.method} optimisation failed: {err}", result, err.first_error) from None
    if result.train_score is None:
        raise OptimisationFailed(
            f"{result.method} optimisation failed: no candidate instruction was scored on every training "
            f"question ({len(failed)} of {len(budget.outcomes)} calls failed); first error: {failed[0]}",
            result, failed[0])
    return False
