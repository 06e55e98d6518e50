"""Weight sync: bytes and seconds of a full-weight sync against a LoRA adapter sync, through the real pool.

Why it exists: after every GRPO update the learner syncs the rollout engines
(`TrainingSession.broadcast`: `weights_for_sync` -> `RolloutPool.broadcast`, verified by version
and checksum on every engine). Under full fine-tuning that is every weight in `agent.dtype`; under
`agent.lora.enabled` only the adapter. This measures both for the demo agent
(`smollm2-135m-protocol`, float32 as `configs/demo-single-hop.yaml` runs it) with a LoRA adapter of rank
`--r` on `--targets`, through a real `RolloutPool` of one transformers actor:
- bytes sent (the tensors of the `WeightUpdate`);
- `build s`: the learner making the update (merging or extracting, the copy to CPU, the checksum);
- `checksum s`: the checksum alone, on the same tensors;
- `sync s`: `RolloutPool.broadcast` (one `ray.put`, the actor loading it and reading its checksum
  back, the driver's check of the answer), the median of `--repeats`;
then, for the full weights, the parts of one sync before and after issue 31 (item 9) on the same
weights, each the median of `--repeats`:
- `checksum`: BLAKE2b over every byte (before; each end did one) vs over a sample of each large
  tensor (`core.weights`, now);
- `bytes`: the tied output head sent as its own tensor (before) vs once (now);
- `driver`: a learner rank's update fetched into the driver and put back (`ray.get` + `ray.put`,
  before) vs its reference handed on (now: nothing to time);
- `broadcast`: `RolloutPool.broadcast` of each (the actor's load and read-back);
the full update's tensors built the old way (per tensor `.to("cpu", agent.dtype)`: pageable memory,
and a blocking copy from a GPU casts on the CPU) against `host_copy` (cast on the weights' device,
one flat host buffer, pinned on a GPU: issue 49), on the same weights, the first call of each and
the median of `--repeats` after it (the first pays for the allocation the next ones reuse);
and the same full sync with the tensors pickled by torch (`TorchPickledUpdate`: in band, through a
byte string, as before `WeightUpdate` sent their bytes out of band), the baseline run in the same
process; and projects the bytes to the paper's 4B agent (`Qwen/Qwen3-4B` from `architectures.json`:
full weights in bfloat16, the adapter in float32) and its seconds at the throughput measured here
(bytes / sync s of the demo agent: a CPU machine's figure, not a GPU cluster's).

    .venv/bin/python -m benchmarks.speed.weight_sync
    .venv/bin/python -m benchmarks.speed.weight_sync --model tiny --repeats 1   # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-protocol", help="agent.model (bundled name or folder)")
    p.add_argument("--r", type=int, default=16, help="agent.lora.r")
    p.add_argument("--targets", default="all-linear", help="agent.lora.target_modules: all-linear or comma-separated")
    p.add_argument("--device", default="cpu", help="train.device of the learner (cuda on a GPU machine)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="agent.dtype: the dtype full weights are sent in")
    p.add_argument("--repeats", type=int, default=3, help="timed syncs of each kind (median reported)")
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    p.add_argument("--no-before-after", action="store_true",
                   help="skip the old-vs-new comparison (three more full syncs and full checksums: minutes at 1.7B)")
    return p.parse_args(argv)


def progress(what: str) -> None:
    """A line per stage, so a run cut by its deadline says where it was."""
    print(f"[weight_sync {time.strftime('%H:%M:%S')}] {what}", flush=True)


def config(args: argparse.Namespace, lora: bool):
    from prompt_r1.config.experiment import parse_config

    targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
    return parse_config({
        "agent": {"model": args.model, "dtype": args.dtype,
                  "lora": {"enabled": lora, "r": args.r, "alpha": 2 * args.r, "target_modules": targets}},
        "train": {"device": args.device, "kl_coef": 0.0},
        "environment": {"kind": "inprocess", "model": "tiny"},
        "rollout": {"num_workers": 1, "ray_num_cpus": 2},
    })


def torch_pickled_class():
    """A `WeightUpdate` that pickles its tensors as torch does (the baseline of the out-of-band path)."""
    from prompt_r1.core.weights import WeightUpdate

    class TorchPickledUpdate(WeightUpdate):
        def __reduce__(self):
            return TorchPickledUpdate, (self.version, self.kind, self.tensors, self.checksum, self.adapter_config)

    return TorchPickledUpdate


def measure(learner, pool, version: int, repeats: int) -> dict[str, float]:
    from prompt_r1.core.weights import weights_checksum

    start = time.perf_counter()
    update = learner.weights_for_sync(version)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    weights_checksum(update.tensors)
    checksum_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pool.broadcast(update)
        times.append(time.perf_counter() - start)
    row = {"kind": update.kind, "tensors": len(update.tensors), "bytes": update.nbytes, "build_s": build_s,
           "checksum_s": checksum_s, "sync_s": statistics.median(times)}
    if update.kind == "full":
        # each tensor in its own storage: torch pickles a view with its whole storage, and the
        # update's tensors are views of one buffer (`host_copy`)
        own = {k: v.clone() for k, v in update.tensors.items()}
        baseline = torch_pickled_class()(update.version, update.kind, own, update.checksum)
        row["torch_pickled_sync_s"] = median_s(lambda: pool.broadcast(baseline), repeats)
    return row


def full_blake2b(tensors) -> str:
    """The checksum before issue 31: BLAKE2b over every byte of every tensor (for the comparison)."""
    import hashlib

    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_copy_comparison(learner, repeats: int) -> dict:
    """Seconds to build the full update's tensors (tied weights left out, as the sync does): per
    tensor `.to("cpu", dtype)` against `host_copy`, each timed once cold, then the median of `repeats`."""
    import torch

    from prompt_r1.core.tokens import torch_dtype
    from prompt_r1.learner.collectives import tied_aliases
    from prompt_r1.learner.sync_copy import host_copy

    tied = tied_aliases(learner.model)
    weights = {k: v for k, v in learner.model.state_dict().items() if k not in tied}
    dtype = torch_dtype(learner.cfg.agent.dtype)
    device = next(iter(weights.values())).device

    def timed(build):
        def call():
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # nothing queued before it counts
            build()
        first = median_s(call, 1)
        return first, median_s(call, repeats)

    old_first, old = timed(lambda: {k: v.detach().to("cpu", dtype, copy=True) for k, v in weights.items()})
    new_first, new = timed(lambda: host_copy(weights, dtype))
    return {"per_tensor_s": old, "flat_pinned_s": new, "ratio": old / new if new > 0 else float("inf"),
            "per_tensor_first_s": old_first, "flat_pinned_first_s": new_first, "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "bytes": sum(v.numel() for v in weights.values()) * dtype.itemsize}


def before_after(learner, pool, repeats: int) -> dict:
    """One full-weight sync's parts, the old path against the new (see the module docstring)."""
    import ray

    from prompt_r1.core.weights import WeightUpdate, weights_checksum
    from prompt_r1.core.weights import UpdateRef

    old = WeightUpdate.make(10, "full", learner.merged_state_dict())  # tied head included, as before
    new = learner.weights_for_sync(11)
    old_ref, new_ref = ray.put(old), ray.put(new)  # as a learner rank leaves them in the object store
    out = {
        "old": {"bytes": old.nbytes, "checksum_s": median_s(lambda: full_blake2b(old.tensors), repeats),
                "driver_s": median_s(lambda: ray.put(ray.get(old_ref)), repeats),
                "broadcast_s": median_s(lambda: pool.broadcast(old), repeats)},
        "new": {"bytes": new.nbytes, "checksum_s": median_s(lambda: weights_checksum(new.tensors), repeats),
                "driver_s": 0.0,
                "broadcast_s": median_s(lambda: pool.broadcast(UpdateRef(new.header, new_ref)), repeats)},
    }
    for row in out.values():  # the checksum counted at both ends, as each end computes it
        row["total_s"] = 2 * row["checksum_s"] + row["driver_s"] + row["broadcast_s"]
    return out


