"""Agent episodes as MLflow traces, so the MLflow UI shows what the agent asked, what each
environment replied, what it cost and how it scored.

The library hands over plain data (`prompt_r1.evaluation.scoring.episode_record`: turns with
their wall-clock spans, environment calls with usage, latency, cost and error, answer, golds,
scores); this module turns one record into one trace after the episode has run, so evaluation
itself carries no traces work. A trace is:

- a root `AGENT` span `episode` (inputs: the question; outputs: the final answer), tagged
  `env_name`, `env_model`, `method`, `dataset`, `question_id`;
- one `CHAT_MODEL` span per agent turn (its text);
- one `LLM` span per environment call, with the model (`mlflow.llm.model`), token usage
  (`mlflow.chat.tokenUsage`) and cost (`mlflow.llm.cost`) that MLflow sums per trace; a failed
  call is a span with status ERROR and its error, never a reply;
- assessments: the gold answers as an expectation, the score (the dataset's primary metric) as
  feedback from code, and where an LLM judge scored the answer (`data.judges`) its score as
  feedback from an LLM judge (`judge:<name>`, the verdict as its rationale, the judge's model as
  its source). An episode ended by a failed call has no score: its trace is in ERROR.

`pick_evenly` bounds the work: at most `eval.trace_episodes` traces per environment run.
Training rollouts (`prompt_r1.training.rollout_traces`, `tracking.trace_rollouts` a step) are
traces of the same shape, `method` `train-rollout`, with their own tags (`step`, `reward`,
`advantage`, `environment`, `group_index`, `policy_version`) and the reward as feedback.
`trace_answer` does the same for an `ask` / `serve` episode (`--trace`; no gold, no score).
"""

from __future__ import annotations

import json
from typing import Any

import mlflow
from mlflow.entities import AssessmentSource, SpanStatusCode, SpanType
from mlflow.tracing.constant import SpanAttributeKey
from mlflow.tracing.provider import detach_span_from_context, set_span_in_context

from prompt_r1.core.protocol import parse_turn

SCORER = AssessmentSource(source_type="CODE", source_id="prompt_r1.core.metrics")
REWARD = AssessmentSource(source_type="CODE", source_id="prompt_r1.core.reward")
NS = 1_000_000_000


