"""The GPU check's parts (peak, a-f): what each runs and what it reads back; `gpu_check.py` runs them.

Why it is its own file: the driver (runs, deadlines, the summary) and the parts change for different
reasons; a part is a function of a `runner.Runner` and arguments that returns its figures as a dict.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from benchmarks.gpu.runner import Runner

# Dense bf16 tensor-core TFLOP/s from the cards' datasheets (no sparsity), MFU's second denominator;
# the most specific name first (an "H100 PCIe" is not an SXM "H100")
SPEC_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
               ("GH200", 989.4), ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0)]
# part a's rows, most valuable first: (name, shape, gpu_learner arguments)
A_ROWS = [
    ("qwen3-1.7b", "qwen3-1.7b", []),
    ("qwen3-1.7b packed/8192 logits/512", "qwen3-1.7b", ["--pack-tokens", "8192", "--logits-chunk", "512"]),
    ("qwen3-1.7b packed/8192 logits/512 no-checkpointing", "qwen3-1.7b",
     ["--pack-tokens", "8192", "--logits-chunk", "512", "--no-gradient-checkpointing"]),
    # a shape plan's logits term was not fitted to: micro-batch 4, responses of about 4,096 tokens
    ("qwen3-1.7b m4 r4096", "qwen3-1.7b",
     ["--micro-batch", "4", "--questions", "4", "--group", "4", "--agent-turn-tokens", "300", "500",
      "--env-reply-tokens", "400", "600", "--env-calls", "4", "4"]),
    ("qwen3-0.6b", "qwen3-0.6b", []),
    ("smollm2-135m", "smollm2-135m", []),
]
DRY_A_ROWS = [("tiny", "tiny", []), ("tiny packed/128 logits/4", "tiny",
                                     ["--pack-tokens", "128", "--logits-chunk", "4", "--max-response-tokens", "64"])]

PEAK_CODE = """
import json, sys, time, torch
n, device = int(sys.argv[1]), sys.argv[2]
a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
for _ in range(3): a @ b
sync(); t = time.perf_counter()
for _ in range(10): a @ b
sync(); s = (time.perf_counter() - t) / 10
name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else 0.0
print(json.dumps({"tflops": 2 * n**3 / s / 1e12, "n": n, "card": name, "gpu_memory_gib": memory,
                  "torch": torch.__version__, "cuda": torch.version.cuda}))
