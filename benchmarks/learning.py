"""Does GRPO improve the demo agent? A learning-rate sweep of the demo pair, with its curves.

The demo pair (agent `smollm2-135m-protocol` on transformers, environment SmolLM2-135M-Instruct
on a managed vLLM server, `configs/demo.yaml`) is trained on the sample training questions once
per learning rate, through the real training loop (`TrainingSession.run()`, as `prompt-r1 train`
runs it). For every run it records the reward mean and std of each step (from the warehouse's
trajectory rows) and the greedy reward on the held-out validation questions before and after
training, per question, with a 95% percentile-bootstrap interval
(`prompt_r1.evaluation.stats.bootstrap_ci`).
It writes `learning.json` and `learning.png` (one curve per learning rate, +-1 std band).

    .venv/bin/python benchmarks/learning.py --lrs 1e-4 3e-5 1e-5 --steps 4 \
        --set environment.timeout_s=180 --set environment.call_deadline_s=900
    .venv/bin/python benchmarks/learning.py --config configs/smoke.yaml --lrs 1e-3 --steps 3  # a smoke run

The validation split is widened (`--val-fraction`) so the before/after interval has enough
questions to mean something; the held-out questions never enter an update.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prompt_r1.config.experiment import parse_overrides  # noqa: E402
from prompt_r1.config.experiment import Config, load_config  # noqa: E402
from prompt_r1.evaluation.stats import bootstrap_ci, cell_seed  # noqa: E402
from prompt_r1.core.fsutil import atomic_write_text  # noqa: E402
from prompt_r1.cli.logging_setup import setup_logging  # noqa: E402
from prompt_r1.training.session import TrainingSession  # noqa: E402

log = logging.getLogger("benchmarks.learning")


class RecordingSession(TrainingSession):
    """The training session, keeping each validation's per-question rewards (for intervals).

    Same greedy rollouts as `TrainingSession.validate`; only the bookkeeping is added."""

    def validate(self) -> dict[str, float]:
        questions = self.val_questions[: self.cfg.train.validation_questions]
        trajs = self.pool.rollout(questions, self.step, greedy=True, group_size=1)
        rewards = [t.reward.total for t in trajs if t.reward is not None and t.error is None]
        self.validations = getattr(self, "validations", []) + [{"updates": self.step, "rewards": rewards}]
        return {"val_reward": statistics.fmean(rewards) if rewards else float("nan")}


def step_rewards(warehouse, run_id: str) -> list[dict[str, float]]:
    """Per step: mean and std of the trajectories' total, format and answer rewards."""
    rows = warehouse.query(
        "SELECT step, avg(reward_total), coalesce(stddev_samp(reward_total), 0), avg(reward_format), "
        "avg(reward_answer), count(reward_total), avg(num_turns) FROM trajectories WHERE run_id = ? "
        "GROUP BY step ORDER BY step", [run_id])
    keys = ("step", "reward_mean", "reward_std", "format_mean", "answer_mean", "n", "turns_mean")
    return [dict(zip(keys, (float(v) for v in row))) for row in rows]


def summarise(values: list[float], *seed_parts: object) -> dict[str, float | int | None]:
    low, high = bootstrap_ci(values, seed=cell_seed(*seed_parts))
    return {"mean": statistics.fmean(values) if values else None, "ci_low": low, "ci_high": high,
            "n": len(values)}


