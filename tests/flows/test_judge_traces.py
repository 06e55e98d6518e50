"""An LLM judge's score on an evaluation trace (`tasks.tracking.traces`): an episode that a judge
scored carries its score as feedback from an LLM judge, with the verdict as the rationale and the
judge's model as the source, beside the score feedback every scored episode has; an episode no
judge scored carries none."""

from __future__ import annotations

import pytest


def _episode(judge: dict | None) -> dict:
    t = 1_700_000_000.0
    return {"env_name": "e", "env_model": "m", "method": "direct", "dataset": "rewrites", "question_id": "q1",
            "question": "Rewrite politely: Send me the report now.", "golds": ["Could you please send me the report?"],
            "primary_metric": "f1", "answer": "Please send the report.", "error": None,
            "score": 0.8 if judge else 0.5, "em": 0.0, "f1": 0.5, "substring": 0.0, "ssim": None, "env_calls": [],
            "trajectory": {"agent_turns": [], "env_replies": [], "turn_times": [[t, t + 1.0]], "stop_reason": "answered",
                           "policy_version": 0}, "judge": judge}


def test_a_judged_episode_has_the_judges_score_as_feedback_on_its_trace(home):
    import mlflow

    from tasks.tracking.runs import setup_mlflow
    from tasks.tracking.traces import trace_episodes

    setup_mlflow("judge-traces")
    judge = {"name": "judge", "model": "smollm2-135m-instruct", "score": 0.8, "verdict": "Score: 8/10",
             "cost_usd": 0.0012}
    with mlflow.start_run():
        judged_id, plain_id = trace_episodes([_episode(judge), _episode(None)])
    mlflow.flush_trace_async_logging()
    judged = {a.name: a for a in mlflow.get_trace(judged_id).info.assessments}
    feedback = judged["judge:judge"]
    assert feedback.value == pytest.approx(0.8) and feedback.rationale == "Score: 8/10"
    assert feedback.source.source_type == "LLM_JUDGE" and feedback.source.source_id == "smollm2-135m-instruct"
    assert float(feedback.metadata["judge_cost_usd"]) == pytest.approx(0.0012)
    assert judged["score"].value == pytest.approx(0.8)
    assert {a.name for a in mlflow.get_trace(plain_id).info.assessments} == {"gold_answers", "score"}