"""
BUILD_CODE = """
import sys
from pathlib import Path
from benchmarks.gpu.gpu_learner import build_random_model
build_random_model(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
"""


def part_peak(r: Runner, args) -> dict:
    n = "8192" if not args.dry_run else "256"
    out = r.checked([sys.executable, "-c", PEAK_CODE, n, args.device], r.left("peak"))
    return json.loads(out.strip().splitlines()[-1])


def build_model(r: Runner, args, shape: str, folder: Path, part: str) -> Path:
    if not (folder / "config.json").exists():
        r.checked([sys.executable, "-c", BUILD_CODE, shape, args.tokenizer, str(folder), args.device],
                  r.left(part))
    return folder


def spec_tflops(card: str) -> float | None:
    """The datasheet's dense bf16 TFLOP/s of `card` (torch's device name), None for a card not listed.

    >>> spec_tflops("NVIDIA H100 80GB HBM3"), spec_tflops("NVIDIA H100 PCIe"), spec_tflops("CPU")
    (989.4, 756.0, None)
    """
    return next((tflops for name, tflops in SPEC_TFLOPS if name in card), None)


def part_a(r: Runner, args, peak: dict | None) -> dict:
    rows = {}
    small = ["--questions", "2", "--group", "2", "--prompt-tokens", "8", "12", "--agent-turn-tokens", "3", "6",
             "--env-reply-tokens", "3", "6", "--env-calls", "1", "2", "--steps", "1"] if args.dry_run else []
    spec = spec_tflops(peak["card"]) if peak else None
    for name, shape, extra in DRY_A_ROWS if args.dry_run else A_ROWS:
        path = args.scratch / f"a-{len(rows)}.json"
        try:
            r.checked([sys.executable, "-m", "benchmarks.gpu.gpu_learner", "--shape", shape, "--tokenizer", args.tokenizer,
                       "--device", args.device, "--no-sync", "--json", str(path), *small, *extra], r.left("a"))
            row = json.loads(path.read_text())
            if peak:
                row["mfu"] = row["achieved_tflops"] / peak["tflops"]
            if spec:
                row["mfu_spec"] = row["achieved_tflops"] / spec
            plan = row.get("plan", {})
            if "gib" in plan:  # torch's peak counts tensors; plan's runtime part (CUDA context, libraries) is not among them
                plan["tensors_gib"] = plan["gib"] - sum(v for k, v in plan["parts"].items() if k.startswith("runtime"))
                if row["peak_gib"]:
                    row["plan_over_measured"] = plan["tensors_gib"] / row["peak_gib"]
            rows[name] = row
        except Exception as err:  # the next row still runs
            rows[name] = {"error": f"{type(err).__name__}: {err}"}
    if all("error" in v for v in rows.values()):
        raise RuntimeError("; ".join(f"{k}: {v['error']}" for k, v in rows.items()))
    return rows


def part_b(r: Runner, args) -> dict:
    shape = "tiny" if args.dry_run else "smollm2-135m"
    model = build_model(r, args, shape, args.scratch / f"model-{shape}", "b")
    path = args.scratch / "b.json"
    r.checked([sys.executable, "-m", "benchmarks.gpu.gpu_fsdp", "--model", str(model), "--device", args.device,
               "--tokens", "64" if args.dry_run else "1024", "--json", str(path)], r.left("b"))
    return json.loads(path.read_text())


def steps_from_warehouse(home: Path, run_id: str) -> list[dict]:
    from warehouse.store import Warehouse

    with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
        return wh.query_dicts(
            "SELECT step, min(policy_version) AS policy_version, max(policy_version) AS policy_version_max, "
            "avg(reward_total) AS reward_mean, count(*) AS trajectories, avg(CASE WHEN error IS NULL THEN 0 "
            "ELSE 1 END) AS env_error_rate, epoch(max(created_at)) AS recorded_at FROM trajectories "
            "WHERE run_id = ? GROUP BY step ORDER BY step", [run_id])


def dry_agent(args) -> list[str]:
    """The dry run trains the untrained tiny agent: the smoke config's `tiny-protocol` is built by a
    200-step warm start, seconds on the GPU machine's 16 cores but many minutes on a loaded 2-core one."""
    return ["agent.model=tiny"] if args.dry_run else []


def train_cmd(config: str, sets: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "prompt_r1.cli", "train", "-c", config, *extra,
            *[a for s in sets for a in ("--set", s)]]


# Part c stops its run after step 1 of 10: the stop is a SIGINT sent by a watcher that polls for the
# checkpoint, so the steps after it are the watcher's slack: a tiny model's step takes about a second,
# and on a 2-core machine running two test workers the watcher and the stop took longer than the
# three steps that 4 left (the run finished before it was stopped), so 10 leave nine.
C_STEPS, C_STOP_AFTER = 10, 1