def projection(args: argparse.Namespace, full_bytes_per_s: float, adapter_bytes_per_s: float) -> list[dict]:
    """The 4B agent's sync: bytes from its parameter counts, seconds at this machine's throughput."""
    from prompt_r1.models.architecture import known_architecture

    arch = known_architecture("Qwen/Qwen3-4B")
    assert arch is not None
    targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
    full, adapter = 2 * arch.params, 4 * arch.lora_params(args.r, targets)  # bf16 weights, float32 adapter
    return [{"kind": "full", "bytes": full, "sync_s": full / full_bytes_per_s},
            {"kind": "adapter", "bytes": adapter, "sync_s": adapter / adapter_bytes_per_s}]


def run(args: argparse.Namespace) -> dict:
    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool
    from prompt_r1.learner.grpo_learner import GRPOLearner

    path = resolve_agent(args.model)
    init_ray(config(args, False).rollout)
    rows = []
    # one actor for both: it takes full weights, then wraps its model in PEFT at the first adapter
    progress("starting the rollout actor")
    with RolloutPool(config(args, False), path, 1) as pool:
        progress("building the full-weight learner")
        learner = GRPOLearner(config(args, False), path)
        progress(f"building the full update, per tensor and host_copy, x {args.repeats}")
        host = host_copy_comparison(learner, args.repeats)
        progress(f"full-weight sync x {args.repeats}")
        rows.append(measure(learner, pool, 1, args.repeats))
        paths = None
        if not args.no_before_after:
            progress("full-weight sync, before and after issue 31")
            paths = before_after(learner, pool, args.repeats)
        del learner
        progress("building the LoRA learner")
        learner = GRPOLearner(config(args, True), path)
        progress(f"adapter sync x {args.repeats}")
        rows.append(measure(learner, pool, 2, args.repeats))
    full, adapter = rows
    projected = projection(args, full["bytes"] / full["sync_s"], adapter["bytes"] / adapter["sync_s"])
    return {"model": args.model, "r": args.r, "targets": args.targets, "measured": rows,
            "projected_qwen3_4b": projected, "before_after": paths, "host_copy": host}


