"""Learner scaling: step time and tokens/s of 1 rank vs N ranks (ddp, fsdp), and the weight broadcast.

Why it exists: `train.world_size` > 1 spreads the GRPO update over a `LearnerGroup` of Ray
actors (`prompt_r1/learner/ray_group.py`); this measures what that costs or gains against
one rank, in the same process, on the same batch:
- for each model shape (`--shapes`: randomly initialised models of published architectures,
  `benchmarks/gpu/gpu_learner.py`'s SHAPES: `tiny`, and `smollm2-135m`, the demo agent's shape),
  the 1-rank baseline (a group of one rank: a `GRPOLearner` in one actor) and a group for every `--strategies` x
  `--ranks`: one warm-up step, then `--steps` timed steps on the same batch;
- step time and tokens/s (prompt + response tokens of the batch per second of the driver's wall
  clock), each as a ratio to the baseline;
- the weight broadcast the session does after every step: `weights_for_sync()` (for a
  group: gathered on rank 0 and sent to the driver; the checksum included) plus the one `ray.put` the rollout pool makes,
  against the model's size in MiB, again as a ratio to the baseline.

On this project's CPU machines more ranks share the same few cores, so expect ratios below 1 for
the step; the script exists for machines with a GPU per rank. `--quick` (the tiny shape, a small
batch, one timed step, 2 ranks) checks that it runs:

    .venv/bin/python -m benchmarks.speed.learner_scaling --quick
    .venv/bin/python -m benchmarks.speed.learner_scaling --shapes tiny smollm2-135m --ranks 2 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.gpu import gpu_learner  # (the model shapes, random models and rollout-shaped batches)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["tiny", "smollm2-135m"], choices=sorted(gpu_learner.SHAPES))
    p.add_argument("--ranks", nargs="+", type=int, default=[2], help="world sizes compared with 1 rank")
    p.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    p.add_argument("--questions", type=int, default=4, help="GRPO groups per batch")
    p.add_argument("--group", type=int, default=4, help="trajectories per question")
    p.add_argument("--response-tokens", type=int, default=512, help="agent.max_response_tokens of the batch")
    p.add_argument("--micro-batch", type=int, default=4, help="train.micro_batch_size")
    p.add_argument("--cpus-per-rank", type=float, default=1.0, help="train.cpus_per_rank")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="train.device")
    p.add_argument("--quick", action="store_true", help="tiny shape, small batch, 1 timed step, 2 ranks")
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.ranks, args.steps = ["tiny"], [2], 1
        args.questions, args.group, args.response_tokens = 2, 2, 96
    return args


def batch_args(args: argparse.Namespace) -> argparse.Namespace:
    """`gpu_learner.make_batch`'s settings, scaled to `--response-tokens`."""
    cap = args.response_tokens
    return argparse.Namespace(
        questions=args.questions, group=args.group, prompt_tokens=(cap // 8, cap // 4),
        agent_turn_tokens=(cap // 16, cap // 6), env_reply_tokens=(cap // 8, cap // 4), env_calls=(1, 3),
        max_response_tokens=cap)


def config(args: argparse.Namespace, model_dir: Path, world_size: int = 1, strategy: str = "ddp"):
    from prompt_r1.config.experiment import parse_config

    return parse_config({
        "seed": 0,
        "agent": {"model": str(model_dir), "dtype": "float32", "max_response_tokens": args.response_tokens,
                  "temperature": 1.0},
        "train": {"lr": 1e-6, "device": args.device, "micro_batch_size": args.micro_batch,
                  "mini_batch_questions": 64, "kl_coef": 0.001, "world_size": world_size, "strategy": strategy,
                  "cpus_per_rank": args.cpus_per_rank, "dist_timeout_s": 1800},
        "rollout": {"ray_num_cpus": int(max(args.ranks) * args.cpus_per_rank) + 1},
    })


def measure(learner, batch: list, steps: int) -> dict[str, float]:
    """Step time, tokens/s and broadcast time of a `learner.base.Learner` (driver's wall clock)."""
    import ray

    tokens = sum(len(t.prompt_ids) + len(t.token_ids) for t in batch)
    learner.step(batch)  # warm-up: first-call allocations, lazy imports, the ranks' first collectives
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        learner.step(batch)
        times.append(time.perf_counter() - start)
    step_s = sorted(times)[len(times) // 2]
    start = time.perf_counter()
    update = learner.weights_for_sync(1)
    ray.put(update)  # what RolloutPool.broadcast adds before the workers load it
    broadcast_s = time.perf_counter() - start
    mib = update.nbytes / 2**20
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "broadcast_s": broadcast_s, "weights_mib": mib}


def run(args: argparse.Namespace) -> list[dict]:
    import ray
    from transformers import AutoTokenizer

    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.learner.ray_group import LearnerGroup

    rows = []
    with tempfile.TemporaryDirectory(prefix="learner-scaling-") as scratch:
        tokenizer_dir = gpu_learner.default_tokenizer()
        for shape in args.shapes:
            model_dir = gpu_learner.build_random_model(shape, tokenizer_dir, Path(scratch) / shape, device="cpu")
            batch = gpu_learner.make_batch(AutoTokenizer.from_pretrained(model_dir), batch_args(args))
            base_cfg = config(args, model_dir)
            if not ray.is_initialized():
                init_ray(base_cfg.rollout)
            # the baseline is one rank in its own actor too: same transport, and its memory goes
            # with the actor (a learner in this process would keep its peak here beside the ranks)
            with LearnerGroup(config(args, model_dir, 1, "ddp"), model_dir) as one:
                base = measure(one, batch, args.steps)
            rows.append({"shape": shape, "ranks": 1, "strategy": "-", **base})
            for strategy in args.strategies:
                for n in args.ranks:
                    with LearnerGroup(config(args, model_dir, n, strategy), model_dir) as group:
                        figures = measure(group, batch, args.steps)
                    rows.append({"shape": shape, "ranks": n, "strategy": strategy, **figures,
                                 "speedup": figures["tokens_per_s"] / base["tokens_per_s"],  # > 1: faster
                                 "broadcast_time_ratio": figures["broadcast_s"] / base["broadcast_s"]})
    return rows


def report(rows: list[dict]) -> str:
    lines = ["| shape | ranks | strategy | step s | tokens/s | speed-up vs 1 rank | weights MiB | broadcast s "
             "| broadcast time vs 1 rank |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else "1 (baseline)"
        cast = f"{r['broadcast_time_ratio']:.2f}x" if "broadcast_time_ratio" in r else "1 (baseline)"
        lines.append(f"| {r['shape']} | {r['ranks']} | {r['strategy']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} "
                     f"| {speed} | {r['weights_mib']:.1f} | {r['broadcast_s']:.3f} | {cast} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    rows = run(args)
    print(f"torch {torch.__version__}, device {args.device}, {args.questions} questions x {args.group}, "
          f"{args.steps} timed step(s) (median)")
    print(report(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