def part_c(r: Runner, args) -> dict:
    home = args.scratch / "c-home"
    env = {**r.env, "PROMPT_R1_HOME": str(home)}
    sets = [f"train.device={args.device}", f"train.steps={C_STEPS}", "train.checkpoint_every=1", *dry_agent(args)]
    run_dir = home / "smoke" / "gpucheck"

    def at_stop_step() -> bool:
        # a checkpoint folder appears whole (renamed in) when it is written; any step at or past the
        # stop point counts, as `keep_checkpoints` prunes step 1 once two newer ones exist and a
        # starved watcher may first look after that
        return any(int(m.group(1)) >= C_STOP_AFTER for p in (run_dir / "checkpoints").glob("step-*")
                   if (m := re.fullmatch(r"step-(\d+)", p.name)))

    t0 = time.monotonic()
    first = r.run(train_cmd("configs/smoke.yaml", sets, "--run-id", "gpucheck"), r.left("c"), env=env, watch=at_stop_step)
    first_s = time.monotonic() - t0
    record = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    if record.get("finished_at"):
        raise RuntimeError(f"the run finished all {C_STEPS} steps before it could be stopped after step "
                           f"{C_STOP_AFTER}; no resume tested")
    if not at_stop_step():
        raise RuntimeError(f"the first run (exit {first.returncode}) left no checkpoint at step {C_STOP_AFTER} or later: "
                           f"{first.stdout.strip()[-800:]}")
    t0 = time.monotonic()
    resumed = r.checked(train_cmd("configs/smoke.yaml", sets, "--run-id", "gpucheck", "--resume"), r.left("c"), env=env)
    steps = steps_from_warehouse(home, "gpucheck")
    record = json.loads((run_dir / "run.json").read_text())
    on_policy = [s["step"] for s in steps if s["policy_version"] == s["policy_version_max"] == s["step"]]
    return {"first_run_s": first_s, "first_exit": first.returncode, "resume_s": time.monotonic() - t0,
            "resumed": "resuming run gpucheck" in resumed, "finished": bool(record.get("finished_at")),
            "steps": steps, "sampled_by_previous_version": len(on_policy) == len(steps) == C_STEPS}


def part_d(r: Runner, args) -> dict:
    home = args.scratch / "d-home"
    env = {**r.env, "PROMPT_R1_HOME": str(home)}
    if args.dry_run:  # the smoke pair: the real weights would take this machine minutes a step
        config, sets = "configs/smoke.yaml", ["rollout.batch_questions=2", "rollout.group_size=2", *dry_agent(args)]
    else:
        # the rollouts generate on the learner's GPU (`rollout.colocate`): one actor, every agent turn of
        # the 128 episodes as one batch in bf16, the in-process environment on the same GPU
        config = "configs/learning-smollm.yaml"
        sets = ["agent.backend=transformers", "agent.batch_invariant=false", "agent.device=cuda",
                "agent.dtype=bfloat16", "rollout.colocate=true", "rollout.num_workers=1", "rollout.cpus_per_worker=2",
                "environment.kind=inprocess", "environment.device=cuda", "environment.concurrency=128",
                "rollout.batch_questions=16", "rollout.group_size=8", "train.mini_batch_questions=16",
                "train.micro_batch_size=16", "train.checkpoint_every=100"]
    sets += [f"train.device={args.device}", f"train.steps={args.d_steps}", *args.d_set]
    t0 = time.monotonic()
    error = None
    try:
        r.checked(train_cmd(config, sets, "--run-id", "gpucheck"), r.left("d"), env=env)
    except Exception as err:  # a run cut by its deadline still has its recorded steps
        error = f"{type(err).__name__}: {err}"
    wall = time.monotonic() - t0
    steps = steps_from_warehouse(home, "gpucheck") if (home / "warehouse.duckdb").exists() else []
    if not steps:
        raise RuntimeError(error or "no step was recorded")
    gaps = [b["recorded_at"] - a["recorded_at"] for a, b in zip(steps, steps[1:])]
    step_s = sum(gaps) / len(gaps) if gaps else None
    stages = stage_seconds(home)
    shares = None
    if step_s and stages.get("rollout_time_s") and stages.get("step_time_s"):
        rollout, update = stages["rollout_time_s"], stages["step_time_s"]
        rest = max(step_s - rollout - update, 0.0)  # the weight sync, scoring and recording
        shares = {"generation": rollout / step_s, "update": update / step_s, "sync_and_rest": rest / step_s}
    return {"config": config, "sets": sets, "wall_s": wall, "steps_recorded": len(steps), "step_s": step_s,
            "steps_per_hour": 3600 / step_s if step_s else None, "reward_per_step": [s["reward_mean"] for s in steps],
            "stage_s": stages, "shares": shares, "steps": steps, "cut_short": error}


