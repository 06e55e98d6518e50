"""The scorer a question's dataset names, loaded once per process and applied to predictions.

A question's `scorer` (set at ingestion, `QuestionRow.scorer`) is an import path
(`package.module:function`, `path/to/file.py:function`; `core.scorer`) or `verifiers:<env id>`, an
installed verifiers environment's rubric (`data.verifiers_env`). The reward (`rollout.episode`),
evaluation (`evaluation.scoring`) and the prompt-optimisation baselines all score through
`answer_scorer` / `score_question`, so a dataset is scored the same way wherever it is, and every
failure is the same `ScorerError` naming the scorer and the question.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from pathlib import Path

from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import AnswerScore, AnswerScorer, ScorerError, load_answer_scorer, resolved_spec
from prompt_r1.core.scorer_code import code_fingerprint, files_fingerprint
from prompt_r1.core.scorer_deadline import set_deadline
from prompt_r1.data.verifiers_env import PREFIX as VERIFIERS, RubricScorer


@functools.cache
def answer_scorer(spec: str) -> AnswerScorer:
    """The loaded scorer of `spec` (cached: a scorer module is imported, an environment loaded, once)."""
    if spec.startswith(VERIFIERS):
        try:
            return AnswerScorer(spec, RubricScorer(spec[len(VERIFIERS):]))
        except ScorerError:
            raise
        except Exception as err:  # VerifiersError (an IngestError) or the environment's own failure
            raise ScorerError(f"scorer `{spec}`: {err}") from err
    return load_answer_scorer(spec)


def score_question(question: QuestionRow, prediction: str) -> AnswerScore:
    """`question`'s dataset scorer applied to `prediction` (the question must have a scorer)."""
    if question.scorer is None:
        raise ValueError(f"question {question.question_id!r} (dataset {question.dataset}) has no scorer")
    return answer_scorer(question.scorer)(prediction, question.golds, question.metadata, question.question_id)


def check_scorers(questions: list[QuestionRow], timeout_s: float | None = None) -> None:
    """Load every scorer the questions name, so one that cannot be imported stops a run before any
    model loads (`ScorerError` naming it); `timeout_s` (`data.scorer_timeout_s`) becomes the deadline
    of every scorer call in this process (`core.scorer_deadline`)."""
    if timeout_s is not None:
        set_deadline(timeout_s)
    first: dict[str, QuestionRow] = {}
    for q in questions:
        if q.scorer:
            first.setdefault(q.scorer, q)
    for spec, q in sorted(first.items()):
        try:
            answer_scorer(spec)
        except ScorerError as err:
            raise ScorerError(f"{err} (needed by dataset {q.dataset}, e.g. question {q.question_id!r})") from err


def scorer_fingerprints(questions: Iterable[QuestionRow], *code_specs: str | None) -> dict[str, str]:
    """spec -> a hash of its code (`core.scorer_code`), for every scorer `questions` name and every
    other import path a run's rewards or rollouts call (`code_specs`: the turn scorer, the task's
    indicators, a scaffold; None is skipped): what a run depends on beside its config and pool. A
    verifiers rubric is the files of its reward functions; a spec whose file cannot be read is
    `unknown` (loading it says why)."""
    specs = {q.scorer for q in questions if q.scorer} | {resolved_spec(spec) for spec in code_specs if spec}
    out: dict[str, str] = {}
    for spec in sorted(specs):
        if spec.startswith(VERIFIERS):
            rubric = answer_scorer(spec).fn
            files = sorted({Path(f) for _, func, _ in rubric.functions
                            if (f := inspect.getsourcefile(func)) and Path(f).is_file()})
            out[spec] = files_fingerprint(files) if files else "unknown"
        else:
            out[spec] = code_fingerprint(spec) or "unknown"
    return out
