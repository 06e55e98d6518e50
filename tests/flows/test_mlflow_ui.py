"""What a user of the MLflow UI finds after an evaluation, checked through MLflow's Python client:
the experiment marked as model training, runs tagged and carrying one headline metric per suite
under the same name for every environment, agent episodes as traces (spans, token usage, cost,
gold and score as assessments; failed environment calls as failed spans), capped and spread
evenly, and the results table; `ask --trace` / `serve --trace` episodes as traces.
"""

from __future__ import annotations

import json
import random
import time

import pytest

SMOKE_ENVS = [  # two environment LLMs, so "the same metric name for every environment" means something
    {"name": "tiny-env", "kind": "inprocess", "model": "tiny", "max_tokens": 16, "temperature": 0.0},
    {"name": "tiny-smollm2-env", "kind": "inprocess", "model": "tiny-smollm2", "max_tokens": 16, "temperature": 0.0,
     "price_per_1k_prompt": 0.15, "price_per_1k_completion": 0.6},
]


def _client():
    import mlflow
    from mlflow import MlflowClient

    from tasks.tracking.runs import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    return MlflowClient()


def test_pick_evenly_matches_an_independent_statement():
    """At most k indices, all distinct and in range, the first one 0, consecutive gaps differing
    by at most one (evenly spread), and every index when k >= n."""
    from tasks.tracking.traces import pick_evenly

    rng = random.Random(0)
    for _ in range(2000):
        n, k = rng.randrange(0, 300), rng.randrange(0, 300)
        got = pick_evenly(n, k)
        assert len(got) == min(n, k) and got == sorted(set(got)) and all(0 <= i < n for i in got)
        if k >= n:
            assert got == list(range(n))
        elif k:
            gaps = [b - a for a, b in zip(got, got[1:])] + [n - got[-1] + got[0]]  # wrapping gap included
            assert got[0] == 0 and max(gaps) - min(gaps) <= 1


def _episode(error: str | None = None) -> dict:
    t = 1_700_000_000.0
    turns = ["<think>t</think><interaction_prompt>Who wrote Hamlet?</interaction_prompt>",
             "<think>t</think><answer>Shakespeare</answer>"]
    call = {"turn": 0, "env_name": "e", "model": "m", "prompt_tokens": 12, "completion_tokens": 4,
            "latency_s": 0.5, "attempts": 1, "cached": False, "error": error, "started_at": t + 1.0,
            "input_cost_usd": 0.0012, "output_cost_usd": 0.0024}
    return {"env_name": "e", "env_model": "m", "method": "agent:base", "dataset": "nq", "question_id": "q1",
            "question": "Who wrote Hamlet?", "golds": ["Shakespeare"], "primary_metric": "em",
            "answer": "" if error else "Shakespeare", "error": error,
            "score": None if error else 1.0, "em": None if error else 1.0, "f1": None, "substring": None, "ssim": None,
            "env_calls": [call],
            "trajectory": {"agent_turns": turns[:1] if error else turns, "env_replies": [] if error else ["Shakespeare."],
                           "turn_times": [[t, t + 1.0]] if error else [[t, t + 1.0], [t + 1.5, t + 2.0]],
                           "stop_reason": "env_error" if error else "answered", "policy_version": 0}}


def test_an_episode_becomes_a_trace_and_a_failed_call_a_failed_span(home):
    import mlflow

    from tasks.tracking.traces import trace_episodes
    from tasks.tracking.runs import setup_mlflow

    setup_mlflow("t")
    with mlflow.start_run() as run:
        ok_id, failed_id = trace_episodes([_episode(), _episode(error="HTTP 500: overloaded")])
    mlflow.flush_trace_async_logging()
    ok, failed = mlflow.get_trace(ok_id), mlflow.get_trace(failed_id)
    assert ok.info.trace_metadata["mlflow.sourceRun"] == run.info.run_id
    assert [(s.name, s.span_type) for s in ok.data.spans] == [
        ("episode", "AGENT"), ("agent turn 1", "CHAT_MODEL"), ("environment call 1", "LLM"), ("agent turn 2", "CHAT_MODEL")]
    llm = ok.data.spans[2]
    assert llm.get_attribute("mlflow.llm.model") == "m"
    assert llm.inputs["interaction_prompt"] == "Who wrote Hamlet?" and llm.outputs == {"reply": "Shakespeare."}
    assert ok.info.token_usage == {"input_tokens": 12, "output_tokens": 4, "total_tokens": 16}
    assert llm.get_attribute("mlflow.llm.cost")["total_cost"] == pytest.approx(0.0036)
    assert llm.start_time_ns == 1_700_000_001 * 10**9 and llm.end_time_ns == 1_700_000_001_500_000_000
    assert ok.info.state.value == "OK" and ok.data.spans[0].outputs == {"answer": "Shakespeare"}
    assessments = {a.name: a for a in ok.info.assessments}
    assert assessments["score"].value == 1.0 and assessments["gold_answers"].value == ["Shakespeare"]
    # the failure: an ERROR span with its reason and no reply, a trace in ERROR, no score
    assert failed.info.state.value == "ERROR"
    call = next(s for s in failed.data.spans if s.span_type == "LLM")
    assert call.status.status_code.value == "ERROR" and call.status.description == "HTTP 500: overloaded"
    assert call.outputs is None and failed.data.spans[0].outputs == {"answer": None}
    assert {a.name for a in failed.info.assessments} == {"gold_answers"}


