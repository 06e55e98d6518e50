"""Does training against a pool of environment LLMs transfer, and does it lose anything? The transfer matrix.

From the same agent, with the same budget (steps, questions per step, samples, seed: so the same
questions in the same order), three agents are trained through the real training loop
(`TrainingSession.run()`, as `prompt-r1 train` runs it): on each member of the config's
`train.environments` alone, and on the whole pool (its weights; 1:1 in the shipped configs).
Each trained agent and the untrained one then answer the same probe questions on every pool
member through the one evaluation path (`prompt_r1.evaluation.evaluate`, method `agent`, greedy).
Reported, on each environment (the columns), per agent (the rows, "trained on"):

- the mean answer score (the dataset's primary metric: token F1 for the screened questions) with
  its 95% bootstrap interval (several probe datasets: over their questions pooled);
- the paired difference against the untrained agent on the same questions (bootstrap interval,
  sign-flip p; `prompt_r1.evaluation.stats.paired_comparison`, a probe dataset per stratum);
- pool minus the agent trained on that environment alone (does pool training lose anything
  there?), and the worst of those over the environments with the interval of that minimum
  (`paired_worst`: it was picked for being worst).
A question whose environment call failed under either agent is left out of its pair and counted
(`dropped`): a failure is not a score.

The probe (`--probe-dataset`, default `screened_probe`, data/screened/test: 40 single-hop questions).
Chosen over the compositional probe because one environment call answers each of these (the
agent needs no second call, which `smollm2-135m-protocol` never makes) and because SmolLM2 answered
every one of them in the screen (`benchmarks/screens/screen.py`), so a trained agent can gain there. The
screen ran on SmolLM2 only: Gemma 3 270M never screened these questions, so its column may start
lower and has less room to show a gain; the untrained agent's row measures that.

Results go to OUT/env_pool.json (every per-question score too) and OUT/env_pool.png (heatmaps),
and the table is printed. The full run takes hours on a small CPU machine: with `--work DIR` it
keeps its warehouse, training runs, agents and evaluations there, and the same command started
again goes on where a stopped run left off (`WorkFolder`).

    .venv/bin/python -m benchmarks.experiments.env_pool --quick   # tiny models, two in-process environments: minutes
    .venv/bin/python -m benchmarks.experiments.env_pool --work runs/env_pool   # configs/learning-pool.yaml: SmolLM2 + Gemma 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import Config, load_config, parse_overrides
from prompt_r1.core.fsutil import atomic_write_text
from prompt_r1.core.signals import install_sigterm_interrupt
from prompt_r1.evaluation.compare import paired_scores
from prompt_r1.evaluation.stats import bootstrap_ci, cell_seed, paired_comparison, paired_worst

log = logging.getLogger("benchmarks.experiments.env_pool")

UNTRAINED, POOL = "base", "pool"  # agent labels (evaluation methods `agent:base`, `agent:pool`)
TINY_ENVS = [  # two tiny models of different shapes, in process: the plumbing, not an effect
    {"name": "tiny-env", "kind": "inprocess", "model": "tiny", "max_tokens": 16, "temperature": 0.0, "weight": 1.0},
    {"name": "tiny-smollm2-env", "kind": "inprocess", "model": "tiny-smollm2", "max_tokens": 16,
     "temperature": 0.0, "weight": 1.0},
]
# lr 1e-2: at smoke.yaml's 1e-4 two updates leave every greedy answer of the tiny agent as it was, so
# the matrix would be all zeros whether or not the arms differ; a large step makes them differ.
QUICK = {"config": "configs/smoke.yaml", "probe_dataset": "sample", "probe_limit": 4,
         "overrides": {"train.environments": TINY_ENVS, "train.steps": 2, "train.lr": 1e-2}}
FULL = {"config": "configs/learning-pool.yaml", "probe_dataset": "screened_probe", "probe_limit": None,
        "overrides": {}}


def single_label(env_name: str) -> str:
    return f"only-{env_name}"


def arm_configs(cfg: Config) -> dict[str, Config]:
    """Agent label -> training config: each pool member alone (as the one `environment`), then the pool."""
    if len(cfg.train.environments) < 2:
        raise SystemExit(f"config {cfg.name}: env_pool needs a pool of at least two environments in "
                         "train.environments (see configs/learning-pool.yaml)")
    arms = {single_label(entry.name): cfg.model_copy(update={
        "environment": entry.env(), "train": cfg.train.model_copy(update={"environments": []})})
        for entry in cfg.train.environments}
    return {**arms, POOL: cfg}


def by_question(predictions: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, Mapping[str, Any]]]:
    """(env, agent label, dataset) -> question id -> evaluation row (method `agent:<label>`)."""
    cells: dict[tuple[str, str, str], dict[str, Mapping[str, Any]]] = {}
    for p in predictions:
        label = p["method"].removeprefix("agent:")
        cells.setdefault((p["env_name"], label, p["dataset"]), {})[p["question_id"]] = p
    return cells


def _strata(cells, env: str, a: str, b: str) -> tuple[list[list[float]], list[list[float]], int]:
    """A's and B's scores on `env`, one stratum per dataset both answered, and the questions dropped."""
    sa, sb, dropped = [], [], 0
    for dataset in sorted({d for e, label, d in cells if e == env and label == a}):
        if (env, b, dataset) not in cells:
            continue
        x, y, _, gone = paired_scores(cells[(env, a, dataset)], cells[(env, b, dataset)])
        dropped += gone
        if x:
            sa.append(x)
            sb.append(y)
    return sa, sb, dropped


def paired(cells, env: str, a: str, b: str, *seed: object) -> dict[str, Any]:
    """A − B on `env` over the questions both scored, per-dataset strata (`paired_comparison`)."""
    sa, sb, dropped = _strata(cells, env, a, b)
    return {**paired_comparison(sa, sb, seed=cell_seed("env_pool", env, a, b, *seed)), "dropped": dropped}


def transfer_matrix(predictions: Sequence[Mapping[str, Any]], agents: Sequence[str],
                    envs: Sequence[str]) -> list[dict[str, Any]]:
    """One cell per (agent, environment): mean score over the questions scored there with its 95%
    bootstrap interval, and the paired difference against the untrained agent (`vs_untrained`)."""
    cells = by_question(predictions)
    out = []
    for agent in agents:
        for env in envs:
            rows = [r for (e, label, _), qs in cells.items() if e == env and label == agent for r in qs.values()]
            scores = [r["score"] for r in rows if not r.get("error") and r["score"] is not None]
            low, high = bootstrap_ci(scores, seed=cell_seed("env_pool", env, agent))
            cell = {"agent": agent, "env": env, "mean": sum(scores) / len(scores) if scores else None,
                    "ci_low": low, "ci_high": high, "n": len(scores), "errors": len(rows) - len(scores)}
            if agent != UNTRAINED:
                cell["vs_untrained"] = paired(cells, env, agent, UNTRAINED)
            out.append(cell)
    return out


def pool_vs_single(predictions: Sequence[Mapping[str, Any]], envs: Sequence[str]) -> dict[str, Any]:
    """On each environment, the pool agent − the agent trained on that environment alone; and the
    worst of those differences with the bootstrap interval of the minimum (`paired_worst`)."""
    cells = by_question(predictions)
    per_env = {env: paired(cells, env, POOL, single_label(env)) for env in envs}
    groups = [_strata(cells, env, POOL, single_label(env))[:2] for env in envs]
    worst = paired_worst(groups, seed=cell_seed("env_pool", "pool-vs-single", "worst"))
    if worst["index"] is not None:
        worst["env"] = envs[worst["index"]]
    return {"per_env": per_env, "worst": worst}


@contextlib.contextmanager
def served(envs: Sequence[Any], log_dir: Path):
    """The environments as evaluation reaches them, each managed vLLM server started once for all
    agents (`actor_environment`); in-process ones as they are."""
    from prompt_r1.rollout.pool import actor_environment

    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(actor_environment(env, log_dir)) for env in envs]


class WorkFolder:
    """What a run keeps in its work folder so that, started again on the same folder with the same
    settings, it goes on where it stopped: `settings.json` (refused if they differ), `arms.json`
    (each finished arm and its exported agent) and `eval-<agent>.json` (each evaluated agent's
    rows). An arm stopped part-way resumes from its last checkpoint (`TrainingSession(resume=True)`)."""

    def __init__(self, root: Path, settings: Mapping[str, Any]):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        path = root / "settings.json"
        if path.exists() and json.loads(path.read_text()) != json.loads(json.dumps(settings)):
            raise SystemExit(f"{root} holds a run of env_pool with other settings ({path}); give another --work "
                             "folder, or the same config, overrides, steps and probe")
        atomic_write_text(path, json.dumps(settings, indent=1))

    def _read(self, name: str) -> dict[str, Any]:
        path = self.root / name
        return json.loads(path.read_text()) if path.exists() else {}

    def finished_arm(self, label: str) -> dict[str, Any] | None:
        arm = self._read("arms.json").get(label)
        return arm if arm and Path(arm["agent_path"]).exists() else None

    def save_arm(self, label: str, arm: Mapping[str, Any]) -> None:
        arms = {**self._read("arms.json"), label: dict(arm)}
        atomic_write_text(self.root / "arms.json", json.dumps(arms, indent=1))

    def evaluated(self, label: str) -> dict[str, Any] | None:
        return self._read(f"eval-{label}.json") or None

    def save_eval(self, label: str, rows: list[dict[str, Any]], seconds: float) -> None:
        atomic_write_text(self.root / f"eval-{label}.json", json.dumps({"rows": rows, "eval_s": seconds}))


def kept_fields(prediction: Mapping[str, Any]) -> dict[str, Any]:
    return {k: prediction[k] for k in ("env_name", "method", "dataset", "question_id", "score", "primary_metric",
                                       "prediction", "error")}


def train_arm(cfg: Config, label: str, home: Path, wh) -> dict[str, Any]:
    """One training run in `home/label` (resumed from its last checkpoint if an earlier run of the
    benchmark stopped part-way); returns the exported agent and the run's figures."""
    from prompt_r1.training.session import TrainingSession

    started = time.perf_counter()
    with TrainingSession(cfg, wh, f"env-pool-{label}", home / label, resume=True) as session:
        outcome = session.run()
    if outcome.agent is None:
        raise SystemExit(f"arm {label}: training left no checkpoint to evaluate")
    return {"agent_path": str(outcome.agent), "trained_on": [e.name for e in cfg.training_environments()],
            "weights": cfg.training_weights(), "train_s": round(time.perf_counter() - started, 1)}