def train_once(cfg: Config, home: Path) -> dict:
    """One training run in a fresh warehouse under `home`; curve and validation before/after."""
    from prompt_r1.data.ingest import ingest
    from warehouse.store import Warehouse

    run_id = f"lr{cfg.train.lr:g}"
    started = time.perf_counter()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, cfg.data.sources, cfg.data.max_question_chars)
        with RecordingSession(cfg, wh, run_id, home / cfg.name / run_id) as session:
            session.run()
            validations = session.validations
            n_train, n_val = len(session.train_questions), len(session.val_questions)
        curve = step_rewards(wh, run_id)
    before, after = validations[0], validations[-1]
    return {
        "lr": cfg.train.lr, "steps": cfg.train.steps, "train_questions": n_train, "val_questions": n_val,
        "wall_s": round(time.perf_counter() - started, 1), "curve": curve,
        "val_before": summarise(before["rewards"], "before", cfg.train.lr),
        "val_after": summarise(after["rewards"], "after", cfg.train.lr),
        "val_rewards_before": before["rewards"], "val_rewards_after": after["rewards"],
    }


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        steps = [p["step"] + 1 for p in r["curve"]]
        mean = [p["reward_mean"] for p in r["curve"]]
        std = [p["reward_std"] for p in r["curve"]]
        line, = ax.plot(steps, mean, marker="o", label=f"lr {r['lr']:g}: val {fmt(r['val_before'])} -> "
                                                         f"{fmt(r['val_after'])}")
        ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.15)
    ax.set_xlabel("GRPO step")
    ax.set_xticks(sorted({p["step"] + 1 for r in results for p in r["curve"]}))
    ax.set_ylabel("training reward (mean +- std)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(summary: dict) -> str:
    """`mean [low, high]` of a validation summary.

    >>> fmt({"mean": 0.25, "ci_low": -0.1, "ci_high": 0.5, "n": 8})
    '0.250 [-0.100, 0.500]'
    """
    if summary["mean"] is None:
        return "n/a"
    return f"{summary['mean']:.3f} [{summary['ci_low']:.3f}, {summary['ci_high']:.3f}]"


def plot_sweep(results: list[dict], config: str, out: Path) -> None:
    plot(results, out / "learning.png", f"{config}: GRPO reward per step (n = "
         f"{results[0]['curve'][0]['n']:.0f} trajectories per step)")


def previous_results(args: argparse.Namespace) -> list[dict]:
    """Results of an earlier part of the same sweep, minus the learning rates about to be rerun."""
    path = args.out / "learning.json"
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if (earlier["config"], earlier["overrides"]) != (args.config, args.overrides):
        raise SystemExit(f"{path} holds a sweep of {earlier['config']} with {earlier['overrides']}; "
                         f"--append needs the same --config and --set (or use another --out)")
    return [r for r in earlier["results"] if r["lr"] not in args.lrs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--val-fraction", type=float, default=0.25,
                        help="Share of the training questions held out (24 sample questions -> 6).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Extra config override KEY=VALUE (as `prompt-r1 train --set`), repeatable.")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "benchmarks" / "learning")
    parser.add_argument("--append", action="store_true",
                        help="Keep the results already in OUT/learning.json for other learning rates "
                             "(a sweep run in parts); the same config and overrides are required.")
    parser.add_argument("--replot", action="store_true", help="Only redraw OUT/learning.png from OUT/learning.json.")
    args = parser.parse_args()
    setup_logging()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads((args.out / "learning.json").read_text())
        return plot_sweep(saved["results"], saved["config"], args.out)
    results = previous_results(args) if args.append else []
    for lr in args.lrs:
        cfg = load_config(ROOT / args.config, {
            "train.lr": lr, "train.steps": args.steps, "train.validate_every": 0,
            "train.checkpoint_every": args.steps, "data.validation_fraction": args.val_fraction,
            "train.validation_questions": 64, **parse_overrides(args.overrides)})
        with tempfile.TemporaryDirectory(prefix="learning-") as home:
            result = train_once(cfg, Path(home))
        results = sorted(results + [result], key=lambda r: -r["lr"])
        print(f"lr {lr:g}: {args.steps} steps in {result['wall_s']:.0f} s; reward per step "
              + " ".join(f"{p['reward_mean']:+.3f}" for p in result["curve"])
              + f"; validation {fmt(result['val_before'])} -> {fmt(result['val_after'])}", flush=True)
        # Written after every learning rate: a long sweep keeps what it finished.
        atomic_write_text(args.out / "learning.json", json.dumps(
            {"config": args.config, "overrides": args.overrides, "results": results}, indent=1))
        plot_sweep(results, args.config, args.out)
    print(f"wrote {args.out / 'learning.json'} and {args.out / 'learning.png'}")


if __name__ == "__main__":
    main()
