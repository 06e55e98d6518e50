"""`make demo`: the main job on the embedded defaults, end to end, with timings.

Ingests the two-hop task and the sample data (and `--data` if given), starts the managed vLLM
environment(s), trains the follow-up agent (SmolLM2-135M-Instruct after a format warm start) with
recipe 5 of "Learning to prompt" (GRPO, guided exploration of both calls, turn rewards; 8 steps)
against SmolLM2 on two-hop questions, evaluates base vs
trained agent vs `direct` and `cot` on 40 held-out two-hop questions and the single-hop sample
datasets (the out-of-task check) against SmolLM2, and on the sample datasets against Gemma 3 (the
held-out environment, `eval.environment_suites`), registers the agent, and
prints the results table (each environment marked held out or trained on: Gemma 3 is held out,
training used SmolLM2; tokens, dollars per question and per correct answer at the config's
illustrative prices), then what training changed (both checkpoints with intervals, their paired
change, and what the agent did with the environment before -> after), then evaluates the shipped
agent (`SHIPPED`: recipe 5's seed-0 agent, 24 steps) beside the base on the same
two-hop questions and prints that comparison too, where the plots are, and
how to open the MLflow and Prefect UIs. `--quick` starts from the follow-up agent's quicker warm
start (`smollm2-135m-protocol-followup-quick`, the same examples as whole trajectories), trains one
small step (2 of its 4 members scaffolded) and evaluates base and trained against SmolLM2 alone (so its split shows no held-out
environment), on 20 of the 40 two-hop questions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = {  # `make demo QUICK=1`: same pipeline, smaller numbers: one GRPO step on 2 two-hop
    # questions x 4 samples, 20 of the 40 held-out two-hop questions and 1 question per sample
    # dataset, the agent methods with the environment only, against the first demo environment only
    # (the full demo adds agent_only, the OPRO baseline and the transfer to Gemma 3)
    "train.steps": 1, "rollout.batch_questions": 2, "rollout.group_size": 4, "rollout.scaffold.members": 2,
    "eval.limit_per_dataset": 1,
    "eval.dataset_limits": {"compositional_probe": 20},
}
QUICK_DROPS = ("agent_only", "opro", "gepa", "textgrad")


def quick_overrides(base) -> dict:
    """`QUICK`, and what it takes from the config `base`: its first environment alone, the methods
    without `QUICK_DROPS`, and the follow-up agent's quicker warm start (the 32-step one alone took
    7 of the quick demo's 12 minutes from an empty `runs/`)."""
    from prompt_r1.models.bundled import SMOLLM2_FOLLOWUP, SMOLLM2_FOLLOWUP_QUICK

    kept = base.eval_environments()[:1]
    overrides = {**QUICK, "eval.environments": [e.model_dump() for e in kept],
                 "eval.environment_suites": {n: s for n, s in base.eval.environment_suites.items()
                                             if n in {e.name for e in kept}},
                 "eval.methods": [m for m in base.eval.methods if m not in QUICK_DROPS]}
    if base.agent.model == SMOLLM2_FOLLOWUP:
        overrides["agent.model"] = SMOLLM2_FOLLOWUP_QUICK
    return overrides


# The two-hop agent this project ships (BENCHMARKS.md, "Learning to prompt"): recipe 5, the one that
# passed its pre-registered bar, seed 0 after 24 steps, kept as a rank-64 adapter; its first call
# asks the first hop
SHIPPED = "shipped=benchmarks/results/first-call/shipped-agent"


def shipped_overrides(base) -> dict:
    """The full demo's last evaluation: the shipped agent beside the base, with the environment, on
    all 60 held-out two-hop questions (the probe its figures were measured on; 40 leave an interval
    about 20 points wide either side) against the first environment. An evaluation of its own, after
    the pipeline's has stopped its engines and servers: a third agent engine beside the two
    environment servers does not fit in 24 GiB of RAM (vLLM's CPU engines each hold their KV cache)."""
    return {"eval.agent_checkpoints": ["base", SHIPPED], "eval.methods": ["agent"],
            "eval.suites": ["compositional_probe"], "eval.environment_suites": {},
            "eval.dataset_limits": {"compositional_probe": 60},
            "eval.environments": [e.model_dump() for e in base.eval_environments()[:1]]}


# What each GRPO step did, printed from the train run's MLflow metrics (those the config produces):
# the batch's reward and answer score, the share of sampled (not scaffolded) first calls that ask
# the first hop (the two-hop task's indicator), and each judged turn's mean reward.
STEP_METRICS = {"reward_mean": "reward", "answer_score": "answer", "indicator_first_hop": "first call asks the first hop",
                "turn_reward_t0": "turn 1 reward", "turn_reward_t1": "turn 2 reward", "turn_reward_t2": "answer turn reward"}