def test_experiment_kind_is_set_once_and_a_users_choice_stays(home):
    from tasks.tracking.runs import EXPERIMENT_KIND, MODEL_TRAINING, setup_mlflow

    exp_id = setup_mlflow("kinds")
    client = _client()
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND] == MODEL_TRAINING
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND, "genai_development")  # the user switches in the UI
    setup_mlflow("kinds")
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND] == "genai_development"


@pytest.mark.slow
def test_smoke_evaluation_is_seen_in_mlflow_as_a_user_would(home):
    """The evaluate flow on configs/smoke.yaml (tiny models, two in-process environments)."""
    import mlflow
    from prefect.testing.utilities import prefect_test_harness

    from flows.evaluate import evaluate_flow
    from tasks.tracking.eval_runs import RESULTS_TABLE
    from tasks.tracking.runs import COMPARE_VIEW, EXPERIMENT_KIND, MODEL_TRAINING, SHARED_VIEW_PREFIX, compare_url

    cap = 3
    overrides = {"eval.agent_checkpoints": ["base"], "eval.environments": SMOKE_ENVS, "eval.trace_episodes": cap}
    started = time.time()
    with prefect_test_harness(server_startup_timeout=180):
        result = evaluate_flow("configs/smoke.yaml", overrides=overrides)
    client = _client()
    exp = client.get_experiment_by_name("smoke")
    assert exp.tags[EXPERIMENT_KIND] == MODEL_TRAINING

    runs = client.search_runs([exp.experiment_id], max_results=200)
    method_runs = [r for r in runs if r.data.tags.get("method") not in (None, "all")]
    assert {(r.data.tags["env_model"], r.data.tags["method"]) for r in method_runs} == {
        (env["model"], m) for env in SMOKE_ENVS for m in ("direct", "cot", "agent:base", "agent_only:base")}
    for r in method_runs:  # one headline metric per suite, one name for every environment
        assert -1.0 <= r.data.metrics["headline/sample"] <= 1.0, r.info.run_name  # SSim is a cosine
        assert ("agent_checkpoint" in r.data.tags) == (":" in r.data.tags["method"])
        # no agent:trained: the smoke config's own training pool (tiny-env) is what was trained on
        assert r.data.tags["held_out"] == ("false" if r.data.tags["env_name"] == "tiny-env" else "true")
        assert ("usd_per_correct" in r.data.metrics) == (r.data.metrics["correct"] > 0)
    # the saved comparison view the demo's address opens: its filter finds one run per environment,
    # each holding the headline of every method under the same names
    view = json.loads(exp.tags[SHARED_VIEW_PREFIX + COMPARE_VIEW])
    in_view = client.search_runs([exp.experiment_id], view["searchFilter"], max_results=200)
    assert sorted(r.data.tags["env_model"] for r in in_view) == sorted(env["model"] for env in SMOKE_ENVS)
    for r in in_view:
        assert {k for k in r.data.metrics if "headline" in k} == {
            f"{m}/headline-sample" for m in ("direct", "cot", "agent-base", "agent_only-base")}
    assert [k["groupByData"] for k in view["groupBy"]["groupByKeys"]] == ["env_model"]
    assert "workflowType=machine_learning" in compare_url(exp.experiment_id)
    agent_run = next(r for r in method_runs if r.data.tags["method"] == "agent:base")
    assert agent_run.data.tags["agent_checkpoint"] == result["agents"]["base"]

    traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list", max_results=100)
    by_env = {env["model"]: [t for t in traces if t.info.tags.get("env_model") == env["model"]] for env in SMOKE_ENVS}
    assert {m: len(ts) for m, ts in by_env.items()} == {env["model"]: cap for env in SMOKE_ENVS}  # the cap, per env
    agent_runs = {r.data.tags["env_model"]: r.info.run_id for r in method_runs if r.data.tags["method"] == "agent:base"}
    for model, ts in by_env.items():
        for t in ts:
            assert t.info.trace_metadata["mlflow.sourceRun"] == agent_runs[model]
            assert t.info.request_time >= started * 1000 - 1  # real wall-clock times, not a made-up timeline
            spans = t.data.spans
            assert spans[0].span_type == "AGENT" and any(s.span_type == "CHAT_MODEL" for s in spans)
            for s in (s for s in spans if s.span_type == "LLM"):
                assert s.get_attribute("mlflow.llm.model") == model
                assert s.get_attribute("mlflow.chat.tokenUsage")["input_tokens"] > 0
            names = {a.name for a in t.info.assessments}
            assert "gold_answers" in names and ("score" in names or t.info.state.value == "ERROR")
    priced = [s for t in by_env["tiny-smollm2"] for s in t.data.spans if s.span_type == "LLM"]
    assert all(s.get_attribute("mlflow.llm.cost")["total_cost"] > 0 for s in priced)

    table = client.load_table(exp.experiment_id, RESULTS_TABLE, run_ids=[result["run_id"]])
    assert len(table) == len(result["results"]) == 2 * 4 * 4  # environments x methods x sample datasets
    assert {"env_model", "held_out", "method", "dataset", "score", "ci_low", "ci_high", "n", "cost_usd"} <= set(table.columns)


