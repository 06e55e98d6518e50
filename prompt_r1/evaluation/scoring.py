"""Scored rows from predictions: one row per question and method, one cell per (environment,
method, dataset), and an agent episode as plain data.

Every method's predictions become rows the same way (`score_predictions`: EM, F1, substring match
and SSim through `core.metrics`; `score` is the dataset's primary metric, or its own scorer's
score when it names one, `data.scorers`, whose failure stops the evaluation naming the scorer and
the question). A prediction whose
environment call failed keeps its `error` and no scores: it is recorded, never scored. A cell's
means are over its scored rows, with a 95% bootstrap interval, and `errors` counts the others
(`aggregate`). `episode_record` hands an agent episode to whoever shows episodes (the flows trace
them in MLflow) without the learner's token data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prompt_r1.config.env import EnvConfig
from prompt_r1.core.metrics import score_all
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import AnswerScore
from prompt_r1.data.judge import JudgeFailure
from prompt_r1.data.scorers import score_many


@dataclass
class Prediction:
    question: QuestionRow
    method: str
    text: str
    num_turns: int = 0
    env_prompt_tokens: int = 0
    env_completion_tokens: int = 0
    trajectory: dict[str, Any] | None = None
    error: str | None = None  # the environment call failed: a failure to record, never a prediction to score


METRICS = ("score", "em", "f1", "substring", "ssim")


def _own_scores(preds: list[Prediction]) -> dict[int, AnswerScore | JudgeFailure]:
    """The dataset scorer's result of each prediction whose question names one (`data.scorers`); a
    failed LLM judgement (`JudgeFailure`) in place of a score, for the row to record as its error."""
    own = [p for p in preds if p.question.scorer]
    return {id(p): result for p, result in zip(own, score_many([(p.question, p.text) for p in own]))}


def primary_scores(predictions: list[str], questions: list[QuestionRow]) -> list[float | None]:
    """Each prediction's score under its question's scoring rule: the dataset's own scorer (an LLM
    judge's calls sent together, `score_many`), or its built-in primary metric; what the
    prompt-optimisation baselines optimise. None where an LLM judgement failed: a dropped sample,
    never a 0 (past the judge's `max_error_rate` in the batch, `score_many` stops the run)."""
    builtin = score_all(predictions, [q.golds for q in questions])
    own = [i for i, q in enumerate(questions) if q.scorer]
    results = dict(zip(own, score_many([(questions[i], predictions[i]) for i in own])))
    return [builtin[q.primary_metric][i] if i not in results
            else None if isinstance(results[i], JudgeFailure) else results[i].score
            for i, q in enumerate(questions)]


def score_predictions(preds: list[Prediction]) -> list[dict[str, Any]]:
    """Warehouse rows; a prediction whose environment call failed keeps its error and no scores, and
    so does one whose LLM judgement failed (its error says why). `score` is the primary metric's, or
    the dataset scorer's (its named parts in `parts`, JSON); a judge's verdict is in `judge`."""
    scored = [p for p in preds if p.error is None]
    own = _own_scores(scored)
    judged_out = {id(p) for p in scored if isinstance(own.get(id(p)), JudgeFailure)}
    for p in scored:
        if id(p) in judged_out:
            p.error = str(own.pop(id(p)))  # a dropped sample: recorded with its reason, never a 0
    scored = [p for p in scored if p.error is None]
    scores = score_all([p.text for p in scored], [p.question.golds for p in scored]) if scored else {}
    by_pred = {id(p): {name: scores[name][i] for name in scores} for i, p in enumerate(scored)}
    rows = []
    for p in preds:
        row = by_pred.get(id(p))
        mine = own.get(id(p))
        metrics = ({"score": mine.score if mine else row[p.question.primary_metric], **row} if row is not None
                   else dict.fromkeys(METRICS))
        metrics["parts"] = json.dumps(mine.parts, sort_keys=True) if mine and mine.parts else None
        rows.append({
            "env_name": "", "method": p.method, "dataset": p.question.dataset,
            "question_id": p.question.question_id, "prediction": p.text,
            "primary_metric": p.question.primary_metric, **metrics, "num_turns": p.num_turns,
            "env_prompt_tokens": p.env_prompt_tokens, "env_completion_tokens": p.env_completion_tokens,
            "error": p.error, "judge": _judgement(p, mine),
            "judge_failed": id(p) in judged_out,  # the judge's failure, not the environment's
        })
    return rows


def _judgement(p: Prediction, mine: AnswerScore | None) -> dict[str, Any] | None:
    """What an LLM judge said of a prediction (for its trace's feedback), or None when no judge scored it."""
    from prompt_r1.config.judge import judge_name
    from prompt_r1.data.judge import judge_for

    if mine is None or mine.note is None or not p.question.scorer or judge_name(p.question.scorer) is None:
        return None
    judge = judge_for(p.question.scorer)
    return {"name": judge.cfg.name, "model": judge.cfg.environment.model, "score": mine.score, "verdict": mine.note,
            "cost_usd": mine.parts.get("judge_cost_usd", 0.0)}


def aggregate(rows: list[dict[str, Any]], env_cfg: EnvConfig) -> list[dict[str, Any]]:
    """One result per (env, method, dataset) cell: means and the score's 95% interval over the
    scored rows, token and dollar totals over all rows, and the count of failed rows."""
    from prompt_r1.env.base import cost_usd
    from prompt_r1.evaluation.stats import bootstrap_ci, cell_seed

    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["env_name"], r["method"], r["dataset"]), []).append(r)
    out = []
    for (env_name, method, dataset), rs in sorted(cells.items()):
        ok = [r for r in rs if not r.get("error")]  # means over scored rows; failures are counted
        pt = sum(r["env_prompt_tokens"] for r in rs)
        ct = sum(r["env_completion_tokens"] for r in rs)
        ci_low, ci_high = bootstrap_ci([r["score"] for r in ok], seed=cell_seed(env_name, method, dataset))
        out.append({
            "env_name": env_name, "method": method, "dataset": dataset, "n": len(rs),
            "primary_metric": rs[0]["primary_metric"],
            **{m: (sum(r[m] for r in ok) / len(ok) if ok else None) for m in METRICS},
            "parts": _mean_parts(ok),
            "ci_low": ci_low, "ci_high": ci_high,  # 95% bootstrap over the scored questions
            "env_prompt_tokens": pt, "env_completion_tokens": ct,  # + an LLM judge's calls, at its own prices
            "cost_usd": cost_usd(env_cfg, pt, ct) + _judge_cost(rs), "errors": len(rs) - len(ok),
        })
    return out