def run(cfg: Config, work: WorkFolder, probe_dataset: str, probe_limit: int | None, saved: dict,
        json_path: Path) -> None:
    """Train every arm, then evaluate every agent on every pool member; fills `saved` as it goes and
    keeps each finished arm and evaluated agent in `work`, so a stopped run goes on from there."""
    from prompt_r1.data.ingest import ingest
    from prompt_r1.evaluation.evaluate import evaluate
    from prompt_r1.models.resolver import resolve_agent
    from warehouse.store import Warehouse

    eval_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={
        "methods": ["agent"], "suites": [probe_dataset], "limit_per_dataset": probe_limit})})
    envs = cfg.training_environments()
    home = work.root
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, cfg.data.sources, cfg.data.max_question_chars)
        agents = {UNTRAINED: str(resolve_agent(cfg.agent.model, config_name=cfg.name))}
        for label, arm_cfg in arm_configs(cfg).items():
            arm = work.finished_arm(label)
            if arm is not None:
                log.info("%s: trained by an earlier run of this work folder, reused", label)
            else:
                log.info("training %s on %s", label, ", ".join(e.name for e in arm_cfg.training_environments()))
                arm = train_arm(arm_cfg, label, home, wh)
                work.save_arm(label, arm)
            saved["arms"][label] = arm
            agents[label] = arm["agent_path"]
            atomic_write_text(json_path, json.dumps(saved, indent=1))  # a long run keeps what it finished
        # from the warehouse's rows: an arm resumed from a checkpoint has every step there
        saved["curves"] = {label: wh.step_rewards(f"env-pool-{label}") for label in arm_configs(cfg)}
        rows: list[dict[str, Any]] = []
        todo = {}
        for label, path in agents.items():
            done = work.evaluated(label)
            if done is None:
                todo[label] = path
                continue
            log.info("%s: evaluated by an earlier run of this work folder, reused", label)
            rows += done["rows"]
            saved["eval_s"][label] = done["eval_s"]
        if todo:
            with served(envs, home / "logs") as reachable:
                for label, path in todo.items():  # one agent engine at a time, beside the servers
                    started = time.perf_counter()
                    # a fresh run id per attempt: an attempt stopped part-way left some rows of its own
                    run_id = f"env-pool-eval-{label}-{time.strftime('%Y%m%dT%H%M%S')}"
                    outcome = evaluate(eval_cfg, wh, run_id, {label: path}, reachable)
                    kept = [kept_fields(p) for p in outcome.predictions]
                    saved["eval_s"][label] = round(time.perf_counter() - started, 1)
                    work.save_eval(label, kept, saved["eval_s"][label])
                    rows += kept
    saved["predictions"] = rows
    names = [e.name for e in envs]
    saved["matrix"] = transfer_matrix(rows, [UNTRAINED, *arm_configs(cfg)], names)
    saved["pool_vs_single"] = pool_vs_single(rows, names)


