"""Asynchronous rollouts: (a) training steps per hour at `rollout.max_staleness` 0 vs 1, against
the managed vLLM environment server directly and behind a proxy that adds 1-3 s to every call
(a hosted API's latency); (b) on that proxy, our rollout loop vs a turn-synchronous loop that
calls the environment one request at a time.

(a) Demo-like settings (configs/demo-single-hop.yaml: SmolLM2 agent with the protocol warm start, SmolLM2
environment on one managed vLLM server), a few steps, no validation, one checkpoint at the end.
Steps per hour = steps / (time from the run's first stage to its last step's end); start-up
(models, actors) is not counted. One server serves all four runs; the proxy is
`tests/chaos_proxy.py` with no faults and a seeded 1-3 s delay per chat request.
(b) `benchmarks/speed/rollout.py`'s comparison (same `rollout_batch`, same agent and questions; the
baseline serialises environment calls and makes every turn wait for all replies), on the proxy.

    .venv/bin/python -m benchmarks.speed.staleness                 # both parts: 12 min on an idle 2-core CPU
    .venv/bin/python -m benchmarks.speed.staleness --part loop     # (b) only
    .venv/bin/python -m benchmarks.speed.staleness --backend transformers   # the agent on torch instead of vLLM

Ratios are against the baseline measured in the same process; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.scratch import scratch_home

from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import Config, load_config
from prompt_r1.config.env import EnvConfig

log = logging.getLogger("benchmarks.speed.staleness")


def demo_like(args: argparse.Namespace) -> Config:
    return load_config(ROOT / "configs" / "demo-single-hop.yaml", {
        "agent.model": args.agent, "agent.backend": args.backend, "agent.max_new_tokens": args.new_tokens,
        "rollout.batch_questions": args.batch_questions, "rollout.group_size": args.group_size,
        "train.steps": args.steps, "train.checkpoint_every": args.steps, "train.keep_checkpoints": 1,
        "data.validation_fraction": 0.0,
        # the server's KV cache is sized for this many sequences (32 in the demo: 5.8 GB); a step
        # here has at most batch x group calls at once
        "environment.concurrency": args.concurrency})


def steps_per_hour(cfg: Config, env: EnvConfig, max_staleness: int, home: Path, name: str) -> dict[str, float]:
    """Train `cfg` against `env` at `max_staleness`; steps per hour of the schedule alone."""
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    cfg = cfg.model_copy(update={"environment": env,
                                 "rollout": cfg.rollout.model_copy(update={"max_staleness": max_staleness})})
    marks: dict[str, float] = {}
    waits: list[float] = []

    class Clock(TrainingHooks):
        def stage(self, stage, fn, *args):
            marks.setdefault("start", time.perf_counter())
            return fn(*args)

        def on_step(self, result):
            marks["end"] = time.perf_counter()
            waits.append(result.metrics["rollout_time_s"])

    with Warehouse(home / "warehouse.duckdb") as wh, TrainingSession(cfg, wh, name, home / name) as session:
        session.run(Clock(cfg.train.steps))
    seconds = marks["end"] - marks["start"]
    out = {"steps": cfg.train.steps, "seconds": seconds, "steps_per_hour": 3600 * cfg.train.steps / seconds,
           "rollout_wait_s": sum(waits) / len(waits)}
    log.info("%s: %s", name, {k: round(v, 2) for k, v in out.items()})
    return out


def loop_speed(cfg: Config, env: EnvConfig, n_questions: int) -> dict[str, float]:
    """`rollout_batch` as training runs it vs one environment call at a time, turn-synchronous."""
    from benchmarks.speed.rollout import OneAtATime, sample_questions

    from prompt_r1.env import open_environment
    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.policy import make_policy
    from prompt_r1.rollout.episode import rollout_batch

    policy = make_policy(cfg.agent, resolve_agent(cfg.agent.model, config_name=cfg.name), seed=0)
    questions = sample_questions(n_questions)
    with open_environment(env, log_dir=None) as environment:
        async def run(wrapped, window: float) -> tuple[float, int]:
            start = time.perf_counter()
            trajectories = await rollout_batch(policy, wrapped, questions, cfg.agent, cfg.rollout, cfg.reward,
                                               seed=3, gather_window_s=window)
            return time.perf_counter() - start, sum(len(t.env_calls) for t in trajectories)

        async def both():
            ours = await run(environment, 0.05)
            baseline = await run(OneAtATime(environment), 1e9)
            await environment.aclose()
            return ours, baseline

        (ours_s, ours_calls), (sync_s, sync_calls) = asyncio.run(both())
    if hasattr(policy, "close"):
        policy.close()
    return {"ours_s": ours_s, "ours_calls": ours_calls, "sync_s": sync_s, "sync_calls": sync_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["train", "loop", "both"], default="both")
    parser.add_argument("--agent", default="smollm2-135m-protocol")
    parser.add_argument("--backend", choices=["vllm", "transformers"], default="vllm",
                        help="agent.backend (the demo's: vllm)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-questions", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64, help="agent.max_new_tokens (demo: 96)")
    parser.add_argument("--loop-questions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="environment.concurrency (demo: 32)")
    parser.add_argument("--latency", type=float, nargs=2, default=(1.0, 3.0), metavar=("LOW", "HIGH"))
    parser.add_argument("--keep-runs", action="store_true", help="Keep the runs' scratch home (removed by default).")
    args = parser.parse_args()
    setup_logging()
    from tests.chaos_proxy import ChaosProxy

    from prompt_r1.data.ingest import ingest
    from prompt_r1.rollout.pool import actor_environment
    from warehouse.store import Warehouse

    with scratch_home("staleness-bench-", args.keep_runs) as home:
        with Warehouse(home / "warehouse.duckdb") as wh:
            ingest(wh, ["data/sample"])
        cfg = demo_like(args)
        total = time.perf_counter()
        with actor_environment(cfg.environment, home / "logs") as direct, \
                ChaosProxy(direct.base_url, rate=0.0, latency_s=tuple(args.latency)) as proxy:
            hosted = direct.model_copy(update={"base_url": proxy.base_url})
            lat = f"{args.latency[0]:g}-{args.latency[1]:g} s proxy"
            if args.part in ("loop", "both"):
                loop = loop_speed(cfg, hosted, args.loop_questions)
                print(f"(b) rollout loop, {args.loop_questions} questions x {args.group_size} samples, max "
                      f"{cfg.rollout.max_turns - 1} env calls each, agent {args.agent} ({args.backend}), {lat}: "
                      f"ours {loop['ours_s']:.1f} s "
                      f"({loop['ours_calls']} calls), turn-synchronous one-at-a-time {loop['sync_s']:.1f} s "
                      f"({loop['sync_calls']} calls): {loop['sync_s'] / loop['ours_s']:.2f}x", flush=True)
            if args.part in ("train", "both"):
                rows = {}
                for target, env in (("direct", direct), ("proxy", hosted)):
                    for k in (0, 1):
                        rows[target, k] = steps_per_hour(cfg, env, k, home, f"{target}-k{k}")
                print(f"(a) {args.steps} steps, {args.batch_questions} questions x {args.group_size} samples, agent "
                      f"{args.agent} ({args.backend}), env SmolLM2 on a managed vLLM server:")
                for target in ("direct", "proxy"):
                    sync, ahead = rows[target, 0], rows[target, 1]
                    print(f"    {target if target == 'direct' else lat}: max_staleness 0 {sync['steps_per_hour']:.0f} "
                          f"steps/h ({sync['seconds']:.1f} s, rollout wait {sync['rollout_wait_s']:.1f} s/step), "
                          f"max_staleness 1 {ahead['steps_per_hour']:.0f} steps/h ({ahead['seconds']:.1f} s, rollout "
                          f"wait {ahead['rollout_wait_s']:.1f} s/step): "
                          f"{ahead['steps_per_hour'] / sync['steps_per_hour']:.2f}x", flush=True)
        print(f"total {time.perf_counter() - total:.0f} s")


if __name__ == "__main__":
    main()