def _judge_cost(rows: list[dict[str, Any]]) -> float:
    """What an LLM judge's calls for `rows` cost (their `judge_cost_usd` parts, `data.judge`).

    >>> _judge_cost([{"parts": '{"judge_cost_usd": 0.25}'}, {"parts": None}, {}])
    0.25
    """
    return sum(json.loads(r.get("parts") or "{}").get("judge_cost_usd", 0.0) for r in rows)


def _mean_parts(rows: list[dict[str, Any]]) -> str | None:
    """Mean of each named part of a dataset scorer over the rows that report it (JSON), or None.

    >>> _mean_parts([{"parts": '{"a": 1.0}'}, {"parts": '{"a": 0.0, "b": 2.0}'}, {"parts": None}])
    '{"a": 0.5, "b": 2.0}'
    """
    sums: dict[str, list[float]] = {}
    for r in rows:
        for name, value in json.loads(r.get("parts") or "{}").items():
            sums.setdefault(name, []).append(value)
    return json.dumps({k: sum(v) / len(v) for k, v in sorted(sums.items())}) if sums else None


EPISODE_DROPS = ("prompt_ids", "token_ids", "loss_mask", "logprobs")  # the learner's data, not a reader's


def episode_record(pred: Prediction, row: dict[str, Any]) -> dict[str, Any]:
    """One agent episode as plain data, for whoever shows episodes (the flows trace them in
    MLflow): the question and its golds, each agent turn with its wall-clock span, each
    environment call (usage, latency, start time, error; `input_cost_usd` / `output_cost_usd`
    once its environment is known), the final answer and its scores. `env_name` / `env_model` are set per environment.

    >>> from prompt_r1.core.questions import QuestionRow
    >>> q = QuestionRow("q1", "nq", "test", "Capital of France?", ["Paris"], "qa", "em")
    >>> r = episode_record(Prediction(q, "agent:base", "Paris", 1, trajectory={"agent_turns": ["t"],
    ...     "token_ids": [1, 2], "env_calls": []}), {"score": 1.0, "em": 1.0, "error": None})
    >>> r["golds"], r["trajectory"], r["env_calls"], r["score"]
    (['Paris'], {'agent_turns': ['t']}, [], 1.0)
    """
    record = pred.trajectory or {}
    trajectory = {k: v for k, v in record.items() if k not in EPISODE_DROPS and k != "env_calls"}
    return {"method": pred.method, "dataset": pred.question.dataset, "question_id": pred.question.question_id,
            "question": pred.question.question, "golds": list(pred.question.golds),
            "primary_metric": pred.question.primary_metric, "answer": pred.text, "error": pred.error,
            "env_calls": [dict(c) for c in record.get("env_calls", [])], "trajectory": trajectory,
            **{m: row.get(m) for m in METRICS}, "judge": row.get("judge")}


def examples(preds: list[Prediction], per_dataset: int) -> list[dict[str, Any]]:
    """Up to `per_dataset` agent episodes of each dataset, as the report shows them."""
    seen: dict[str, int] = {}
    out = []
    for p in preds:
        if p.trajectory is None or seen.get(p.question.dataset, 0) >= per_dataset:
            continue
        seen[p.question.dataset] = seen.get(p.question.dataset, 0) + 1
        t = p.trajectory
        out.append({"method": p.method, "dataset": p.question.dataset,
                    "question": p.question.question, "golds": p.question.golds,
                    "agent_turns": t["agent_turns"], "env_replies": t["env_replies"], "answer": t["answer"]})
    return out
