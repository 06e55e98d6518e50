"""The records a rollout produces and the learner and warehouse consume.

A `Trajectory` is one sampled multi-turn episode for one question: the response token ids
exactly as sampled (agent tokens) or inserted (environment/template tokens), a loss mask that
is 1 only on agent-sampled tokens, the sampling log-probs, the texts of each side, the final
answer (from the agent's text only), its reward, and the policy version that sampled it (the
number of GRPO updates in the weights the rollout engine held, see `core.weights`). `EnvCall`
records one environment call.

Trajectories travel as these objects everywhere in the library (Ray pickles them); they become
rows only at the edges: `to_record` / `env_call_records` for the warehouse and JSON lines, and
`rollout_stats` for the numbers logged per batch (`stats_by_environment`: per environment of a
training pool).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prompt_r1.core.failures import call_errors, error_rate
from prompt_r1.core.reward import GATE_TOLERANCE, RewardBreakdown


@dataclass
class EnvCall:
    """One environment call: usage, latency and outcome (error is None on success)."""

    turn: int
    env_name: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 1
    cached: bool = False
    error: str | None = None
    started_at: float = 0.0  # wall clock (epoch seconds) when the call began: for traces, never for results


@dataclass
class Trajectory:
    question_id: str
    group_index: int
    prompt_ids: list[int]                 # the agent's prompt (chat template applied)
    token_ids: list[int] = field(default_factory=list)   # response part: agent + inserted tokens
    loss_mask: list[int] = field(default_factory=list)   # 1 = agent-sampled token, 0 = inserted
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob per token (0.0 where mask 0)
    agent_turns: list[str] = field(default_factory=list)
    env_replies: list[str] = field(default_factory=list)
    answer: str = ""
    reward: RewardBreakdown | None = None
    env_calls: list[EnvCall] = field(default_factory=list)
    stop_reason: str = ""                 # answered / max_turns / token_budget / invalid_turn / env_error
    error: str | None = None              # why an environment call ended it (stop_reason env_error): no reward
    policy_version: int = 0               # GRPO updates applied to the weights that sampled it (stamped by the engine)
    turn_times: list[list[float]] = field(default_factory=list)  # [start, end] wall clock (epoch s) of each agent
    # generation (the batch's generate call it was part of): for traces, never for results
    env_name: str = ""                    # the environment it prompted (drawn per question from a training pool)
    turn_rewards: list[float | None] = field(default_factory=list)  # per agent turn, `reward.turn.scorer`'s
    # value (None: the task does not judge that turn); empty when no turn scorer is set (core.turn_credit)
    scaffold_turns: list[int] = field(default_factory=list)  # agent turns (indices) a task's scaffold wrote,
    # not the policy (`rollout.scaffold`, training only): trained like sampled turns, but with no sampling log-prob

    def to_record(self) -> dict[str, Any]:
        """JSON-able dict (the `rollout --out` line and the warehouse row)."""
        record = asdict(self)
        record["reward"] = self.reward.as_dict() if self.reward else None
        if not self.turn_rewards:  # no turn scorer: the record carries no turn fields
            del record["turn_rewards"]
        if not self.scaffold_turns:  # sampled throughout: the record as it always was
            del record["scaffold_turns"]
        return record



def env_call_records(trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Flat env-call rows for `Warehouse.replace_step`, each tagged with its trajectory.

    >>> t = Trajectory("q1", 2, [], env_calls=[EnvCall(turn=0, env_name="e", model="m")])
    >>> [(r["question_id"], r["group_index"], r["turn"]) for r in env_call_records([t])]
    [('q1', 2, 0)]
    """
    return [{"question_id": t.question_id, "group_index": t.group_index, **asdict(call)}
            for t in trajectories for call in t.env_calls]


def stats_by_environment(trajectories: Sequence[Trajectory], format_cap: float) -> dict[str, dict[str, float]]:
    """`rollout_stats` of each environment's trajectories (keyed by `env_name`, in first-seen
    order), plus `trajectories`, how many it had: the per-environment view of a pool's batch.

    >>> ts = [Trajectory("q", 0, [], env_name="a"), Trajectory("r", 0, [], env_name="b"),
    ...       Trajectory("r", 1, [], env_name="b")]
    >>> {name: s["trajectories"] for name, s in stats_by_environment(ts, 1.0).items()}
    {'a': 1.0, 'b': 2.0}
    """
    by_env: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_env.setdefault(t.env_name, []).append(t)
    return {name: {**rollout_stats(ts, format_cap), "trajectories": float(len(ts))} for name, ts in by_env.items()}


def rollout_stats(trajectories: Sequence[Trajectory], format_cap: float) -> dict[str, float]:
    """Numbers describing one batch of trajectories, for training metrics, validation and the CLI.

    Reward figures average over the scored trajectories only (one ended by an environment failure
    has no reward; `reward_cost` is the mean part `reward.cost` adds, 0 when it is off); `format_valid_rate` is the share of them whose format score reached
    `format_cap` (`reward.format_cap`), the gate that lets the answer score count. The rest average
    over all trajectories: agent turns, environment calls and their tokens, agent-sampled tokens
    (`response_length`) and all response tokens (`response_tokens`); `env_error_rate` is the share
    of failed environment calls. With turn rewards, `turn_reward_t<t>` is the mean of agent turn t's
    over the trajectories whose task judged that turn.

    >>> from prompt_r1.core.reward import RewardBreakdown as R
    >>> ts = [Trajectory("q", 0, [], loss_mask=[1, 1], reward=R(0.9, 0.5, -0.1)),
    ...       Trajectory("q", 1, [], loss_mask=[1, 0], reward=R(0.9, 1.0, 0.9)),
    ...       Trajectory("q", 2, [], error="HTTP 500")]
    >>> s = rollout_stats(ts, format_cap=0.9)
    >>> s["format_valid_rate"], s["reward_mean"], s["response_length"]
    (1.0, 0.4, 1.0)
    >>> rollout_stats(ts, format_cap=1.0)["format_valid_rate"]
    0.0
    """
    n = max(len(trajectories), 1)
    scored = [t.reward for t in trajectories if t.reward is not None]
    by_turn: dict[int, list[float]] = {}  # turn rewards (`reward.turn.scorer`), per agent turn judged
    for t in trajectories:
        for turn, value in enumerate(t.turn_rewards):
            if value is not None:
                by_turn.setdefault(turn, []).append(value)
    m = max(len(scored), 1)
    totals = [r.total for r in scored]
    calls = [c for t in trajectories for c in t.env_calls]
    return {
        "reward_mean": sum(totals) / m,
        "reward_std": statistics.stdev(totals) if len(totals) > 1 else 0.0,
        "format_mean": sum(r.format for r in scored) / m,
        "format_valid_rate": sum(1 for r in scored if r.format >= format_cap - GATE_TOLERANCE) / m,
        "answer_score": sum(r.answer for r in scored) / m,
        "reward_cost": sum(r.cost for r in scored) / m,
        "turns": sum(len(t.agent_turns) for t in trajectories) / n,
        "env_calls": len(calls) / n,
        "env_error_rate": error_rate(call_errors(trajectories)),
        "env_prompt_tokens": sum(c.prompt_tokens for c in calls) / n,
        "env_completion_tokens": sum(c.completion_tokens for c in calls) / n,
        "response_length": sum(sum(t.loss_mask) for t in trajectories) / n,
        "response_tokens": sum(len(t.token_ids) for t in trajectories) / n,
        **{f"turn_reward_t{turn}": sum(values) / len(values) for turn, values in sorted(by_turn.items())},
    }