def report(out: dict) -> str:
    lines = [f"{out['model']}, LoRA r={out['r']} on {out['targets']}, 1 transformers actor:", "",
             "| sync | tensors | MB sent | build s | checksum s | sync s |", "|---|---|---|---|---|---|"]
    for r in out["measured"]:
        lines.append(f"| {r['kind']} | {r['tensors']} | {r['bytes'] / 1e6:.2f} | {r['build_s']:.3f} "
                     f"| {r['checksum_s']:.3f} | {r['sync_s']:.3f} |")
    full, adapter = out["measured"]
    lines += ["", f"adapter / full: {adapter['bytes'] / full['bytes']:.4f} of the bytes, "
              f"{adapter['sync_s'] / full['sync_s']:.3f} of the sync time", ""]
    if "torch_pickled_sync_s" in full:
        lines += [f"full sync with the tensors pickled by torch (the baseline): {full['torch_pickled_sync_s']:.3f} s; "
                  f"out of band (now) / baseline: {full['sync_s'] / full['torch_pickled_sync_s']:.3f}", ""]
    host = out["host_copy"]
    lines += [f"building the full update ({host['bytes'] / 1e6:.2f} MB, {host['dtype']}, weights on {host['device']}): "
              f"per tensor {host['per_tensor_s']:.3f} s (first {host['per_tensor_first_s']:.3f}), host_copy "
              f"{host['flat_pinned_s']:.3f} s (first {host['flat_pinned_first_s']:.3f}); "
              f"per tensor / host_copy: {host['ratio']:.2f}", ""]
    lines += ["Projected for Qwen/Qwen3-4B (full in bfloat16, adapter in float32, at the throughput above):", "",
              "| sync | MB sent | sync s |", "|---|---|---|"]
    for r in out["projected_qwen3_4b"]:
        lines.append(f"| {r['kind']} | {r['bytes'] / 1e6:.1f} | {r['sync_s']:.2f} |")
    paths = out["before_after"]
    if paths is None:
        return "\n".join(lines)
    lines += ["", "Full-weight sync, before and after issue 31 (checksum counted at both ends):", "",
              "| path | MB sent | checksum s (one end) | driver get+put s | broadcast s | total s |",
              "|---|---|---|---|---|---|"]
    for name, r in paths.items():
        lines.append(f"| {name} | {r['bytes'] / 1e6:.2f} | {r['checksum_s']:.4f} | {r['driver_s']:.3f} "
                     f"| {r['broadcast_s']:.3f} | {r['total_s']:.3f} |")
    lines += ["", f"new / old: {paths['new']['total_s'] / paths['old']['total_s']:.3f} of the time, "
              f"{paths['new']['bytes'] / paths['old']['bytes']:.3f} of the bytes"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    out = run(args)
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
