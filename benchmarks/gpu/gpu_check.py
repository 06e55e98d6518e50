"""The GPU check: every CUDA path of the training loop measured, most valuable first, in three runs.

Why it exists: time on a GPU host is precious and a run should say as much as it can, so one command
measures a set of parts, each in its own process with its own deadline (a part that fails or runs out
of time is recorded with its error, and the next part runs):

- peak: the bf16 matmul TFLOP/s of this card (8192^3 products), MFU's first denominator; the card's
  datasheet figure (dense bf16, `SPEC_TFLOPS`) is the second, where the card is known;
- a: the learner (gpu_learner.py, random weights): Qwen3-1.7B first (the headline), as the plain
  micro-batches of 8, then packed into 8,192-token sequences (`train.pack_tokens`) with its logits in
  chunks of 512 positions (`train.logits_chunk_tokens`), with and without gradient checkpointing,
  then at micro-batch 4 with responses of about 4,096 tokens (a shape `plan`'s logits term was not
  fitted to), then Qwen3-0.6B and SmolLM2-135M: step time, tokens/s, MFU against both
  denominators, peak memory against `prompt-r1 plan`'s prediction;
- b: FSDP2 over NCCL on one rank (gpu_fsdp.py): torch's pieces, then the learner's own
  `ShardedRanks` (meta build, FSDP's mixed precision, GRPO steps beside a plain learner's, the
  weight sync's gather, a sharded checkpoint resumed);
- c: `prompt-r1 train -c configs/smoke.yaml --set train.device=cuda` through Ray (the learner a Ray
  actor on the GPU Ray counts), stopped after its step-1 checkpoint, then `--resume` to step 4; the
  warehouse shows each step sampled by the weights of the step before (sync by version; every sync's
  checksum is checked by the session, which stops the run on a mismatch);
- d: real SmolLM2 weights (`configs/learning-smollm.yaml`) at 16 questions x 8 samples a step, the
  transformers rollouts and the in-process environment generating on the learner's GPU
  (`agent.device: cuda`, `rollout.colocate`), learner on the GPU: seconds per step, the rollout's and
  the update's seconds (MLflow), the share of each, and the reward per step (warehouse);
- e: full-weight against LoRA sync at the Qwen3-1.7B shape (weight_sync.py): bytes and seconds,
  and building the full update per tensor against one pinned copy (`learner.host_copy`);
- f: the two-hop experiment at GPU scale (benchmarks/experiments/learning.py on
  `configs/learning-compositional-turn.yaml`, rollouts as in d, LoRA): the untrained probe, then
  the trained arm and the shuffled-reward control, 16 steps of 16 questions x 8 samples each, judged
  against the pre-registered `benchmarks/criteria/compositional-turn-gpu.json`; the trained
  adapter is kept (a few MiB) for `prompt-r1 evaluate --agent trained=FOLDER` on any machine.

`--run` names the three runs, each sized to about ten minutes on an H100 or H200:
`learner` (parts a, b, c, e), `two-hop` (d, then f's trained arm) and `two-hop-control` (f's control,
added to the same experiment). Each writes `RUN.json` (everything) and `RUN.log` (every part's output)
into `--out` (`scripts/gpu_check.sh` picks the folder), and prints a summary table; part f's experiment
lives in `--out`/two-hop across runs. `--dry-run` runs the parts on CPU at tiny shapes (CI's check
that nothing is missing or misnamed); its figures are not measurements.

    python3 -m benchmarks.gpu.gpu_check --run learner --out runs/gpu_check --tokenizer DIR   # scripts/gpu_check.sh runs it
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = "abcdef"
# the three runs: (parts, part f's arms); a run's caps sum to about ten minutes
RUNS = {"learner": ("abce", []), "two-hop": ("df", ["trained"]), "two-hop-control": ("f", ["control"])}
# Seconds each part may take on the GPU (a run's deadline is its parts' caps summed, unless --budget-s);
# the dry run's are larger because a shared 2-core CPU machine is slower than a GPU host.
CAPS = {"peak": 15, "a": 220, "b": 60, "c": 120, "d": 120, "e": 110, "f": 450}
DRY_CAPS = {"peak": 120, "a": 500, "b": 400, "c": 700, "d": 500, "e": 400, "f": 900}
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
DRY_A_ROWS = [("tiny", "tiny", []), ("tiny packed/64 logits/4", "tiny", ["--pack-tokens", "64", "--logits-chunk", "4"])]

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


class Runner:
    """Runs each part's commands under the part's deadline, logging their output to one file."""

    def __init__(self, log: Path, env: dict[str, str], budget_s: float, caps: dict[str, float]):
        self.log = log.open("a")
        self.env, self.caps = env, caps
        self.deadline = time.monotonic() + budget_s

    def start(self, part: str) -> None:
        """Part `part` begins: its commands share its cap (and the whole run's deadline)."""
        self.part_deadline = min(self.deadline, time.monotonic() + self.caps[part])

    def left(self, part: str) -> float:
        return max(0.0, self.part_deadline - time.monotonic())

    def run(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
            watch=None) -> subprocess.CompletedProcess:
        """`cmd` with its output in the log; past `timeout` its process group is killed (TimeoutError).
        `watch()`, polled every 0.2 s, may stop it early by returning True (then SIGINT)."""
        self.log.write(f"\n$ {' '.join(cmd)}\n")
        self.log.flush()
        with tempfile.TemporaryFile("w+") as output:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=output, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            end, stopped, killed = time.monotonic() + timeout, False, False
            while proc.poll() is None:
                if watch is not None and not stopped and watch():
                    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the CLI stops cleanly
                    stopped = True
                if time.monotonic() > end:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed = True
                    break
                time.sleep(0.2)
            output.seek(0)
            text = output.read()
        self.log.write(text)
        self.log.flush()
        if killed:
            raise TimeoutError(f"{' '.join(cmd[1:4])} ran past its {timeout:.0f} s; output tail: {text[-600:]}")
        return subprocess.CompletedProcess(cmd, proc.returncode, text, "")

    def checked(self, cmd: list[str], timeout: float, **kw) -> str:
        done = self.run(cmd, timeout, **kw)
        if done.returncode:
            raise RuntimeError(f"exit {done.returncode}: {done.stdout.strip()[-800:]}")
        return done.stdout


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


# Part c stops its run after step 1 of 4: the stop is a SIGINT sent by a watcher that polls for the
# checkpoint, so the steps after it are the watcher's slack: a tiny model's step takes about a second,
# and on a loaded 2-core machine the watcher can sleep through two of them.
C_STEPS, C_STOP_AFTER = 4, 1


def part_c(r: Runner, args) -> dict:
    home = args.scratch / "c-home"
    env = {**r.env, "PROMPT_R1_HOME": str(home)}
    sets = [f"train.device={args.device}", f"train.steps={C_STEPS}", "train.checkpoint_every=1", *dry_agent(args)]
    run_dir = home / "smoke" / "gpucheck"

    def at_stop_step() -> bool:  # the checkpoint folder appears whole (renamed in) when it is written
        return any(re.fullmatch(rf"step-0*{C_STOP_AFTER}", p.name) for p in (run_dir / "checkpoints").glob("step-*"))

    t0 = time.monotonic()
    first = r.run(train_cmd("configs/smoke.yaml", sets, "--run-id", "gpucheck"), r.left("c"), env=env, watch=at_stop_step)
    first_s = time.monotonic() - t0
    record = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    if record.get("finished_at"):
        raise RuntimeError(f"the run finished all {C_STEPS} steps before it could be stopped after step "
                           f"{C_STOP_AFTER}; no resume tested")
    if not at_stop_step():
        raise RuntimeError(f"the first run (exit {first.returncode}) left no step-{C_STOP_AFTER} checkpoint: "
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


def run_part(name: str, fn, results: dict, runner: Runner, *a) -> None:
    t0 = time.monotonic()
    runner.start(name)
    print(f"== part {name} ==", flush=True)
    try:
        results[name] = {"status": "ok", "result": fn(*a)}
    except Exception as err:
        results[name] = {"status": "timeout" if isinstance(err, TimeoutError) else "failed",
                         "error": f"{type(err).__name__}: {err}"}
    results[name]["seconds"] = round(time.monotonic() - t0, 1)
    print(f"   {results[name]['status']} in {results[name]['seconds']} s"
          + (f": {results[name]['error'][:300]}" if "error" in results[name] else ""), flush=True)


def summary(results: dict) -> str:
    lines = []
    peak = results.get("peak", {}).get("result")
    if peak:
        lines.append(f"card: {peak['card']} ({peak['gpu_memory_gib']:.0f} GiB), torch {peak['torch']} (CUDA "
                     f"{peak['cuda']}); bf16 matmul peak {peak['tflops']:.0f} TFLOP/s ({peak['n']}^3)")
    lines += ["", "| part | status | s | figures |", "| --- | --- | --- | --- |"]
    for name in ["peak", *results.get("parts", PARTS)]:
        p = results.get(name)
        if p is None:
            continue
        figures = p.get("error", "")[:200] if p["status"] != "ok" else describe(name, p["result"])
        lines.append(f"| {name} | {p['status']} | {p['seconds']} | {figures} |")
    return "\n".join(lines)


def describe(name: str, r: dict) -> str:
    if name == "peak":
        return f"{r['tflops']:.1f} TFLOP/s"
    if name == "a":
        out = []
        for shape, row in r.items():
            if "error" in row:
                out.append(f"{shape}: {row['error'][:80]}")
                continue
            plan = row.get("plan", {})
            spec = f" ({100 * row['mfu_spec']:.1f}% of spec)" if "mfu_spec" in row else ""
            out.append(f"{shape}: {row['step_s']:.2f} s/step, {row['tokens_per_s']:,.0f} tok/s, MFU "
                       f"{100 * row.get('mfu', 0):.1f}%{spec}, peak {row['peak_gib']:.1f} GiB vs plan "
                       + (f"{plan['tensors_gib']:.1f} (tensors; {plan['gib']:.1f} with runtime)" if "gib" in plan
                          else "n/a"))
        return "; ".join(out)
    if name == "b":
        own = r.get("project", {})
        own_text = (f"; the learner's ShardedRanks: mixed precision {own['mixed_precision']}, steps "
                    f"{', '.join(f'{s:.2f}' for s in own['step_s'])} s, grad norm vs one-GPU learner "
                    f"{100 * own['grad_norm_rel_diff']:.2f}% apart, sync gather {own['sync_build_s']:.2f} s, "
                    f"checkpoint resumed equal {own['resumed_equal']}, next step equal {own['next_step_equal']}"
                    if "step_s" in own else f"; the learner's ShardedRanks: {own.get('error', 'not run')[:150]}")
        return (f"{r['backend']}: steps {', '.join(f'{s:.2f}' for s in r['step_s'])} s, full state dict "
                f"{r['full_state_dict_gib']:.2f} GiB in {r['full_state_dict_s']:.2f} s, DCP save {r['dcp_save_s']:.2f} s "
                f"/ load {r['dcp_load_s']:.2f} s, reloaded equal {r['reloaded_equal']}{own_text}")
    if name == "c":
        return (f"stopped after step {C_STOP_AFTER} in {r['first_run_s']:.0f} s, resumed to step {C_STEPS} in "
                f"{r['resume_s']:.0f} s, "
                f"finished {r['finished']}, every step sampled by the previous update's weights "
                f"{r['sampled_by_previous_version']}")
    if name == "d":
        per = f"{r['step_s']:.1f} s/step ({r['steps_per_hour']:.0f}/h)" if r["step_s"] else "one step: no interval"
        if r.get("stage_s"):
            per += ", " + ", ".join(f"{k.removesuffix('_time_s')} {v:.1f} s" for k, v in r["stage_s"].items())
        if r.get("shares"):
            per += " (" + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["shares"].items()) + ")"
        return (f"{r['steps_recorded']} steps, {per}, reward per step "
                f"{', '.join(f'{x:.3f}' for x in r['reward_per_step'])}" + (" (cut short)" if r["cut_short"] else ""))
    if name == "e":
        full, lora = r["measured"]
        copy = r.get("host_copy")
        copy_text = (f"; building it per tensor {copy['per_tensor_s']:.2f} s vs one pinned copy "
                     f"{copy['flat_pinned_s']:.2f} s" if copy else "")
        return (f"full {full['bytes'] / 1e6:.0f} MB in {full['sync_s']:.2f} s (build {full['build_s']:.2f} s); "
                f"LoRA {lora['bytes'] / 1e6:.1f} MB in {lora['sync_s']:.2f} s{copy_text}")
    if name == "f":
        arms = "; ".join(f"{arm}: {v['probe_before']:.3f} -> " + (f"{v['probe_after']:.3f}" if v["probe_after"]
                                                                  is not None else "-")
                         + (f" in {v['train_s']:.0f} s" if v.get("train_s") else "") for arm, v in r["arms"].items())
        verdict = r.get("verdict") or {}
        return f"{arms}; passed: {verdict.get('passed', 'not judged')}"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for RUN.json and RUN.log (and part f's experiment)")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder for the random-weight shapes")
    p.add_argument("--run", choices=sorted(RUNS), help="one of the three runs: learner (a, b, c, e), two-hop "
                   "(d and f's trained arm), two-hop-control (f's control)")
    p.add_argument("--parts", help="which of a-f to run instead (results in gpu_check.json)")
    p.add_argument("--f-arms", nargs="+", default=None, metavar="ARM",
                   help="part f's arms with --parts (default: trained control)")
    p.add_argument("--budget-s", type=float, help="deadline of the whole run (default: the parts' caps summed)")
    p.add_argument("--cap", action="append", default=[], metavar="PART=S",
                   help="another deadline for one part, in seconds (e.g. d=280); repeatable")
    p.add_argument("--d-steps", type=int, default=2, help="part d's training steps")
    p.add_argument("--d-set", action="append", default=[], help="more `--set KEY=VALUE` for part d")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: checks the code, measures nothing")
    args = p.parse_args(argv)
    if args.run and (args.parts or args.f_arms):
        p.error("--run chooses the parts and part f's arms; give --parts (and --f-arms) instead of it, not with it")
    name = args.run or "gpu_check"
    parts, f_arms = RUNS[args.run] if args.run else (args.parts or PARTS, args.f_arms or ["trained", "control"])
    if set(parts) - set(PARTS):
        p.error(f"--parts {parts!r}: parts are letters of {PARTS}")
    args.f_arms = args.f_arms or f_arms
    caps = dict(DRY_CAPS if args.dry_run else CAPS)
    for item in args.cap:
        part, _, seconds = item.partition("=")
        if part not in caps or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--cap {item!r}: expected PART=SECONDS with PART one of {', '.join(caps)}")
        caps[part] = float(seconds)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA GPU and torch sees none; nothing was measured (--dry-run checks the "
              "code on CPU)", file=sys.stderr)
        return 2
    args.device = "cpu" if args.dry_run else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    args.out = args.out.resolve()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)}
    budget = args.budget_s or sum(caps[k] for k in ["peak", *parts])
    runner = Runner(args.out / f"{name}.log", env, budget, caps)
    results: dict = {"run": name, "parts": parts, "dry_run": args.dry_run,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    record = args.out / f"{name}.json"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        args.scratch = Path(scratch)
        run_part("peak", part_peak, results, runner, runner, args)
        peak = results["peak"].get("result")
        fns = {"a": lambda: part_a(runner, args, peak), "b": lambda: part_b(runner, args),
               "c": lambda: part_c(runner, args), "d": lambda: part_d(runner, args), "e": lambda: part_e(runner, args),
               "f": lambda: part_f(runner, args)}
        for part in parts:
            run_part(part, fns[part], results, runner)
            record.write_text(json.dumps(results, indent=1, default=str))
    table = summary(results)
    results["summary"] = table
    record.write_text(json.dumps(results, indent=1, default=str))
    print("\n" + table)
    return 0 if all(results[n]["status"] == "ok" for n in ["peak", *parts]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
