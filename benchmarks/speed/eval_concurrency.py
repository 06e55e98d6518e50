"""Evaluation speed: a 12-dataset x 4-method slice, and concurrent vs one-at-a-time env calls.

One managed vLLM server (SmolLM2-135M-Instruct) is the environment for both measurements, with
the reply cache off so every call reaches the server:
1. `evaluate` with methods direct, cot, agent, agent_only on `limit` questions of each of the 12
   Prompt-R1 benchmark files (suites in_domain + ood): wall time in total and per method.
2. direct + cot on the same questions with `concurrent=True` vs `concurrent=False`.

    .venv/bin/python -m benchmarks.speed.eval_concurrency --data path/to/prompt-r1-data --limit 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from prompt_r1.models.resolver import resolve_agents
from prompt_r1.config.experiment import load_config
from prompt_r1.env.vllm_server import managed_vllm_server
from prompt_r1.config.env import EnvConfig
from prompt_r1.evaluation.evaluate import evaluate
from prompt_r1.data.ingest import ingest
from prompt_r1.cli.logging_setup import setup_logging
from warehouse.store import Warehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/prompt-r1"))
    parser.add_argument("--limit", type=int, default=2, help="Questions per dataset.")
    parser.add_argument("--agent", default="smollm2-135m-protocol")
    args = parser.parse_args()
    setup_logging()
    served = EnvConfig(name="smollm2", kind="vllm", model="smollm2-135m-instruct", max_tokens=96,
                       temperature=0.0, cache=False, concurrency=64)
    with tempfile.TemporaryDirectory() as tmp, Warehouse(Path(tmp) / "bench.duckdb") as wh, \
            managed_vllm_server(served, Path(tmp) / "logs") as url:
        ingest(wh, [args.data])
        env = served.model_copy(update={"kind": "openai", "base_url": url})
        overrides = {"eval.suites": ["in_domain", "ood"], "eval.limit_per_dataset": args.limit,
                     "agent.model": args.agent, "agent.max_new_tokens": 96, "rollout.max_turns": 2,
                     "eval.agent_checkpoints": ["base"]}
        cfg = load_config(ROOT / "configs/demo-single-hop.yaml", overrides)
        agents = resolve_agents(cfg)
        start = time.perf_counter()
        outcome = evaluate(cfg, wh, "slice", agents, [env])
        slice_s = time.perf_counter() - start
        n = len({p["question_id"] for p in outcome.predictions})
        timing = {}
        for concurrent in (True, False):
            two = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"methods": ["direct", "cot"]})})
            start = time.perf_counter()
            evaluate(two, wh, f"conc-{concurrent}", {}, [env], concurrent=concurrent)
            timing[concurrent] = time.perf_counter() - start
    per_method = ", ".join(f"{k.split(':', 1)[-1]} {v:.1f} s" for k, v in outcome.seconds.items() if v > 0.05)
    print(f"slice: {n} questions (12 datasets x {args.limit}) x 4 methods against SmolLM2 on vLLM: "
          f"{slice_s:.1f} s in all ({per_method})")
    print(f"direct + cot, {2 * n} environment calls: concurrent {timing[True]:.1f} s, "
          f"one at a time {timing[False]:.1f} s, speed-up {timing[False] / timing[True]:.2f}x")


if __name__ == "__main__":
    main()
