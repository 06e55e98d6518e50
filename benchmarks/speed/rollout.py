"""Rollout speed: (a) agent generation, transformers vs vLLM; (b) our rollout loop vs a
turn-synchronous loop that calls the environment one request at a time.

(a) The same prompts (Prompt-R1 agent prompts for sample questions) and sampling settings
through `TransformersPolicy` and `VLLMPolicy` (offline engine, eager mode), tokens/s of each.
(b) The same agent (transformers), questions and environment (a managed vLLM server): our
`rollout_batch` (all pending environment calls in flight at once, next agent turn generated as
replies arrive) vs the reference implementation's evaluation style, built from the same code:
a lock makes environment calls one at a time and an unbounded gather window makes every turn
wait for all replies before the next batched generation.

    .venv/bin/python -m benchmarks.speed.rollout            # full size
    .venv/bin/python -m benchmarks.speed.rollout --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from prompt_r1.config.experiment import AgentConfig, RewardConfig, RolloutConfig
from prompt_r1.config.env import EnvConfig
from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.models.bundled import resolve_model
from prompt_r1.core.questions import QuestionRow

log = logging.getLogger("benchmarks.speed.rollout")


def sample_questions(n: int) -> list[QuestionRow]:
    rows = [json.loads(line) for line in (ROOT / "data/sample/train/sample_train.jsonl").read_text().splitlines()]
    return [QuestionRow(f"q{i}", "sample_train", "train", r["question"], r["answers"], r["task_family"], "f1")
            for i, r in enumerate(rows[:n])]


def generation_speed(model: str, n_prompts: int, new_tokens: int) -> dict[str, float]:
    """Tokens/s of each backend on the same prompts (transformers first: vLLM pins torch threads)."""
    from prompt_r1.policy.hf import TransformersPolicy
    from prompt_r1.policy.vllm_policy import VLLMPolicy
    from prompt_r1.core.tokens import agent_prompt_ids

    path = resolve_model(model)
    out = {}
    for name, cls in (("transformers", TransformersPolicy), ("vllm", VLLMPolicy)):
        policy = cls(path, temperature=1.0, top_p=1.0, seed=0)
        prompts = [agent_prompt_ids(policy.tokenizer, q.question) for q in sample_questions(n_prompts)]
        policy.generate(prompts[:2], 8, seed=0)  # warm-up
        start = time.perf_counter()
        samples = policy.generate(prompts, new_tokens, seed=1)
        seconds = time.perf_counter() - start
        tokens = sum(len(s.token_ids) for s in samples)
        out[name] = tokens / seconds
        log.info("%s: %d tokens in %.1f s = %.1f tok/s", name, tokens, seconds, out[name])
        if hasattr(policy, "close"):
            policy.close()
    return out


class OneAtATime:
    """An environment wrapper that lets only one call run at a time (the baseline's style)."""

    def __init__(self, env):
        self.env, self.name, self.model = env, env.name, env.model
        self.lock: asyncio.Lock | None = None

    async def reply(self, messages, turn=0):
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:
            return await self.env.reply(messages, turn=turn)

    async def aclose(self):
        await self.env.aclose()


def loop_speed(agent: str, n_questions: int, group: int, max_turns: int, new_tokens: int) -> dict[str, float]:
    from prompt_r1.env import open_environment
    from prompt_r1.policy import make_policy
    from prompt_r1.rollout.episode import rollout_batch

    agent_cfg = AgentConfig(model=agent, max_new_tokens=new_tokens, max_response_tokens=1024,
                            max_env_reply_tokens=96, temperature=1.0)
    rollout_cfg = RolloutConfig(group_size=group, max_turns=max_turns)
    env_cfg = EnvConfig(name="smollm2", kind="vllm", model="smollm2-135m-instruct", max_tokens=96,
                        temperature=0.0, cache=False, concurrency=64)
    policy = make_policy(agent_cfg, resolve_model(agent), seed=0)
    questions = sample_questions(n_questions)
    out = {}
    with open_environment(env_cfg, log_dir=Path("/tmp/prompt-r1-bench-logs")) as env:
        async def run(environment, window: float):
            start = time.perf_counter()
            trajs = await rollout_batch(policy, environment, questions, agent_cfg, rollout_cfg, RewardConfig(),
                                        seed=3, gather_window_s=window)
            calls = sum(len(t.env_calls) for t in trajs)
            return time.perf_counter() - start, calls

        async def both():
            ours = await run(env, 0.05)
            baseline = await run(OneAtATime(env), 1e9)
            await env.aclose()
            return ours, baseline

        (ours_s, ours_calls), (base_s, base_calls) = asyncio.run(both())
    out = {"ours_s": ours_s, "ours_env_calls": ours_calls, "sync_s": base_s, "sync_env_calls": base_calls}
    log.info("rollout loop: ours %.1f s (%d env calls), turn-synchronous one-at-a-time %.1f s (%d env calls)",
             ours_s, ours_calls, base_s, base_calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gen-model", default="smollm2-135m-instruct")
    parser.add_argument("--agent", default="smollm2-135m-protocol", help="Agent for the loop (writes real prompts).")
    parser.add_argument("--part", choices=["a", "b", "both"], default="both")
    args = parser.parse_args()
    setup_logging()
    n_prompts, new_tokens, n_questions, group = (4, 16, 2, 2) if args.quick else (16, 128, 8, 2)
    # The loop first: an in-process vLLM engine pins torch to one thread for the rest of the process.
    if args.part in ("b", "both"):
        loop = loop_speed(args.agent, n_questions, group, max_turns=2, new_tokens=96 if not args.quick else 48)
        print(f"(b) rollout of {n_questions} questions x {group} samples, max 2 env calls each, agent {args.agent}, "
              f"env SmolLM2 on a managed vLLM server: ours {loop['ours_s']:.1f} s ({loop['ours_env_calls']} calls), "
              f"turn-synchronous one-at-a-time {loop['sync_s']:.1f} s ({loop['sync_env_calls']} calls), "
              f"speed-up {loop['sync_s'] / loop['ours_s']:.2f}x")
    if args.part == "b":
        return
    gen = generation_speed(args.gen_model, n_prompts, new_tokens)
    print(f"(a) agent generation, {n_prompts} prompts x {new_tokens} new tokens, {args.gen_model}: "
          f"transformers {gen['transformers']:.1f} tok/s, vLLM {gen['vllm']:.1f} tok/s, "
          f"vLLM/transformers {gen['vllm'] / gen['transformers']:.2f}x")


if __name__ == "__main__":
    main()
