"""Which agent backend makes the demo's training faster: transformers or vLLM (CPU)?

vLLM generates about 3x faster than transformers on this CPU (BENCHMARKS.md, "Rollout"), but a
training step is more than generation: the learner's update is the same for both, a vLLM engine
takes longer to start, and every step pushes the new weights into it. So this trains the demo's
own config (`configs/demo-single-hop.yaml`: its steps, batch, validation and checkpoints) once per backend
against one managed environment server, and compares the whole training session: start-up
(learner, rollout actor and its engine), each step (rollout, update, weight sync) and the
validations. The transformers arm runs first; ratios are against it, measured in the same process.

    .venv/bin/python -m benchmarks.speed.demo_backend                  # the demo's 3 steps, both backends
    .venv/bin/python -m benchmarks.speed.demo_backend --steps 6 --json benchmarks/results/demo_backend.json

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.scratch import scratch_home

from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import Config, load_config
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.fsutil import atomic_write_text

log = logging.getLogger("benchmarks.speed.demo_backend")

BACKENDS = {  # everything else as the config says (the demo's engine and server sizes)
    "transformers": {"agent.backend": "transformers"},
    "vllm": {"agent.backend": "vllm"},
}


def train_once(cfg: Config, env: EnvConfig, home: Path, name: str) -> dict:
    """One training session of `cfg` against the running `env`: seconds of each part."""
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    cfg = cfg.model_copy(update={"environment": env})
    times: dict[str, list[float]] = {}
    steps: list[dict[str, float]] = []

    class Clock(TrainingHooks):
        def stage(self, stage, fn, *args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                times.setdefault(stage, []).append(time.perf_counter() - start)

        def on_step(self, result):
            super().on_step(result)
            steps.append({k: result.metrics[k] for k in ("reward_mean", "format_mean") if k in result.metrics})

    start = time.perf_counter()
    with Warehouse(home / "warehouse.duckdb") as wh, TrainingSession(cfg, wh, name, home / name) as session:
        started = time.perf_counter()
        outcome = session.run(Clock(cfg.train.steps))
        trained = time.perf_counter()
    total = time.perf_counter() - start
    per_step = [sum(times[s][i] for s in ("next-batch", "rollout", "reward", "grpo-update", "record",
                                          "broadcast-weights")) for i in range(cfg.train.steps)]
    out = {"start_s": started - start, "train_s": trained - started, "total_s": total,
           "step_s": per_step, "step_median_s": statistics.median(per_step),
           "rollout_s": statistics.median(times["rollout"]), "update_s": statistics.median(times["grpo-update"]),
           "sync_s": statistics.median(times["broadcast-weights"]),
           "validate_s": sum(times.get("validate", [])), "steps": steps,
           "validation_before": outcome.validation_before, "validation": outcome.validation}
    log.info("%s: start %.1f s, train %.1f s, step median %.1f s (rollout %.1f, update %.1f, sync %.2f)",
             name, out["start_s"], out["train_s"], out["step_median_s"], out["rollout_s"], out["update_s"],
             out["sync_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo-single-hop.yaml"))
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the config's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep-runs", action="store_true", help="Keep the runs' scratch home (removed by default).")
    args = parser.parse_args()
    setup_logging()
    from prompt_r1.data.ingest import ingest
    from prompt_r1.rollout.pool import actor_environment
    from warehouse.store import Warehouse

    with scratch_home("demo-backend-bench-", args.keep_runs) as home:
        steps = {"train.steps": args.steps} if args.steps else {}
        base = load_config(args.config, steps)
        with Warehouse(home / "warehouse.duckdb") as wh:
            ingest(wh, list(base.data.sources))
        rows = {}
        with actor_environment(base.environment, home / "logs") as env:
            for backend, overrides in BACKENDS.items():
                rows[backend] = train_once(load_config(args.config, {**overrides, **steps}), env, home, backend)
        t, v = rows["transformers"], rows["vllm"]
        print(f"{base.name}: {base.train.steps} steps of {base.rollout.batch_questions} questions x "
              f"{base.rollout.group_size} samples, agent {base.agent.model}, environment {base.environment.model}")
        for name, r in rows.items():
            print(f"  {name:12s} start {r['start_s']:6.1f} s | step median {r['step_median_s']:6.1f} s (rollout "
                  f"{r['rollout_s']:5.1f}, update {r['update_s']:5.1f}, sync {r['sync_s']:5.2f}) | validations "
                  f"{r['validate_s']:5.1f} s | session {r['total_s']:6.1f} s")
        print(f"  vllm / transformers speed-up: step {t['step_median_s'] / v['step_median_s']:.2f}x, rollout "
              f"{t['rollout_s'] / v['rollout_s']:.2f}x, whole session {t['total_s'] / v['total_s']:.2f}x")
        if args.json:
            atomic_write_text(args.json, json.dumps({"config": args.config, "steps": base.train.steps, **rows}, indent=1))


if __name__ == "__main__":
    main()
