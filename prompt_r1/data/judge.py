"""An LLM judge as a dataset's scorer (`scorer: judge:<name>`, `data.judges[]`).

Some tasks have no function that scores an answer: a rewrite, a summary, an open answer. A judge
scores it by asking another LLM. Here a judge is an environment like any other: its settings are
an `EnvConfig` (`JudgeConfig.environment`), it is opened with `open_environment` and called through
the same client (its retries, deadlines, bounded concurrency), its replies go through the same
DuckDB reply cache (`reply_cache_key`, `Warehouse.cache_get/put`; the judge does the lookup itself,
so an in-process judge is cached too), and each call is priced by its own `price_per_1k_*`.

The rubric (`JudgeConfig.rubric`) is one user message with `{question}`, `{golds}` and
`{response}` filled in (`render_rubric`). The verdict is read by one rule (`parse_verdict`):
`Score: N/M` (0 <= N <= M, M > 0; also `N out of M`), `Score: x` with x in [0, 1], or the whole
reply a bare number in [0, 1]. Several score statements must agree. Anything else (no score, a
score out of range, two scores that disagree) is a `JudgeFailure`, as is a call that failed after
its retries: a failed judgement is a dropped sample (an evaluation row with an error and no score,
a training trajectory with an error and no reward), never a 0. `data.scorers.score_many` drops
them and stops the run when a batch's share of them passes the judge's `max_error_rate`.

Judging a batch is concurrent: `JudgeScorer.prefetch` sends every answer's rubric at once (the
in-process environment batches them into one `generate`; an OpenAI-compatible one runs
`concurrency` requests at a time) and keeps the replies, and each answer's score then reads its
reply from there. The replies are the judge's; reading them happens per answer, under the scorer
deadline (`data.scorer_timeout_s`).

The judge must be registered for the process (`use_judges`, by `check_scorers` from the run's
config) before a question whose scorer names it is scored.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prompt_r1.config.judge import JUDGE_PREFIX, JudgeConfig, judge_name
from prompt_r1.core.scorer import AnswerScore, ScorerError, run_awaitable
from prompt_r1.core.scorer_deadline import call_with_deadline, deadline

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

NO_GOLDS = "(none)"
_PLACEHOLDER = re.compile(r"\{(question|golds|response)\}")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?![\w])"
_BARE = re.compile(rf"\s*({_NUMBER})\s*")
_STATED = re.compile(rf"\bscore\b[\s*:=]*(?:is\s+)?({_NUMBER})(?:\s*(?:/|out\s+of)\s*({_NUMBER}))?", re.IGNORECASE)


class JudgeFailure(ScorerError):
    """A judgement that did not happen: the judge's call failed after its retries, or its verdict
    states no readable score. The sample is dropped (an error), never scored 0."""


def render_rubric(rubric: str, question: str, golds: Sequence[str], response: str) -> str:
    """The rubric with `{question}`, `{golds}` (one per line, `(none)` without any) and `{response}`
    filled in, in one pass (text filled in is never filled again; other braces stay as written).

    >>> render_rubric("Q: {question}\\nG: {golds}\\nR: {response} {x}", "2+2?", ["4", "four"], "{golds}")
    'Q: 2+2?\\nG: 4\\nfour\\nR: {golds} {x}'
    >>> render_rubric("{golds}|{response}", "q", [], "r")
    '(none)|r'
    """
    values = {"question": question, "golds": "\n".join(golds) if golds else NO_GOLDS, "response": response}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], rubric)


def parse_verdict(text: str) -> float:
    """The score in [0, 1] a verdict states, or a `JudgeFailure` saying why it states none.

    >>> parse_verdict("Score: 7/10"), parse_verdict("0.25"), parse_verdict("**Score:** 3 out of 4.")
    (0.7, 0.25, 0.75)
    >>> parse_verdict("Good answer. Score: 1")
    1.0
    >>> parse_verdict("I think it is fine")
    Traceback (most recent call last):
    ...
    prompt_r1.data.judge.JudgeFailure: the verdict states no score (want `Score: N/M`, `Score: x` with x in [0, 1], or a bare number in [0, 1]): 'I think it is fine'
    >>> parse_verdict("Score: 7")
    Traceback (most recent call last):
    ...
    prompt_r1.data.judge.JudgeFailure: the verdict's score 7 is not in [0, 1] (write N/M for another scale): 'Score: 7'
    """
    shown = repr(text if len(text) <= 200 else text[:197] + "...")
    bare = _BARE.fullmatch(text)
    if bare:
        return _in_unit(float(bare.group(1)), bare.group(1), shown)
    values = []
    for m in _STATED.finditer(text):
        x, y = m.group(1), m.group(2)
        if y is None:
            values.append(_in_unit(float(x), x, shown))
            continue
        num, den = float(x), float(y)
        if not (den > 0 and 0 <= num <= den):
            raise JudgeFailure(f"the verdict's score {x}/{y} is not a share (want 0 <= N <= M, M > 0): {shown}")
        values.append(num / den)
    if not values:
        raise JudgeFailure("the verdict states no score (want `Score: N/M`, `Score: x` with x in [0, 1], or a bare "
                           f"number in [0, 1]): {shown}")
    if any(not math.isclose(v, values[0], abs_tol=1e-9) for v in values):
        raise JudgeFailure(f"the verdict states scores that disagree ({', '.join(f'{v:g}' for v in values)}): {shown}")
    return values[0]


def _in_unit(value: float, written: str, shown: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise JudgeFailure(f"the verdict's score {written} is not in [0, 1] (write N/M for another scale): {shown}")
    return value


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
        self.warehouse = warehouse if cfg.environment.cache else None
        self._stack = contextlib.ExitStack()
        self._env: Any = None
        self._open_lock = threading.Lock()
        self._replies: dict[str, Verdict] = {}  # cache key -> reply, for this process (prefetched or called)
        self.model_calls = 0  # replies the judge model wrote (not the cache), for tests and reports

    def fingerprint(self) -> str:
        """A hash of everything that changes a verdict: the rubric and the judge's environment."""
        data = json.dumps(self.cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    # -- the environment ---------------------------------------------------------------------
    def environment(self) -> Any:
        """The judge's environment, opened once (a managed vLLM server starts here, stops at `close`)."""
        with self._open_lock:
            if self._env is None:
                from prompt_r1.env import open_environment

                # the judge looks the reply cache up itself (any kind), so the client gets none
                self._env = self._stack.enter_context(open_environment(self.cfg.environment))
            return self._env

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
        from prompt_r1.env.base import reply_cache_key

        return reply_cache_key(self.cfg.environment, messages)

    # -- calls -------------------------------------------------------------------------------
    def _lookup(self, key: str) -> Verdict | None:
        """A reply this process already has, or the reply cache's (which then stands for the call)."""
        if key in self._replies:
            return self._replies[key]
        if self.warehouse is None:
            return None
        try:
            hit = self.warehouse.cache_get(key)
        except Exception as err:  # a cache problem must not fail the judgement
            log.warning("judge %s: reply cache read failed: %s", self.cfg.name, err)
            return None
        if hit is None:
            return None
        verdict = self._replies[key] = Verdict(hit[0], int(hit[1]), int(hit[2]), cached=True)
        return verdict

    async def _call(self, env: Any, key: str, messages: list[dict[str, str]]) -> Verdict:
        """One call of the judge's environment (its retries and deadlines); a success is kept and cached."""
        reply = await env.reply(messages)
        call = reply.call
        if call.error is not None:  # not kept: a later call tries again
            return Verdict("", call.prompt_tokens, call.completion_tokens, error=call.error)
        self.model_calls += 1
        verdict = self._replies[key] = Verdict(reply.text, call.prompt_tokens, call.completion_tokens)
        if self.warehouse is not None:
            try:
                self.warehouse.cache_put(key, self.cfg.environment.model, reply.text, call.prompt_tokens,
                                         call.completion_tokens)
            except Exception as err:
                log.warning("judge %s: reply cache write failed: %s", self.cfg.name, err)
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
                if key not in pending and self._lookup(key) is None:
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
        from prompt_r1.env.base import cost_usd

        if not prediction.strip():
            return AnswerScore(0.0)
        where = f"judge `{self.cfg.name}` for question {question.question_id!r}"
        messages = self.messages(question, prediction)
        key = self._key(messages)
        verdict = self._lookup(key)
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


# -- the process's judges (from the run's config) -----------------------------------------------
_judges: dict[str, JudgeScorer] = {}
_registry_lock = threading.Lock()


def use_judges(judges: Sequence[JudgeConfig], warehouse: "Warehouse | None" = None) -> None:
    """Make `judges` (`data.judges`) the ones a `judge:<name>` scorer names in this process. A judge
    whose settings are unchanged keeps its open environment and its replies; a changed or dropped one
    is closed."""
    with _registry_lock:
        wanted = {j.name: j for j in judges}
        for name in list(_judges):
            old = _judges[name]
            if name not in wanted or old.cfg != wanted[name]:
                old.close()
                del _judges[name]
        for name, cfg in wanted.items():
            if name not in _judges:
                _judges[name] = JudgeScorer(cfg, warehouse)
            elif warehouse is not None and cfg.environment.cache:
                _judges[name].warehouse = warehouse


def judge_for(spec: str) -> JudgeScorer:
    """The registered judge a `judge:<name>` spec names, or a `ScorerError` saying how to declare it."""
    name = judge_name(spec)
    if name is None:
        raise ValueError(f"{spec!r} names no judge")
    judge = _judges.get(name)
    if judge is None:
        raise ScorerError(f"scorer `{spec}`: no judge named `{name}` in data.judges (this run's config has "
                          f"{sorted(_judges) or 'none'}); add one with that name and a rubric")
    return judge


def close_judges() -> None:
    """Close every judge's environment (a managed server stops)."""
    with _registry_lock:
        for judge in _judges.values():
            judge.close()
        _judges.clear()


atexit.register(close_judges)