def step_table(client, run_id: str) -> str:
    """One Markdown row per training step of `run_id`, a column per `STEP_METRICS` key it logged."""
    history = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)} for key in STEP_METRICS}
    history = {key: values for key, values in history.items() if values}
    steps = sorted({step for values in history.values() for step in values})
    rows = ["| step | " + " | ".join(STEP_METRICS[key] for key in history) + " |",
            "|---|" + "---|" * len(history)]
    rows += [f"| {step} | " + " | ".join(f"{values[step]:.3f}" if step in values else "-" for values in history.values())
             + " |" for step in steps]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--data", default=None, help="Also ingest and evaluate on this folder (e.g. path/to/prompt-r1-data).")
    parser.add_argument("--quick", action="store_true", help="Shorter run (under 10 minutes).")
    args = parser.parse_args()
    os.chdir(ROOT)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # offline: no telemetry errors
    from prompt_r1.config.experiment import load_config
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.cli.logging_setup import setup_logging
    from prompt_r1.core.signals import install_sigterm_interrupt

    # SIGTERM stops the demo as Ctrl-C does, so its servers, Ray and Prefect's temporary server stop too
    install_sigterm_interrupt()
    setup_logging()
    base = load_config(args.config)
    overrides = quick_overrides(base) if args.quick else {}
    if args.data:
        overrides["eval.suites"] = list(dict.fromkeys(base.eval.suites + ["in_domain", "ood"]))
        overrides["eval.limit_per_dataset"] = 2  # 16 more datasets: keep the demo within its time
    t_start = time.perf_counter()
    from prompt_r1.models.resolver import resolve_agent

    t0 = time.perf_counter()
    # Built once and cached under runs/models: the environment's model, then the agent's format
    # warm start (minutes of CPU), before any server starts competing for the cores.
    if base.environment.kind != "openai":
        resolve_model(base.environment.model)
    resolve_agent(overrides.get("agent.model", base.agent.model))
    model_s = time.perf_counter() - t0
    from flows.pipeline import pipeline_flow

    result = pipeline_flow(args.config, args.data, overrides or None)
    shipped, shipped_s = None, 0.0
    if not args.quick:
        from flows.evaluate import evaluate_flow

        t0 = time.perf_counter()
        shipped = evaluate_flow(args.config, overrides=shipped_overrides(base), ingest=False)
        shipped_s = time.perf_counter() - t0
    total = time.perf_counter() - t_start
    report = Path(result["evaluate"]["report"])
    print("\n" + report.read_text())
    effect = report.parent / "training_effect.md"
    if effect.exists():  # the headline again, after the long report
        print("\n" + effect.read_text())
    before, after = result["train"]["validation_before"], result["train"]["validation"]
    if "val_reward" in after:
        print(f"Held-out validation reward, before -> after training: "
              f"{before.get('val_reward', float('nan')):.3f} -> {after['val_reward']:.3f}"
              f"  (answer score {before.get('val_answer', float('nan')):.3f} -> {after['val_answer']:.3f})")
    if shipped is not None:  # what a longer training taught, beside the base (its own report folder)
        shipped_effect = Path(shipped["report"]).parent / "training_effect.md"
        print("\nThe shipped agent (benchmarks/results/first-call/shipped-agent: recipe 5, 24 steps) "
              "beside the base, on all held-out two-hop questions:\n"
              + (shipped_effect.read_text() if shipped_effect.exists() else "(no question scored by both)\n"))
    print("Stage timings (s): " + json.dumps({"models": round(model_s, 1),
          **{k: round(v, 1) for k, v in result["seconds"].items()},
          **({"shipped_agent": round(shipped_s, 1)} if shipped is not None else {}), "total": round(total, 1)}))
    print(f"Plots and tables: {report.parent}")
    print(f"Registered agent: {base.registered_model()} version {result['train']['model_version']}"
          f" (champion: {result['train']['champion']})")
    from mlflow import MlflowClient
    from prompt_r1.core.urls import redact_url
    from tasks.tracking.runs import compare_url, is_local, tracking_uri

    where = tracking_uri(base.tracking.uri)
    print("\n## Training, step by step (the train run's metrics)\n" + step_table(MlflowClient(where), result["train"]["run_id"]))
    experiment = MlflowClient(where).get_experiment_by_name(base.name)
    shown = redact_url(where)  # a server's URI from the environment may hold a password
    ui = (f"  .venv/bin/mlflow ui --backend-store-uri {where} --port 5000\n  then open {compare_url(experiment.experiment_id)}"
          if is_local(where) else f"  open {compare_url(experiment.experiment_id, shown.rstrip('/'))}")
    print("Look at the runs:\n"
          f"{ui}\n"
          "  (the environment LLMs side by side: evaluation runs grouped by environment and method, headline charts)\n"
          "  .venv/bin/prefect server start   # then http://127.0.0.1:4200 (see docs/deployments.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