def _interval(c: Mapping[str, Any]) -> str:
    if c.get("diff") is None:
        return "n/a"
    return f"{c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] p={c['p_value']:.2f}"


def table(saved: Mapping[str, Any]) -> str:
    """The transfer matrix and the pool − single differences as text."""
    envs = saved["environments"]
    cells = {(c["agent"], c["env"]): c for c in saved["matrix"]}
    agents = list(dict.fromkeys(c["agent"] for c in saved["matrix"]))
    lines = ["trained on \\ evaluated on: mean score [95% CI]; paired change vs untrained [95% CI]"]
    for agent in agents:
        parts = []
        for env in envs:
            c = cells[(agent, env)]
            mean = "n/a" if c["mean"] is None else f"{c['mean']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
            parts.append(f"{env}: {mean}" + (f"; {_interval(c['vs_untrained'])}" if "vs_untrained" in c else ""))
        lines.append(f"  {'untrained' if agent == UNTRAINED else agent:>24} | " + " | ".join(parts))
    pvs = saved["pool_vs_single"]
    for env, c in pvs["per_env"].items():
        lines.append(f"pool - {single_label(env)} on {env}: {_interval(c)} (n={c['n']}, dropped {c['dropped']})")
    w = pvs["worst"]
    if w["diff"] is not None:
        lines.append(f"pool - single, worst environment ({w['env']}): {w['diff']:+.3f} "
                     f"[{w['ci_low']:+.3f}, {w['ci_high']:+.3f}]")
    return "\n".join(lines + curve_lines(saved.get("curves", {})))