def stage_seconds(home: Path) -> dict[str, float]:
    """Mean seconds a step spent rolling out (`rollout_time_s`) and updating (`step_time_s`), from the
    train run's MLflow metrics (the first step left out where there are more: it loads and compiles)."""
    if not (home / "mlflow.db").exists():
        return {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "tags.flow = 'train'") if experiments else []
    out: dict[str, float] = {}
    for name in ("rollout_time_s", "step_time_s"):
        values = [m.value for run in runs for m in sorted(client.get_metric_history(run.info.run_id, name),
                                                           key=lambda m: m.step)]
        values = values[1:] if len(values) > 1 else values
        if values:
            out[name] = sum(values) / len(values)
    return out


def part_e(r: Runner, args) -> dict:
    shape = "tiny" if args.dry_run else "qwen3-1.7b"
    model = build_model(r, args, shape, args.scratch / f"model-{shape}", "e")
    path = args.scratch / "e.json"
    r.checked([sys.executable, "-m", "benchmarks.speed.weight_sync", "--model", str(model), "--device", args.device,
               "--dtype", "float32" if args.dry_run else "bfloat16", "--repeats", "1",
               "--no-before-after", "--json", str(path)], r.left("e"))
    return json.loads(path.read_text())


F_STEPS, F_QUESTIONS, F_GROUP = 16, 16, 8
F_CRITERIA = "benchmarks/criteria/compositional-turn-gpu.json"
# part f's rollouts as part d's, and the agent trained as a LoRA adapter (kept: a few MiB)
F_SETS = ["agent.backend=transformers", "agent.batch_invariant=false", "agent.device=cuda", "agent.dtype=bfloat16",
          "rollout.colocate=true", "rollout.num_workers=1", "rollout.cpus_per_worker=2", "environment.kind=inprocess",
          "environment.device=cuda", "environment.concurrency=128", f"rollout.batch_questions={F_QUESTIONS}",
          f"rollout.group_size={F_GROUP}", "train.mini_batch_questions=8", "train.micro_batch_size=16",
          "train.device=cuda", "train.checkpoint_every=8", "agent.lora.enabled=true", "agent.lora.r=16",
          "train.lr=1.0e-4"]
# the dry run: the tiny pair, one step of 2 x 2, 4 probe questions
DRY_F_SETS = ["agent.model=tiny", "agent.backend=transformers", "environment.kind=inprocess", "environment.model=tiny",
              "rollout.batch_questions=2", "rollout.group_size=2", "train.mini_batch_questions=2",
              "train.micro_batch_size=4", "train.checkpoint_every=1", "agent.lora.enabled=true", "agent.lora.r=4"]


def part_f(r: Runner, args) -> dict:
    folder = args.out / "two-hop"
    steps = "1" if args.dry_run else str(F_STEPS)
    cmd = [sys.executable, "-m", "benchmarks.experiments.learning", "--config", "configs/learning-compositional-turn.yaml",
           "--probe-dataset", "compositional_probe", "--criteria", F_CRITERIA, "--steps", steps, "--out", str(folder),
           "--agents", str(folder / "agents"), "--arms", *args.f_arms,
           *[a for s in (DRY_F_SETS if args.dry_run else F_SETS) for a in ("--set", s)]]
    if args.dry_run:
        cmd += ["--probe-limit", "4"]
    if (folder / "learning.json").exists():
        cmd.append("--keep")  # the arms an earlier run added stay in the experiment
    env = {**r.env, "PROMPT_R1_HOME": str(args.scratch / "f-home")}
    r.checked(cmd, r.left("f"), env=env)
    saved = json.loads((folder / "learning.json").read_text())
    arms = {arm: {"probe_before": probe_score(res["probe_before"]), "train_s": res.get("train_s"),
                  "probe_after": probe_score(res.get("probe_after")), "agent": res.get("agent")}
            for arm, res in saved["results"].items()}
    return {"folder": str(folder), "arms": arms, "verdict": saved.get("verdict")}


def probe_score(probe: list[dict] | None) -> float | None:
    """The mean answer score over a probe's questions (None where the arm has none)."""
    return sum(p["answer_score"] for p in probe) / len(probe) if probe else None
