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
  actor on the GPU Ray counts), stopped after its step-1 checkpoint, then `--resume` to step 10; the
  warehouse shows each step sampled by the weights of the step before (sync by version; every sync's
  checksum is checked by the session, which stops the run on a mismatch);
- d: real SmolLM2 weights (`configs/learning-smollm.yaml`) at 16 questions x 8 samples a step, the
  transformers rollouts and the in-process environment generating on the learner's GPU
  (`agent.device: cuda`, `rollout.colocate`), learner on the GPU: seconds per step, the rollout's and
  the update's seconds (MLflow), the share of each, and the reward per step (warehouse);
- e: full-weight against LoRA sync at the Qwen3-1.7B shape (weight_sync.py): bytes and seconds,
  and building the full update per tensor against one pinned copy (`learner.sync_copy.host_copy`);
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
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu.runner import ROOT, Runner
from benchmarks.gpu.check_parts import C_STEPS, C_STOP_AFTER, part_a, part_b, part_c, part_d, part_e, part_f, part_peak

PARTS = "abcdef"
# the three runs: (parts, part f's arms); a run's caps sum to about ten minutes
RUNS = {"learner": ("abce", []), "two-hop": ("df", ["trained"]), "two-hop-control": ("f", ["control"])}
# Seconds each part may take on the GPU (a run's deadline is its parts' caps summed, unless --budget-s);
# the dry run's are larger because a shared 2-core CPU machine is slower than a GPU host.
CAPS = {"peak": 15, "a": 220, "b": 60, "c": 120, "d": 120, "e": 110, "f": 450}
DRY_CAPS = {"peak": 120, "a": 500, "b": 400, "c": 700, "d": 500, "e": 400, "f": 900}


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