def curve_lines(curves: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    """Each arm's mean training reward per step and environment (the warehouse's rows), as
    `step:reward/trajectories` (a pool's step may draw one environment only)."""
    lines = ["training reward per step (step:mean reward of the scored trajectories/trajectories)"] if curves else []
    for label, rows in curves.items():
        for env in dict.fromkeys(r["env_name"] for r in rows):
            cells = [f"{r['step'] + 1}:" + ("n/a" if r["reward_mean"] is None else f"{r['reward_mean']:+.2f}")
                     + f"/{r['trajectories']}" for r in rows if r["env_name"] == env]
            lines.append(f"  {label:>24} on {env}: {' '.join(cells)}")
    return lines


def plot(saved: Mapping[str, Any], path: Path) -> None:
    """Two heatmaps, trained on x evaluated on: the mean score, and the paired change vs untrained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    envs = saved["environments"]
    cells = {(c["agent"], c["env"]): c for c in saved["matrix"]}
    agents = list(dict.fromkeys(c["agent"] for c in saved["matrix"]))
    nan = float("nan")
    mean = np.array([[cells[(a, e)]["mean"] if cells[(a, e)]["mean"] is not None else nan for e in envs]
                     for a in agents])
    diff = np.array([[cells[(a, e)].get("vs_untrained", {}).get("diff") or 0.0 for e in envs] for a in agents])
    fig, axes = plt.subplots(1, 2, figsize=(5 + 2.4 * len(envs), 1.6 + 0.7 * len(agents)))
    bound = max(0.05, float(np.nanmax(np.abs(diff))))
    for ax, data, title, cmap, lim in ((axes[0], mean, "mean score", "viridis", (0, 1)),
                                       (axes[1], diff, "change vs untrained", "RdBu", (-bound, bound))):
        ax.imshow(data, cmap=cmap, vmin=lim[0], vmax=lim[1], aspect="auto")
        ax.set_xticks(range(len(envs)), envs, rotation=15)
        ax.set_yticks(range(len(agents)), ["untrained" if a == UNTRAINED else a for a in agents])
        ax.set(title=title, xlabel="evaluated on")
        for i, a in enumerate(agents):
            for j, e in enumerate(envs):
                c = cells[(a, e)]
                if data is mean:
                    text = "n/a" if c["mean"] is None else f"{c['mean']:.2f}\n[{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
                else:
                    v = c.get("vs_untrained")
                    text = "-" if v is None or v["diff"] is None else \
                        f"{v['diff']:+.2f}\n[{v['ci_low']:+.2f}, {v['ci_high']:+.2f}]"
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black",
                        bbox={"facecolor": "white", "alpha": 0.6, "edgecolor": "none"})
    axes[0].set_ylabel("trained on")
    fig.suptitle(f"env pool: {saved['config']}, {saved['steps']} steps per agent, probe {saved['probe_dataset']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"Tiny models, a check that the benchmark runs: {QUICK} (explicit flags still win).")
    parser.add_argument("--config", help=f"Experiment config with a pool of >= 2 in train.environments "
                                         f"(default {FULL['config']}).")
    parser.add_argument("--steps", type=int, help="Override train.steps (the same budget for every agent).")
    parser.add_argument("--probe-dataset", help=f"Dataset (or suite) of the probe questions, split test "
                                                f"(default {FULL['probe_dataset']}).")
    parser.add_argument("--probe-limit", type=int, metavar="N", help="Probe with the first N questions per dataset.")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Extra config override KEY=VALUE (as `prompt-r1 train --set`), repeatable.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work", type=Path, help="Folder kept after the run: its warehouse, each arm's training "
                        "run and agent, each agent's evaluation. Started again on the same folder with the same "
                        "settings, a stopped run goes on where it stopped (an arm from its last checkpoint). "
                        "Default: a temporary folder, removed at the end.")
    parser.add_argument("--replot", action="store_true", help="Only redraw the PNG and table from the saved JSON.")
    args = parser.parse_args()
    setup_logging()
    install_sigterm_interrupt()  # SIGTERM stops it as Ctrl-C does: servers and actors stop, `--work` keeps the rest
    defaults = QUICK if args.quick else FULL
    name = "env_pool_quick" if args.quick else "env_pool"
    json_path, png_path = args.out / f"{name}.json", args.out / f"{name}.png"
    if args.replot:
        saved = json.loads(json_path.read_text())
        plot(saved, png_path)
        print(table(saved))
        return
    config = args.config or defaults["config"]
    probe_dataset = args.probe_dataset or defaults["probe_dataset"]
    probe_limit = args.probe_limit if args.probe_limit is not None else defaults["probe_limit"]
    overrides = {**defaults["overrides"], **parse_overrides(args.overrides)}
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    cfg = load_config(ROOT / config, overrides)
    arm_configs(cfg)  # a config without a pool fails before anything starts
    saved: dict[str, Any] = {
        "config": config, "overrides": args.overrides, "steps": cfg.train.steps, "seed": cfg.seed,
        "budget": {"batch_questions": cfg.rollout.batch_questions, "group_size": cfg.rollout.group_size},
        "environments": [e.name for e in cfg.training_environments()], "weights": cfg.training_weights(),
        "probe_dataset": probe_dataset, "probe_limit": probe_limit, "arms": {}, "eval_s": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: saved[k] for k in ("config", "overrides", "steps", "seed", "budget", "environments", "weights",
                                      "probe_dataset", "probe_limit")}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        home = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="env-pool-")))
        run(cfg, WorkFolder(home.resolve(), {**settings, "config_hash": cfg.hash()}), probe_dataset, probe_limit,
            saved, json_path)
    saved["wall_s"] = round(time.perf_counter() - started, 1)  # this invocation's, when it went on from a work folder
    for arm in saved["arms"].values():
        arm.pop("agent_path")  # in the work folder (a temporary one is gone now)
    atomic_write_text(json_path, json.dumps(saved, indent=1))
    plot(saved, png_path)
    print(table(saved))
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