def pick_evenly(n: int, k: int) -> list[int]:
    """At most `k` of the indices 0..n-1, spread evenly (the first always in).

    >>> pick_evenly(10, 3), pick_evenly(2, 5), pick_evenly(5, 0)
    ([0, 3, 6], [0, 1], [])
    """
    if k >= n:
        return list(range(n))
    return [i * n // k for i in range(k)]


def episodes_to_trace(episodes: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """The episodes of one environment to trace: `cap` of them, evenly over method, dataset and
    question order (so every method and dataset is seen when the cap allows)."""
    ordered = sorted(episodes, key=lambda e: (e["method"], e["dataset"], e["question_id"]))
    return [ordered[i] for i in pick_evenly(len(ordered), cap)]


def _ns(seconds: float) -> int:
    return int(seconds * NS)


def _timeline(episode: dict[str, Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(start, end) in ns of each agent turn and each environment call, from the recorded wall
    clock; records without one (older rows) are laid end to end from time zero, agent turns of
    no length and calls of their latency."""
    traj, calls = episode["trajectory"], episode["env_calls"]
    turns = [(_ns(a), _ns(b)) for a, b in traj.get("turn_times") or []]
    spans = [(_ns(c["started_at"]), _ns(c["started_at"] + c["latency_s"])) for c in calls if c.get("started_at")]
    if len(turns) == len(traj["agent_turns"]) and len(spans) == len(calls):
        return turns, spans
    turns, spans, now = [], [], 0
    for i in range(len(traj["agent_turns"])):
        turns.append((now, now))
        if i < len(calls):
            spans.append((now, now + _ns(calls[i]["latency_s"])))
            now = spans[-1][1]
    return turns, spans


def log_episode_trace(episode: dict[str, Any]) -> str:
    """Log one episode as a trace (in the active run, if any); returns the trace id."""
    traj, calls = episode["trajectory"], episode["env_calls"]
    turns, call_times = _timeline(episode)
    start = min([t[0] for t in turns] + [c[0] for c in call_times], default=0)
    end = max([t[1] for t in turns] + [c[1] for c in call_times], default=start)
    tags = {k: str(episode[k]) for k in ("env_name", "env_model", "method", "dataset", "question_id")}
    tags.update(episode.get("tags") or {})  # a training rollout's step, reward, advantage, environment
    root = mlflow.start_span_no_context(
        "episode", span_type=SpanType.AGENT, inputs={"question": episode["question"]}, start_time_ns=start,
        tags=tags, attributes={"stop_reason": traj.get("stop_reason", ""), "num_turns": len(traj["agent_turns"]),
                               "policy_version": traj.get("policy_version", 0)})
    replies = traj.get("env_replies", [])
    for i, text in enumerate(traj["agent_turns"]):
        span = mlflow.start_span_no_context(f"agent turn {i + 1}", span_type=SpanType.CHAT_MODEL, parent_span=root,
                                            inputs={"turn": i + 1}, start_time_ns=turns[i][0])
        span.end(outputs={"text": text}, end_time_ns=turns[i][1])
        if i < len(calls):
            _env_call_span(root, calls[i], parse_turn(text).interaction_prompt or "", i,
                           replies[i] if i < len(replies) else None, call_times[i])
    token = set_span_in_context(root)  # the trace is active: assessments travel with it, no write of their own
    try:
        log_assessments(root.trace_id, episode)
    finally:
        detach_span_from_context(token)
    failed = episode.get("error")
    root.end(outputs={"answer": None if failed else episode["answer"]},
             status=SpanStatusCode.ERROR if failed else SpanStatusCode.OK, end_time_ns=end)
    return root.trace_id


def _env_call_span(root, call: dict[str, Any], prompt: str, earlier: int, reply: str | None,
                   when: tuple[int, int]) -> None:
    usage = {"input_tokens": call["prompt_tokens"], "output_tokens": call["completion_tokens"],
             "total_tokens": call["prompt_tokens"] + call["completion_tokens"]}
    attributes = {SpanAttributeKey.MODEL: call["model"], SpanAttributeKey.CHAT_USAGE: usage,
                  "env_name": call["env_name"], "attempts": call["attempts"], "cached": call["cached"]}
    if "input_cost_usd" in call:  # our prices, so MLflow never looks the model up in its catalogue
        cost = {"input_cost": call["input_cost_usd"], "output_cost": call["output_cost_usd"]}
        attributes[SpanAttributeKey.LLM_COST] = {**cost, "total_cost": sum(cost.values())}
    span = mlflow.start_span_no_context(
        f"environment call {earlier + 1}", span_type=SpanType.LLM, parent_span=root, attributes=attributes,
        inputs={"interaction_prompt": prompt, "earlier_exchanges": earlier}, start_time_ns=when[0])
    if call.get("error"):
        span.set_attribute("error", call["error"])
        span.end(status=mlflow.entities.SpanStatus(SpanStatusCode.ERROR, call["error"]), end_time_ns=when[1])
    else:  # the reply as the agent read it (cut to agent.max_env_reply_tokens)
        span.end(outputs={"reply": reply}, end_time_ns=when[1])


def log_assessments(trace_id: str, episode: dict[str, Any]) -> None:
    """The gold answers (expectation, when known) and, for a scored episode, its score (feedback)."""
    if episode["golds"]:
        mlflow.log_expectation(trace_id=trace_id, name="gold_answers", value=list(episode["golds"]), source=SCORER)
    if episode.get("reward") is not None:  # a training rollout: the reward it was trained with
        mlflow.log_feedback(trace_id=trace_id, name="reward", value=float(episode["reward"]), source=REWARD,
                            rationale="the training reward (-1 + format + answer) of this trajectory",
                            metadata={"parts": json.dumps(episode.get("reward_parts")),
                                      "advantage": json.dumps(episode.get("advantage")), "step": str(episode.get("step"))})
    if episode.get("error") or episode.get("score") is None:
        return
    scores = {m: episode.get(m) for m in ("em", "f1", "substring", "ssim")}
    mlflow.log_feedback(trace_id=trace_id, name="score", value=float(episode["score"]), source=SCORER,
                        rationale=f"{episode['primary_metric']} of the answer against the gold answers",
                        metadata={"primary_metric": episode["primary_metric"], "scores": json.dumps(scores)})
    judge = episode.get("judge")
    if judge:
        mlflow.log_feedback(trace_id=trace_id, name=f"judge:{judge['name']}", value=float(judge["score"]),
                            source=AssessmentSource(source_type="LLM_JUDGE", source_id=judge["model"]),
                            rationale=judge["verdict"], metadata={"judge_cost_usd": str(judge["cost_usd"])})


def trace_episodes(episodes: list[dict[str, Any]]) -> list[str]:
    """Log `episodes` as traces in the active run. Returns the trace ids."""
    return [log_episode_trace(e) for e in episodes]


_tracked: set[str] = set()  # "<tracking uri>#<config name>" experiments `trace_answer` has set up


def trace_answer(source: str, cfg: Any, env_cfg: Any, question: str, traj: Any) -> str:
    """An `ask` / `serve` episode (`prompt_r1.serving.service.report_episode`) as a trace in the
    config's experiment, tagged `method` = `source`; no gold, no score. Returns the trace id."""
    from prompt_r1.env.base import cost_usd
    from prompt_r1.evaluation.scoring import EPISODE_DROPS
    from prompt_r1.serving.service import env_failure
    from tasks.tracking.runs import setup_mlflow, tracking_uri

    uri = tracking_uri(cfg.tracking.uri)
    where = f"{uri}#{cfg.name}"  # PROMPT_R1_HOME may move within one process
    if where not in _tracked or mlflow.get_tracking_uri() != uri:
        setup_mlflow(cfg.name, cfg.tracking.uri)
        _tracked.add(where)
    record = traj.to_record()
    calls = [dict(c, input_cost_usd=cost_usd(env_cfg, c["prompt_tokens"], 0),
                  output_cost_usd=cost_usd(env_cfg, 0, c["completion_tokens"])) for c in record["env_calls"]]
    return log_episode_trace({
        "env_name": env_cfg.name, "env_model": env_cfg.model, "method": source, "dataset": "adhoc",
        "question_id": traj.question_id, "question": question, "golds": [], "primary_metric": "",
        "answer": traj.answer, "error": env_failure(traj), "score": None, "env_calls": calls,
        "trajectory": {k: v for k, v in record.items() if k not in (*EPISODE_DROPS, "env_calls")}})
