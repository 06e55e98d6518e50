"""The records a rollout produces and the learner and warehouse consume.

A `Trajectory` is one sampled multi-turn episode for one question: the response token ids
exactly as sampled (agent tokens) or inserted (environment/template tokens), a loss mask that
is 1 only on agent-sampled tokens, the sampling log-probs, the texts of each side, the final
answer (from the agent's text only) and its reward. `EnvCall` records one environment call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prompt_r1.reward import RewardBreakdown


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

    def to_record(self) -> dict[str, Any]:
        """JSON-able dict (the `rollout --out` line and the warehouse row)."""
        record = asdict(self)
        record["reward"] = self.reward.as_dict() if self.reward else None
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Trajectory":
        record = dict(record)
        reward = record.pop("reward", None)
        calls = [EnvCall(**c) for c in record.pop("env_calls", [])]
        return cls(**record, reward=RewardBreakdown(**reward) if reward else None, env_calls=calls)
