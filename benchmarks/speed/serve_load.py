"""Load test of `prompt-r1 serve`: N concurrent `openai` clients against a live server.

Starts `prompt-r1 serve` (a real process on 127.0.0.1, a free port) for a config, asks every
question once alone (the reference, greedy), then sends `--requests` chat completions from
`--clients` concurrent clients (each request bounded by `--timeout`, the whole run by
`--deadline`), and reports p50/p95 latency, throughput, errors, and mixed-up answers: a
response whose episode is not its own question's, or whose answer differs from that
question's reference. Exit 1 on any error or mix-up.

    .venv/bin/python -m benchmarks.speed.serve_load -c configs/smoke.yaml --clients 64 --requests 256
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(config: str, agent: str | None, port: int, log: Path, deadline_s: float) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("prompt-r1")), "serve", "-c", config, "--port", str(port)]
    cmd += ["--agent", agent] if agent else []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"server not up within {deadline_s}s; see {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default="configs/smoke.yaml")
    parser.add_argument("--agent", default=None)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--questions", type=int, default=32, help="Distinct questions (asked in rotation).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Per-request limit, seconds.")
    parser.add_argument("--deadline", type=float, default=1200.0, help="Limit of the whole load phase, seconds.")
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-load-{port}.log"
    proc = start_server(args.config, args.agent, port, log, 300)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=args.timeout, http_client=httpx.Client(
                                   limits=httpx.Limits(max_connections=args.clients * 2), timeout=args.timeout))
        model = client.models.list().data[0].id
        questions = [f"Question {i}: what is {i} plus {3 * i + 1}?" for i in range(args.questions)]

        def ask(question: str) -> tuple[float, dict | None, str | None]:
            started = time.perf_counter()
            try:
                reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
                return time.perf_counter() - started, reply.model_extra["prompt_r1"] | {
                    "content": reply.choices[0].message.content}, None
            except Exception as err:  # counted and reported, never ignored
                return time.perf_counter() - started, None, f"{type(err).__name__}: {err}"

        reference = {}
        for q in questions:
            _, report, error = ask(q)
            if error:
                raise SystemExit(f"reference request failed: {error}")
            reference[q] = report["answer"]

        sent = [questions[i % len(questions)] for i in range(args.requests)]
        started = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            futures = [pool.submit(ask, q) for q in sent]
            done, not_done = wait(futures, timeout=args.deadline)
            for f in not_done:
                f.cancel()
        elapsed = time.perf_counter() - started
        latencies, errors, mixed = [], [f"no result within the {args.deadline}s deadline"] * len(not_done), 0
        for q, f in zip(sent, futures):
            if f not in done:
                continue
            latency, report, error = f.result()
            if error:
                errors.append(error)
                continue
            latencies.append(latency)
            if report["question"] != q or report["answer"] != reference[q] or report["content"] != report["answer"]:
                mixed += 1
        latencies.sort()
        stats = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        figures = {
            "config": args.config, "clients": args.clients, "requests": args.requests,
            "distinct_questions": len(questions), "ok": len(latencies), "errors": len(errors), "mixed_up": mixed,
            "wall_s": round(elapsed, 2), "throughput_rps": round(len(latencies) / elapsed, 3),
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p95_s": round(latencies[max(0, round(0.95 * len(latencies)) - 1)], 3) if latencies else None,
            "max_s": round(latencies[-1], 3) if latencies else None,
            "agent_batches": stats["agent_batches"], "agent_batch_rows": stats["agent_batch_rows"],
            "most_episodes_in_one_batch": stats["most_episodes_in_one_batch"],
        }
        print(json.dumps(figures, indent=2))
        for error in errors[:5]:
            print("error:", error)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=2) + "\n")
        return 1 if errors or mixed else 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
