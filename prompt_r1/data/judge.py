"""An LLM judge as a dataset's scorer (`scorer: judge:<name>`, `data.judges[]`): the rubric, the
verdict rule, the failure that is never a 0, and the process's judges.

Some tasks have no function that scores an answer: a rewrite, a summary, an open answer. A judge
scores it by asking another LLM. Here a judge is an environment like any other: its settings are
an `EnvConfig` (`JudgeConfig.environment`), it is opened with `open_environment` and called through
the same client (its retries, deadlines, bounded concurrency), its replies go through the one reply
cache of every environment (`env.base.ReplyCache`, any kind, in-process included), and each call is
priced by its own `price_per_1k_*`.

The rubric (`JudgeConfig.rubric`) is one user message with `{question}`, `{golds}` and
`{response}` filled in (`render_rubric`). The verdict is read by one rule (`parse_verdict`):
`Score: N/M` (0 <= N <= M, M > 0; also `N out of M`), `Score: x` with x in [0, 1], or the whole
reply a bare number in [0, 1]. Several score statements must agree. Anything else (no score, a
score out of range, two scores that disagree) is a `JudgeFailure`, as is a call that failed after
its retries: a failed judgement is a dropped sample (an evaluation row with an error and no score,
a training trajectory with an error and no reward), never a 0. `data.scorers.score_many` drops
them and stops the run when a batch's share of them passes the judge's `max_error_rate`.

The judge itself (`env.judge.JudgeScorer`, an environment's client) is one layer up; this module
holds what scoring needs of it, so `data.scorers` can name it: the judges of this process (filled by
`env.judge.use_judges` from the run's config, looked up by `judge_for`). Judging a batch is
concurrent: `JudgeScorer.prefetch` sends every answer's rubric at once (the
in-process environment batches them into one `generate`; an OpenAI-compatible one runs
`concurrency` requests at a time) and keeps the replies, and each answer's score then reads its
reply from there. The replies are the judge's; reading them happens per answer, under the scorer
deadline (`data.scorer_timeout_s`).

A judge must be registered for the process (`env.judge.use_judges`, by training and evaluation
from the run's config) before a question whose scorer names it is scored.
"""

from __future__ import annotations

import atexit
import math
import re
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from prompt_r1.config.judge import JudgeConfig, judge_name
from prompt_r1.core.scorer import AnswerScore, ScorerError

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow

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


# -- the process's judges (from the run's config) -----------------------------------------------
class Judge(Protocol):
    """What scoring needs of a judge (`env.judge.JudgeScorer`)."""

    cfg: JudgeConfig

    def score(self, question: "QuestionRow", prediction: str) -> AnswerScore: ...

    def prefetch(self, items: Iterable[tuple["QuestionRow", str]]) -> None: ...

    def fingerprint(self) -> str: ...

    def close(self) -> None: ...


_judges: dict[str, Judge] = {}
registry_lock = threading.Lock()


def registered() -> dict[str, Judge]:
    """The judges of this process by name (the registry itself: hold `registry_lock` to change it)."""
    return _judges


def judge_for(spec: str) -> Judge:
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
    """Close every judge's environment (a managed server stops) and forget them."""
    with registry_lock:
        for judge in _judges.values():
            judge.close()
        _judges.clear()


atexit.register(close_judges)
