"""FSDP2 on one GPU over NCCL: torch's pieces, then the learner's own sharded rank.

Why it exists: CI has no GPU, so the learner's `train.strategy: fsdp` code runs on CUDA first on a
user's machine unless this runs it. In one process over NCCL (world size 1) it checks, in order:

1. torch's pieces underneath, through torch's public API alone: `fully_shard` per decoder layer and
   the root with a `MixedPrecisionPolicy` (bfloat16 parameters, float32 gradient reduction), AdamW
   steps with `clip_grad_norm_` over the DTensor gradients, the full state dict gathered to CPU, and
   a `torch.distributed.checkpoint` checkpoint written and read back into a fresh sharded model;
2. the project's code (`project`): a `GRPOLearner` holding `ShardedRanks` (`learner.collectives`)
   as a rank of a one-rank group: built on the meta device and filled from rank 0
   (`broadcast_from_rank0`), FSDP's mixed-precision branch (no autocast), GRPO steps on a batch
   shaped like multi-turn rollouts, its loss and gradient norm beside a plain one-GPU learner's on
   the same batch (bfloat16 weights under FSDP against autocast: close, not equal), the weight
   sync's full state gathered, and a checkpoint written by `save_checkpoint` (the optimiser
   state sharded by DCP) and resumed by `load_checkpoint` into a fresh sharded learner, whose
   weights and next step must match.

`--device cpu` (gloo) is the dry run.

    python3 -m benchmarks.gpu.gpu_fsdp --model FOLDER --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sharded_model(model_dir: str, device: torch.device, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def run(model_dir: str, device_name: str, steps: int, tokens: int) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    cuda = device_name == "cuda"
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out: dict = {"backend": backend, "device": str(device)}
    start = time.perf_counter()
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        mesh = init_device_mesh(device.type, (1,))
        model = sharded_model(model_dir, device, mesh)
        out["build_s"] = time.perf_counter() - start
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        torch.manual_seed(0)
        ids = torch.randint(100, model.config.vocab_size - 1, (2, tokens), device=device)
        norms, times = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensor norm over the mesh
            norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
            opt.step()
            opt.zero_grad()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out.update(steps=steps, step_s=times, grad_norms=norms, loss=float(loss.detach()))
        t0 = time.perf_counter()
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        out["full_state_dict_s"] = time.perf_counter() - t0
        out["full_state_dict_gib"] = sum(t.numel() * t.element_size() for t in full.values()) / 2**30
        out["full_state_dict_dtypes"] = sorted({str(t.dtype) for t in full.values()})
        with tempfile.TemporaryDirectory() as tmp:
            model_sd, optim_sd = get_state_dict(model, opt)
            t0 = time.perf_counter()
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
            out["dcp_save_s"] = time.perf_counter() - t0
            out["dcp_bytes"] = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
            fresh = sharded_model(model_dir, device, mesh)
            fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-4)
            fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)
            state = {"model": fresh_model_sd, "optim": fresh_optim_sd}
            t0 = time.perf_counter()
            dcp.load(state, checkpoint_id=tmp)
            set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            out["dcp_load_s"] = time.perf_counter() - t0
        reread = get_model_state_dict(fresh, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        out["reloaded_equal"] = full.keys() == reread.keys() and all(torch.equal(full[k], reread[k]) for k in full)
        out["finite"] = all(map(lambda x: x == x and abs(x) != float("inf"), norms + [out["loss"]]))
        if cuda:
            out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        del model, fresh, opt, fresh_opt, full, reread, state
        try:  # torch's pieces are recorded even if the project's code fails
            out["project"] = project(model_dir, device, tokens)
        except Exception as err:
            out["project"] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    finally:
        dist.destroy_process_group()
    out["ok"] = bool(out.get("reloaded_equal") and out.get("finite") and out["project"].get("ok"))
    return out


def project(model_dir: str, device: torch.device, tokens: int) -> dict:
    """The learner's own FSDP code as one rank over the process group `run` made (see the docstring)."""
    from benchmarks.gpu.gpu_learner import learner_config, make_batch, parse_args
    from prompt_r1.learner.checkpoint import load_checkpoint, save_checkpoint
    from prompt_r1.learner.collectives import ShardedRanks
    from prompt_r1.learner.grpo_learner import GRPOLearner

    cuda = device.type == "cuda"
    turn = str(max(4, tokens // 8))
    args = parse_args(["--model", model_dir, "--device", device.type, "--questions", "2", "--group", "4",
                       "--prompt-tokens", turn, turn, "--agent-turn-tokens", turn, turn, "--env-reply-tokens",
                       turn, turn, "--env-calls", "1", "2", "--micro-batch", "4", "--lr", "1e-5"])
    cfg = learner_config(args, device.type)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"strategy": "fsdp"})})
    out: dict = {}

    def sharded() -> GRPOLearner:
        return GRPOLearner(cfg, model_dir, device=str(device), ranks=ShardedRanks(0, 1, device))

    t0 = time.perf_counter()
    learner = sharded()
    out["build_s"] = time.perf_counter() - t0
    out["mixed_precision"] = str(learner.mixed_precision)  # bfloat16 on a GPU: FSDP's policy, not autocast
    batch = make_batch(learner.tokenizer, args)
    plain = GRPOLearner(cfg, model_dir, device=str(device))  # the one-GPU learner (identity Ranks)
    first_plain = plain.step(batch)
    del plain
    if cuda:
        torch.cuda.empty_cache()
    times, metrics = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        metrics.append(learner.step(batch))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out["step_s"] = times
    out["first_step"] = {k: metrics[0][k] for k in ("pg_loss", "grad_norm")}
    out["first_step_plain"] = {k: first_plain[k] for k in ("pg_loss", "grad_norm")}
    out["grad_norm_rel_diff"] = abs(metrics[0]["grad_norm"] - first_plain["grad_norm"]) / max(first_plain["grad_norm"], 1e-12)
    t0 = time.perf_counter()
    update = learner.weights_for_sync(2)
    out["sync_build_s"] = time.perf_counter() - t0
    out["sync_gib"] = update.nbytes / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = save_checkpoint(learner, Path(tmp), 2, {"epoch": 0, "index": 0}, cfg)
        out["checkpoint_save_s"] = time.perf_counter() - t0
        # cloned: on CPU the gathered tensors can be the model's own, which the next step changes
        saved = {k: v.clone() for k, v in learner.ranks.full_state_dict(learner.model).items()}
        after = learner.step(batch)
        fresh = sharded()
        t0 = time.perf_counter()
        step, _ = load_checkpoint(fresh, folder)
        out["checkpoint_load_s"] = time.perf_counter() - t0
        reread = fresh.ranks.full_state_dict(fresh.model)
        out["resumed_step"] = step
        out["resumed_equal"] = saved.keys() == reread.keys() and all(torch.equal(saved[k], reread[k]) for k in saved)
        again = fresh.step(batch)
        out["next_step"] = [{k: m[k] for k in ("pg_loss", "grad_norm")} for m in (after, again)]
        out["next_step_equal"] = all(abs(after[k] - again[k]) <= 1e-5 * max(1.0, abs(after[k]))
                                     for k in ("pg_loss", "grad_norm"))
    finite = all(m[k] == m[k] and abs(m[k]) != float("inf") for m in [*metrics, after] for k in ("pg_loss", "grad_norm"))
    out["ok"] = bool(finite and out["resumed_equal"] and out["next_step_equal"] and step == 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a local HF model folder (a Llama- or Qwen3-like decoder)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=512, help="sequence length of the 2 sequences of each step")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_fsdp.py --device cuda: torch sees no CUDA GPU; --device cpu is the dry run", file=sys.stderr)
        return 2
    out = run(args.model, args.device, args.steps, args.tokens)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
