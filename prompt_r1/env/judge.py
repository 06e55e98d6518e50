"""The LLM judge's client: a `data.judges[]` entry called as an environment (`data.judge` holds the
rubric, the verdict rule and the process's judges; this module the calls).

A judge is an environment like any other: its settings are an `EnvConfig`
(`JudgeConfig.environment`), it is opened with `open_environment` once per process and called through
the same client (its retries, deadlines, bounded concurrency), its replies go through the one reply
cache of every environment (`env.base.ReplyCache`: the environment is opened with the run's warehouse, so
an in-process judge is cached too; before opening it the judge asks that cache which answers need a
call at all, so a rerun the cache answers never loads the judge model), and each call is priced by
its own `price_per_1k_*` (`cost_usd`).

`use_judges(cfg.data.judges, warehouse)` makes a run's judges the ones `judge:<name>` names; training
and evaluation call it before checking their scorers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prompt_r1.config.judge import JUDGE_PREFIX, JudgeConfig
from prompt_r1.core.scorer import AnswerScore, run_awaitable
from prompt_r1.core.scorer_deadline import call_with_deadline, deadline
from prompt_r1.data.judge import JudgeFailure, parse_verdict, registered, registry_lock, render_rubric
from prompt_r1.env.base import ReplyCache, cost_usd, sent_key

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """One judge reply: its text, usage, and whether the reply cache answered it."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False
    error: str | None = None  # the call failed after its retries


