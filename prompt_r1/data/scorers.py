"""The scorer a question's dataset names, loaded once per process and applied to predictions.

A question's `scorer` (set at ingestion, `QuestionRow.scorer`) is an import path
(`package.module:function`, `path/to/file.py:function`; `core.scorer`), `verifiers:<env id>`, an
installed verifiers environment's rubric (`data.verifiers_env`), or `judge:<name>`, an LLM judge of
the run's `data.judges` (`data.judge`; registered by `env.judge.use_judges`). `score_many` scores a batch:
the judges' calls go out together, and a failed judgement is dropped, never a 0. The reward (`rollout.episode`),
evaluation (`evaluation.scoring`) and the prompt-optimisation baselines all score through
`answer_scorer` / `score_question`, so a dataset is scored the same way wherever it is, and every
failure is the same `ScorerError` naming the scorer and the question.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path

from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import AnswerScore, AnswerScorer, ScorerError, load_answer_scorer, resolved_spec
from prompt_r1.core.scorer_code import code_fingerprint, files_fingerprint
from prompt_r1.core.scorer_deadline import set_deadline
from prompt_r1.config.judge import judge_name
from prompt_r1.data.judge import JudgeFailure, judge_for
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
    if judge_name(question.scorer) is not None:
        return judge_for(question.scorer).score(question, prediction)
    return answer_scorer(question.scorer)(prediction, question.golds, question.metadata, question.question_id)


def score_many(items: Sequence[tuple[QuestionRow, str]]) -> list[AnswerScore | JudgeFailure]:
    """Each (question, prediction)'s `score_question`, with every judge's calls sent together first
    (`JudgeScorer.prefetch`). A failed judgement (`JudgeFailure`) is returned in its place, a dropped
    sample; any other scorer failure raises. A judge whose failures pass its environment's
    `max_error_rate` in this batch stops the run (`ScorerError` naming it and its first failure)."""
    by_judge: dict[str, list[tuple[QuestionRow, str]]] = {}
    for q, pred in items:
        if q.scorer and judge_name(q.scorer) is not None:
            by_judge.setdefault(q.scorer, []).append((q, pred))
    for spec, pairs in by_judge.items():
        judge_for(spec).prefetch(pairs)
    out: list[AnswerScore | JudgeFailure] = []
    for q, pred in items:
        try:
            out.append(score_question(q, pred))
        except JudgeFailure as err:
            out.append(err)
    for spec, pairs in by_judge.items():
        failed = [r for (q, _), r in zip(items, out) if q.scorer == spec and isinstance(r, JudgeFailure)]
        cap = judge_for(spec).cfg.environment.max_error_rate
        if failed and len(failed) / len(pairs) > cap:
            raise ScorerError(f"judge `{spec}` failed on {len(failed)} of {len(pairs)} answers, more than its "
                              f"environment's max_error_rate {cap:g}; first: {failed[0]} (a clearer rubric, a "
                              "stronger judge model, or a higher data.judges[].environment.max_error_rate)")
    return out


def check_scorers(questions: list[QuestionRow], timeout_s: float | None = None) -> None:
    """Load every scorer the questions name, so one that cannot be imported stops a run before any
    model loads (`ScorerError` naming it); `timeout_s` (`data.scorer_timeout_s`) becomes the deadline
    of every scorer call in this process (`core.scorer_deadline`). A `judge:<name>` scorer must name a
    judge registered for the process (`env.judge.use_judges`, from the run's `data.judges`)."""
    if timeout_s is not None:
        set_deadline(timeout_s)
    first: dict[str, QuestionRow] = {}
    for q in questions:
        if q.scorer:
            first.setdefault(q.scorer, q)
    for spec, q in sorted(first.items()):
        try:
            if judge_name(spec) is not None:
                judge_for(spec)
                continue
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
        if judge_name(spec) is not None:  # its rubric and environment (also in the config hash)
            out[spec] = judge_for(spec).fingerprint()
        elif spec.startswith(VERIFIERS):
            rubric = answer_scorer(spec).fn
            files = sorted({Path(f) for _, func, _ in rubric.functions
                            if (f := inspect.getsourcefile(func)) and Path(f).is_file()})
            out[spec] = files_fingerprint(files) if files else "unknown"
        else:
            out[spec] = code_fingerprint(spec) or "unknown"
    return out