def _traces(experiment: str):
    import mlflow

    mlflow.flush_trace_async_logging()
    exp = _client().get_experiment_by_name(experiment)
    return mlflow.search_traces(locations=[exp.experiment_id], return_type="list", max_results=100)


def test_ask_traces_its_episode_only_when_asked(home):
    from typer.testing import CliRunner

    from flows.cli import app  # the entry point: it registers the MLflow episode observer

    question = "Which river flows through Paris?"
    plain = CliRunner().invoke(app, ["ask", question, "-c", "configs/smoke.yaml", "--json"])
    assert plain.exit_code == 0, plain.output
    assert not (home / "mlflow.db").exists()  # no flag, no tracking store touched
    traced = CliRunner().invoke(app, ["ask", question, "-c", "configs/smoke.yaml", "--json", "--trace"])
    assert traced.exit_code == 0, traced.output
    (trace,) = _traces("smoke")
    assert trace.info.tags["method"] == "ask" and trace.info.tags["env_model"] == "tiny"
    assert trace.data.spans[0].inputs == {"question": question}
    assert trace.data.spans[0].outputs == {"answer": json.loads(traced.stdout)["answer"]}
    assert trace.info.assessments == []  # a user's question has no gold and no score


def test_serve_traces_a_failed_episode_as_a_failed_trace(home):
    import openai

    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.config.experiment import load_config
    from prompt_r1.serving.http import ServeConfig, create_app
    import flows.cli  # noqa: F401  (the entry point registers its MLflow episode observer)
    from tests.serving.test_ask_serve import LiveServer, free_port

    cfg = load_config("configs/smoke.yaml", {
        "environment": {"name": "dead-env", "kind": "openai", "model": "m",
                        "base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 0, "timeout_s": 2}})
    app, server = create_app(cfg, resolve_agent("tiny-protocol"), ServeConfig(trace=True))
    try:
        with LiveServer(app) as running:
            client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=120)
            with pytest.raises(openai.APIStatusError, match="environment 'dead-env' failed"):
                client.chat.completions.create(model="prompt-r1:dead-env",
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
    finally:
        server.policy.close()
    (trace,) = _traces("smoke")
    assert trace.info.state.value == "ERROR" and trace.info.tags["method"] == "serve"
    failed = [s for s in trace.data.spans if s.span_type == "LLM"]
    assert failed and failed[-1].status.status_code.value == "ERROR" and failed[-1].outputs is None
