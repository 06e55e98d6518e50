"""Accuracy against cost as the cost-aware reward's weight grows: one training run per alpha.

For each alpha (`reward.cost.mode: bonus`, Router-R1's correct-answer cheapness bonus; see
docs/training.md, "Cost-aware reward") the agent is trained through the real training loop
(`TrainingSession.run()`, as `prompt-r1 train` runs it) with the same config, seed and budget, in a
fresh warehouse; then it answers the probe questions (test split) greedily once, and the run's
point is (environment USD per question, answer score, share answered right). alpha 0 is the
cost-free reward (the bonus's mix leaves every total as it is). Router-R1 found a sharp knee
between alpha 0.6 and 0.7, so the default grid brackets it.

Local models cost nothing, so the environment gets a price here (`--price-prompt`,
`--price-completion`, USD per 1k tokens; default $0.15 / $0.60 per 1M, a small hosted model's).
Results go to OUT/cost_sweep.json and OUT/cost_sweep.png, and the curve is printed.

    .venv/bin/python -m benchmarks.experiments.cost_sweep --quick      # tiny models, 2 alphas x 2 steps: minutes
    .venv/bin/python -m benchmarks.experiments.cost_sweep              # configs/learning-smollm.yaml, 6 alphas
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.env import env_prices
from prompt_r1.config.experiment import Config, load_config, parse_overrides
from prompt_r1.core.cost_reward import is_right, trajectory_cost
from prompt_r1.core.fsutil import atomic_write_text
from prompt_r1.training.hooks import StepResult, TrainingHooks
from prompt_r1.training.session import TrainingSession

log = logging.getLogger("benchmarks.experiments.cost_sweep")
ALPHAS = [0.0, 0.3, 0.6, 0.65, 0.7, 0.9]
QUICK = {"config": "configs/smoke.yaml", "alphas": [0.0, 0.9], "steps": 2, "probe_limit": 4}


class CurveHooks(TrainingHooks):
    def __init__(self, total_steps: int):
        super().__init__(total_steps)
        self.curve: list[dict] = []

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        self.curve.append({"step": result.step + 1, **{k: result.metrics.get(k) for k in (
            "reward_mean", "answer_score", "reward_cost", "env_calls", "env_prompt_tokens", "env_completion_tokens")}})


def probe(session: TrainingSession, questions: list) -> dict:
    """Greedy answers to the probe questions: mean answer score, share right, USD and calls per question."""
    trajectories = session.pool.rollout(questions, session.step, greedy=True, group_size=1)
    failed = [t for t in trajectories if t.error]
    if failed:
        raise SystemExit(f"probe: {len(failed)} environment call(s) failed ({failed[0].error}); "
                         "no result is computed from failures")
    cfg = session.cfg
    prices = env_prices(cfg.training_environments())
    costs = [trajectory_cost(t.env_calls, prices) for t in trajectories]
    right = [is_right(t.reward, cfg.reward.format_cap, cfg.reward.cost.correct_at) for t in trajectories]
    return {"questions": len(trajectories),
            "answer_score": statistics.fmean(t.reward.answer for t in trajectories),
            "right_share": sum(right) / len(right),
            "usd_per_question": statistics.fmean(costs),
            "usd_per_right_answer": sum(costs) / sum(right) if any(right) else None,
            "env_calls_per_question": statistics.fmean(len(t.env_calls) for t in trajectories)}


def run_alpha(cfg: Config, alpha: float, home: Path, probe_limit: int | None) -> dict:
    from prompt_r1.data.ingest import ingest
    from warehouse.store import Warehouse

    cfg = cfg.model_copy(update={"reward": cfg.reward.model_copy(update={
        "cost": cfg.reward.cost.model_copy(update={"mode": "bonus", "alpha": alpha})})})
    started = time.perf_counter()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, cfg.data.sources, cfg.data.max_question_chars)
        questions = wh.questions(splits=["test"])[:probe_limit]
        if not questions:
            raise SystemExit(f"no test-split questions in {cfg.data.sources} to probe with")
        with TrainingSession(cfg, wh, f"alpha-{alpha}", home / "run") as session:
            hooks = CurveHooks(cfg.train.steps)
            session.run(hooks)
            result = probe(session, questions)
    return {"alpha": alpha, **result, "curve": hooks.curve, "wall_s": round(time.perf_counter() - started, 1)}


def plot(saved: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = saved["runs"]
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [r["usd_per_question"] * 1e6 for r in runs]
    ax.plot(xs, [r["answer_score"] for r in runs], marker="o", label="answer score (token F1)")
    ax.plot(xs, [r["right_share"] for r in runs], marker="s", ls="--", label="share right")
    for r, x in zip(runs, xs):
        ax.annotate(f"α={r['alpha']}", (x, r["answer_score"]), textcoords="offset points", xytext=(4, 4))
    ax.set(xlabel="environment µ$ per question", ylabel="probe score",
           title=f"cost sweep: {saved['config']}, {saved['steps']} steps per alpha")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"Tiny models, a check that the sweep runs: {QUICK} (explicit flags still win).")
    parser.add_argument("--config", help="Experiment config (default configs/learning-smollm.yaml).")
    parser.add_argument("--alphas", type=float, nargs="+", help=f"reward.cost.alpha values (default {ALPHAS}).")
    parser.add_argument("--steps", type=int, help="Override train.steps (the same budget for every alpha).")
    parser.add_argument("--probe-limit", type=int, metavar="N", help="Probe with the first N test questions only.")
    parser.add_argument("--price-prompt", type=float, default=0.00015, help="Environment USD per 1k prompt tokens.")
    parser.add_argument("--price-completion", type=float, default=0.0006,
                        help="Environment USD per 1k completion tokens.")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Extra config override KEY=VALUE (as `prompt-r1 train --set`), repeatable.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    setup_logging()
    defaults = QUICK if args.quick else {"config": "configs/learning-smollm.yaml", "alphas": ALPHAS,
                                         "steps": None, "probe_limit": None}
    config = args.config or defaults["config"]
    alphas = args.alphas or defaults["alphas"]
    steps = args.steps if args.steps is not None else defaults["steps"]
    probe_limit = args.probe_limit if args.probe_limit is not None else defaults["probe_limit"]
    overrides = parse_overrides(args.overrides)
    overrides.update({"environment.price_per_1k_prompt": args.price_prompt,
                      "environment.price_per_1k_completion": args.price_completion})
    if steps is not None:
        overrides["train.steps"] = steps
    cfg = load_config(ROOT / config, overrides)
    if cfg.train.environments:
        raise SystemExit("cost_sweep prices the one `environment`; a training pool (train.environments) is not "
                         "supported here yet: price each pool entry and extend `--price-*`")
    name = "cost_sweep_quick" if args.quick else "cost_sweep"
    json_path, png_path = args.out / f"{name}.json", args.out / f"{name}.png"
    saved = {"config": config, "overrides": args.overrides, "steps": cfg.train.steps, "alphas": alphas,
             "price_per_1k": [args.price_prompt, args.price_completion], "probe_limit": probe_limit, "runs": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for alpha in alphas:
        with tempfile.TemporaryDirectory(prefix=f"cost-sweep-{alpha}-") as home:
            saved["runs"].append(run_alpha(cfg, alpha, Path(home), probe_limit))
        atomic_write_text(json_path, json.dumps(saved, indent=1))  # a long sweep keeps what it finished
    plot(saved, png_path)
    print(f"{'alpha':>6} | {'answer':>6} | {'right':>5} | {'µ$/question':>11} | {'µ$/right':>9} | calls/q")
    for r in saved["runs"]:
        per_right = f"{r['usd_per_right_answer'] * 1e6:9.2f}" if r["usd_per_right_answer"] is not None else f"{'-':>9}"
        print(f"{r['alpha']:>6} | {r['answer_score']:6.3f} | {r['right_share']:5.2f} | "
              f"{r['usd_per_question'] * 1e6:11.2f} | {per_right} | {r['env_calls_per_question']:.2f}")
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
