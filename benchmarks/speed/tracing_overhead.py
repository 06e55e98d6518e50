"""What tracing agent episodes in MLflow costs an evaluation: the same evaluation with and
without traces, in one process, alternating, and the ratio of their wall times.

One round = `evaluate` (one environment, the config's methods) + `log_eval_environment` (its
runs, metrics and, with tracing, `eval.trace_episodes` traces) + `flush_trace_async_logging`
(every trace stored). Agents are opened once for all rounds; the environment reply cache is off
so every round calls the environment. Rounds alternate baseline / traced so a machine whose
load drifts penalises neither; the first (warm-up) pair is dropped.

    .venv/bin/python -m benchmarks.speed.tracing_overhead                         # smoke: tiny models
    .venv/bin/python -m benchmarks.speed.tracing_overhead --set agent.model=smollm2-135m-protocol \\
        --set environment.model=smollm2-135m-instruct --set environment.max_tokens=96

Tiny random models make an episode cost milliseconds, so the smoke ratio is the worst case:
with real models the tracing cost stays the same and the evaluation grows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import yaml

from benchmarks.scratch import scratch_home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE (YAML value) config overrides.")
    parser.add_argument("--rounds", type=int, default=3, help="Measured baseline/traced pairs (after one warm-up).")
    parser.add_argument("--trace-episodes", type=int, default=None, help="Cap for the traced rounds "
                        "(default: the config's eval.trace_episodes).")
    args = parser.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    with scratch_home("tracing-bench-"):
        run(args, overrides)


def run(args, overrides) -> None:
    import mlflow

    from prompt_r1.config.experiment import load_config
    from prompt_r1.config.run_home import default_db_path
    from prompt_r1.data.ingest import ingest
    from prompt_r1.evaluation.evaluate import EvalAgents, evaluate
    from prompt_r1.models.resolver import resolve_agents
    from tasks.tracking.traces import episodes_to_trace
    from tasks.tracking.eval_runs import log_eval_environment
    from tasks.tracking.runs import setup_mlflow
    from warehouse.store import Warehouse

    cfg = load_config(args.config, {"environment.cache": False, **overrides})
    env_cfg = cfg.environment
    cap = cfg.eval.trace_episodes if args.trace_episodes is None else args.trace_episodes
    setup_mlflow("tracing-bench")
    db = default_db_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    with Warehouse(db) as wh:
        ingest(wh, list(cfg.data.sources), cfg.data.max_question_chars)
        agents = resolve_agents(cfg)
        times: dict[int, list[float]] = {0: [], cap: []}
        episodes = 0
        with EvalAgents(cfg, agents) as opened, mlflow.start_run(run_name="bench") as parent:
            for i in range(2 * (args.rounds + 1)):
                traced = cap if i % 2 else 0
                t0 = time.perf_counter()
                outcome = evaluate(cfg, wh, parent.info.run_id, opened, [env_cfg])
                log_eval_environment(parent.info.run_id, env_cfg.name, env_cfg.model, cfg.eval.suites,
                                     outcome.results, outcome.baselines, outcome.suites, agents,
                                     episodes_to_trace(outcome.episodes, traced))
                mlflow.flush_trace_async_logging()
                seconds = time.perf_counter() - t0
                episodes = len(outcome.episodes)
                if i >= 2:
                    times[traced].append(seconds)
                print(f"round {i}: {'traced' if traced else 'baseline'} {seconds:.2f} s", flush=True)
    base, traced = statistics.median(times[0]), statistics.median(times[cap])
    print(f"{args.config} {overrides or ''}: {episodes} agent episodes per round, {min(cap, episodes)} traced")
    print(f"baseline median {base:.2f} s, traced median {traced:.2f} s, ratio {traced / base:.3f}")


if __name__ == "__main__":
    main()
