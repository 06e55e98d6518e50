"""Managed vLLM server on CPU: worker in the engine core (ours) vs vLLM's default multiprocess launch.

The managed server (`prompt_r1/env/vllm_server.py`) runs vLLM's model worker inside the
engine-core process on CPU (`--distributed-executor-backend uni`): two processes (API server,
engine core) instead of vLLM's three (a worker process too). This starts the same SmolLM2-135M-Instruct server both
ways, one after the other, and prints for each: seconds until `/v1/models` lists the model, and
tokens/s for rounds of concurrent chat requests (greedy, so both must give the same replies).

    .venv/bin/python -m benchmarks.speed.vllm_server            # --requests 32 --rounds 3 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import openai

from prompt_r1.env import vllm_server
from prompt_r1.config.env import EnvConfig
from prompt_r1.cli.logging_setup import setup_logging

OURS_COMMAND = vllm_server.server_command


def multiprocess_command(*args, **kwargs) -> list[str]:
    """vLLM's default launch: our command line without the executor flag (a separate worker process)."""
    cmd = OURS_COMMAND(*args, **kwargs)
    if "--distributed-executor-backend" in cmd:
        at = cmd.index("--distributed-executor-backend")
        del cmd[at:at + 2]
    return cmd


async def chat_round(base_url: str, model: str, n: int, max_tokens: int) -> tuple[float, int, list[str]]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    try:
        started = time.perf_counter()
        replies = await asyncio.gather(*(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Name one fact about the number {i}."}],
            max_tokens=max_tokens, temperature=0.0) for i in range(n)))
        seconds = time.perf_counter() - started
    finally:
        await client.close()
    return seconds, sum(r.usage.completion_tokens for r in replies), [r.choices[0].message.content for r in replies]


def measure(mode: str, cfg: EnvConfig, args: argparse.Namespace) -> dict:
    patched = mode == "multiprocess"
    vllm_server.server_command = multiprocess_command if patched else OURS_COMMAND
    with tempfile.TemporaryDirectory() as logs:
        server = vllm_server.VLLMServer(cfg, Path(logs))
        started = time.perf_counter()
        server.start()
        ready_s = time.perf_counter() - started
        try:
            rounds = [asyncio.run(chat_round(server.base_url, cfg.model, args.requests, args.max_tokens))
                      for _ in range(args.rounds)]
        finally:
            server.stop()
    rates = [tokens / seconds for seconds, tokens, _ in rounds]
    print(f"{mode:>12}: ready after {ready_s:5.1f} s; {args.requests} concurrent requests: "
          + ", ".join(f"{r:.0f}" for r in rates) + " tok/s", flush=True)
    return {"ready_s": ready_s, "tok_s": sum(rates[1:] or rates) / len(rates[1:] or rates), "replies": rounds[-1][2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of requests; the first is a warm-up.")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    setup_logging()
    if vllm_server.on_gpu():
        print("note: on a GPU the managed server keeps vLLM's multiprocess launch; this compares CPU modes")
    cfg = EnvConfig(name="bench", kind="vllm", model=args.model, cache=False, temperature=0.0)
    base = measure("multiprocess", cfg, args)
    ours = measure("worker in engine core", cfg, args)
    print(f"start-up: worker in engine core {base['ready_s'] / ours['ready_s']:.2f}x faster; "
          f"throughput (rounds after the first): {ours['tok_s'] / base['tok_s']:.2f}x; "
          f"identical replies: {base['replies'] == ours['replies']}")


if __name__ == "__main__":
    main()