class JudgeScorer:
    """One judge of `data.judges`: renders the rubric, calls the judge's environment (opened on first
    use), caches and prices its replies, and reads each verdict."""

    def __init__(self, cfg: JudgeConfig, warehouse: "Warehouse | None" = None):
        self.cfg = cfg
        self.spec = f"{JUDGE_PREFIX}{cfg.name}"
        self.warehouse = warehouse
        self.cache = ReplyCache.of(cfg.environment, warehouse)  # the environment's own (read before opening it)
        self._stack = contextlib.ExitStack()
        self._env: Any = None
        self._open_lock = threading.Lock()
        self._replies: dict[str, Verdict] = {}  # cache key -> reply, for this process (prefetched or called)
        self.model_calls = 0  # replies the judge model wrote (not the cache), for tests and reports

    def fingerprint(self) -> str:
        """A hash of everything that changes a verdict: the rubric and the judge's environment, by the
        config hash's own rule (`config.identity`: where and how fast it runs is left out)."""
        from prompt_r1.config.identity import identity_data

        data = json.dumps(identity_data(self.cfg), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    # -- the environment ---------------------------------------------------------------------
    def environment(self) -> Any:
        """The judge's environment, opened once with the warehouse (its replies cached as every
        environment's); a managed vLLM server starts here, stops at `close`."""
        with self._open_lock:
            if self._env is None:
                from prompt_r1.env import open_environment

                self._env = self._stack.enter_context(open_environment(self.cfg.environment, self.warehouse))
            return self._env

    def use_warehouse(self, warehouse: "Warehouse") -> None:
        """Cache this judge's replies in `warehouse` from now on (an open environment's too)."""
        self.warehouse, self.cache = warehouse, ReplyCache.of(self.cfg.environment, warehouse)
        if self._env is not None:
            self._env.cache = self.cache

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            with contextlib.suppress(Exception):
                run_awaitable(env.aclose())
        self._stack.close()

    def messages(self, question: "QuestionRow", prediction: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": render_rubric(self.cfg.rubric, question.question, question.golds,
                                                          prediction.strip())}]

    def _key(self, messages: list[dict[str, str]]) -> str:
        return sent_key(self.cfg.environment, messages)

    # -- calls -------------------------------------------------------------------------------
    def _lookup(self, key: str, messages: list[dict[str, str]]) -> Verdict | None:
        """A reply this process already has, or the reply cache's (which then stands for the call):
        asked before the environment opens, so a cached judgement loads no model."""
        if key in self._replies:
            return self._replies[key]
        hit = self.cache.get(messages) if self.cache is not None else None
        if hit is None:
            return None
        verdict = self._replies[key] = Verdict(hit[0], int(hit[1]), int(hit[2]), cached=True)
        return verdict

    async def _call(self, env: Any, key: str, messages: list[dict[str, str]]) -> Verdict:
        """One call of the judge's environment (its retries, deadlines and reply cache); a success is kept."""
        reply = await env.reply(messages)
        call = reply.call
        if call.error is not None:  # not kept: a later call tries again
            return Verdict("", call.prompt_tokens, call.completion_tokens, error=call.error)
        self.model_calls += not call.cached
        verdict = self._replies[key] = Verdict(reply.text, call.prompt_tokens, call.completion_tokens,
                                               cached=call.cached)
        return verdict

    def prefetch(self, items: Iterable[tuple["QuestionRow", str]]) -> None:
        """Ask the judge about every (question, answer) the cache cannot answer, all at once, and keep
        the replies; a blank answer is never sent (it scores 0 without a call). The environment opens
        first (a model load is no judgement's time); the calls then get the scorer deadline per round of
        `concurrency`. A failure here is not raised: that answer's `score` asks again and reports it."""
        pending: dict[str, list[dict[str, str]]] = {}
        for q, p in items:
            if p.strip():
                messages = self.messages(q, p)
                key = self._key(messages)
                if key not in pending and self._lookup(key, messages) is None:
                    pending[key] = messages
        if not pending:
            return
        env = self.environment()

        async def ask_all() -> None:
            import asyncio

            await asyncio.gather(*(self._call(env, k, m) for k, m in pending.items()), return_exceptions=True)

        rounds = -(-len(pending) // max(1, self.cfg.environment.concurrency))
        try:
            call_with_deadline(lambda: run_awaitable(ask_all()), f"{self.spec} judging {len(pending)} answers",
                               JudgeFailure, timeout_s=deadline() * rounds)
        except Exception as err:
            log.warning("judge %s: batch of %d judgements failed (each is asked again): %s",
                        self.cfg.name, len(pending), err)

    def score(self, question: "QuestionRow", prediction: str) -> AnswerScore:
        """The judged score of one answer, with the judgement's usage and cost as parts and the verdict as
        its note; a `JudgeFailure` when the call failed or the verdict states no score."""
        if not prediction.strip():
            return AnswerScore(0.0)
        where = f"judge `{self.cfg.name}` for question {question.question_id!r}"
        messages = self.messages(question, prediction)
        key = self._key(messages)
        verdict = self._lookup(key, messages)
        if verdict is None:
            env = self.environment()  # opened outside the deadline: a model load is no judgement's time
            verdict = call_with_deadline(lambda: run_awaitable(self._call(env, key, messages)), where, JudgeFailure)
        if verdict.error is not None:
            raise JudgeFailure(f"{where}: the judge's call failed: {verdict.error}")
        try:
            value = parse_verdict(verdict.text)
        except JudgeFailure as err:
            raise JudgeFailure(f"{where}: {err}") from None
        env = self.cfg.environment
        parts = {"judge_prompt_tokens": float(verdict.prompt_tokens),
                 "judge_completion_tokens": float(verdict.completion_tokens),
                 "judge_cost_usd": cost_usd(env, verdict.prompt_tokens, verdict.completion_tokens)}
        return AnswerScore(value, parts, note=verdict.text)


def use_judges(judges: Sequence[JudgeConfig], warehouse: "Warehouse | None" = None) -> None:
    """Make `judges` (`data.judges`) the ones a `judge:<name>` scorer names in this process, their
    replies cached in `warehouse`. A judge whose settings are unchanged keeps its open environment and
    its replies; a changed or dropped one is closed."""
    with registry_lock:
        current = registered()
        wanted = {j.name: j for j in judges}
        for name in list(current):
            if name not in wanted or current[name].cfg != wanted[name]:
                current.pop(name).close()
        for name, cfg in wanted.items():
            if name not in current:
                current[name] = JudgeScorer(cfg, warehouse)
            elif warehouse is not None:
                current[name].use_warehouse(warehouse)
