"""What `train.pack_tokens` and `train.logits_chunk_tokens` cost and save: one GRPO update on a batch
of very uneven multi-turn trajectories, with padded micro-batches (the baseline), with the logits
in chunks, packed, and both.

Why it exists: both settings are tested to give the padded, whole-logits update to float rounding
(tests/learner/test_batches.py, tests/core/test_grpo.py, tests/learner/test_grpo_learner.py), but were
never timed. Packing removes the padding of uneven trajectories from the decoder's work (at the
price of one longer sequence whose attention runs under a block-diagonal mask, and of running
each row's prompt itself: a padded micro-batch of one group runs its shared prompt once where
`share_prefix` applies, i.e. without gradient checkpointing); chunking never holds the
batch x response x vocabulary logits at once (at the price of a second output-layer pass in the
backward).

What it measures, in one process, on one batch (`gpu_learner.make_batch`: GRPO groups shaped like
multi-turn rollouts, random ids, the protocol's masks), every arm a fresh learner from the same
weights: the median of `--repeats` steps after one warm-up, its ratio to the baseline; the tokens
one forward pass processes, padding included (padded: rows x longest per micro-batch, a shared
prompt counted once; packed: the packed lengths) against the real tokens (the padding share) and
the positions that go through the output layer; memory: (a) the largest vocabulary-wide tensor
any op allocated in the warm-up step (logits, their log-softmax temporaries and gradients: what
chunking bounds; measured by a dispatch mode, not computed) and (b) on CUDA `max_memory_allocated`
over the timed steps, on CPU the peak RSS rise over one more, untimed step (glibc's free memory
handed back by malloc_trim, then VmHWM reset through /proc/self/clear_refs; Linux only). The CPU
figure is the whole step's resident memory, not the logits': it includes activations, attention
and AdamW's temporaries (about the weights' size, in every arm), and pages the allocator keeps
mapped are not counted again, so read it to about 100 MiB. It checks that every arm's first
step gives the baseline's pg_loss and grad_norm within float tolerance (the same computation)
and exits 1 if not.

    .venv/bin/python -m benchmarks.speed.learner_packing --json out.json
    .venv/bin/python -m benchmarks.speed.learner_packing --gradient-checkpointing --json out.json
    .venv/bin/python -m benchmarks.speed.learner_packing --device cuda --model DIR --json out.json
    .venv/bin/python -m benchmarks.speed.learner_packing --model tiny-protocol --quick   # seconds: a trial
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import statistics
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.gpu.gpu_learner import learner_config, make_batch, timed

MIB = 2**20
# pg_loss and grad_norm of the first step: the same computation summed in another order
REL_TOL, ABS_TOL = 1e-4, 1e-6


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a bundled model's name or a model folder")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="agent.dtype (default: float32 on CPU, "
                   "bfloat16 autocast on CUDA)")
    # the batch, in gpu_learner.make_batch's terms: very uneven lengths, the case packing is for
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=(24, 72), metavar=("MIN", "MAX"))
    p.add_argument("--agent-turn-tokens", type=int, nargs=2, default=(8, 40), metavar=("MIN", "MAX"))
    p.add_argument("--env-reply-tokens", type=int, nargs=2, default=(16, 64), metavar=("MIN", "MAX"))
    p.add_argument("--env-calls", type=int, nargs=2, default=(1, 3), metavar=("MIN", "MAX"))
    p.add_argument("--micro-batch", type=int, default=4, help="train.micro_batch_size of the padded arms")
    p.add_argument("--logits-chunk", type=int, default=64, help="train.logits_chunk_tokens of the chunked arms")
    p.add_argument("--pack-tokens", type=int, default=0,
                   help="train.pack_tokens of the packed arms (0: 3 x the longest trajectory)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="on: the GPU configs' setting, and no shared prompt in the padded arms")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per arm, after one warm-up")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    p.add_argument("--quick", action="store_true", help="a batch of a few short trajectories, 1 timed step")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.quick:  # sized for the tiny bundled models: the test's trial run
        args.questions, args.group, args.prompt_tokens = 3, 4, (8, 24)
        args.agent_turn_tokens, args.env_reply_tokens, args.logits_chunk, args.repeats = (3, 12), (3, 16), 8, 1
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.max_response_tokens = 10**6  # make_batch cuts nothing; the learner gets the longest response
    return args


class LargestVocabTensor(TorchDispatchMode):
    """The bytes of the largest tensor whose last dimension is the vocabulary that any op newly
    allocates (views and in-place results share an input's storage and are skipped: the output
    layer's weight is viewed as [.., hidden, vocab] by every matmul), weight-shaped ones aside
    (the tied output layer's gradient may be built as [hidden, vocab])."""

    def __init__(self, vocab: int, model):
        super().__init__()
        self.vocab, self.bytes = vocab, 0
        self.weight_shapes = {tuple(p.shape)[::-1] for p in model.parameters() if p.dim() == 2}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab
                    and tuple(t.shape) not in self.weight_shapes and t.untyped_storage().data_ptr() not in inputs):
                self.bytes = max(self.bytes, t.untyped_storage().nbytes())
        return out


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_peak_rise(fn) -> int | None:
    """How far the resident set's high-water mark rises above its level before `fn()`, freed heap
    memory first handed back (malloc_trim), so what the step touches shows however much an earlier
    arm or step left free; None where /proc/self/clear_refs or glibc are not there."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        before = _status_kib("VmRSS")
    except OSError:
        return None
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def layout(learner, batch: list) -> dict:
    """What one forward pass over the batch processes in this learner's micro-batches."""
    from prompt_r1.core.grpo import shared_prefix_length

    micro = [m for mini in learner.prepare(batch, None).mini_batches for m in mini]
    positions = real = tokens = logit_rows = 0
    for m in micro:
        rows, length = m.input_ids.shape
        positions += rows * length
        if m.packed:
            real += length
            tokens += length
            logit_rows += int(m.response.sum())
        else:
            real += int(m.attention_mask.sum())
            shared = (shared_prefix_length(m.input_ids, m.attention_mask, m.start - 1)
                      if learner.share_prefix and rows > 1 else 0)
            tokens += rows * length - (rows - 1) * shared  # the shared prompt runs once
            logit_rows += rows * (length - m.start)
    return {"micro_batches": len(micro), "positions": positions, "real_tokens": real, "tokens_per_pass": tokens,
            "padding_tokens": positions - real, "padding_share": (positions - real) / positions,
            "logit_positions": logit_rows}


def run_arm(args, model_path, batch: list, pack: int, chunk: int, vocab: int) -> dict:
    """A fresh learner (the model folder's weights) with these settings: one warm-up step (the
    first-step metrics, the largest vocabulary-wide tensor), then `args.repeats` timed steps."""
    from prompt_r1.learner.grpo_learner import GRPOLearner

    settings = argparse.Namespace(**{**vars(args), "pack_tokens": pack, "logits_chunk": chunk})
    learner = GRPOLearner(learner_config(settings, args.device), model_path, device=args.device)
    out = {"pack_tokens": pack, "logits_chunk_tokens": chunk, **layout(learner, batch)}
    watch = LargestVocabTensor(vocab, learner.model)
    with watch:  # Python on every op: the warm-up alone, never a timed step
        first = learner.step(batch)
    out.update(pg_loss=first["pg_loss"], grad_norm=first["grad_norm"], largest_vocab_tensor_bytes=watch.bytes)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = [timed(lambda: learner.step(batch))[0] for _ in range(args.repeats)]
    # CPU memory on one more, untimed step: handing memory back before it would cost the timed steps page faults
    rise = None if cuda else rss_peak_rise(lambda: learner.step(batch))
    out.update(step_s=statistics.median(times), step_times_s=times, peak_rss_rise_bytes=rise,
               peak_cuda_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else None)
    return out  # the learner goes with this frame: `main` collects it before the next arm


def equality(arms: dict) -> tuple[bool, list[str]]:
    """Every arm's first-step pg_loss and grad_norm against the baseline's."""
    base, ok, lines = next(iter(arms.values())), True, []
    for name, arm in list(arms.items())[1:]:
        for key in ("pg_loss", "grad_norm"):
            same = math.isclose(arm[key], base[key], rel_tol=REL_TOL, abs_tol=ABS_TOL)
            ok &= same
            lines.append(f"  {name}: {key} {arm[key]:.8g} vs {base[key]:.8g} (diff {abs(arm[key] - base[key]):.2g}) "
                         f"{'ok' if same else 'DIFFERS'}")
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"--device cuda: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils.logging import disable_progress_bar

    from prompt_r1.models.bundled import resolve_model

    disable_progress_bar()  # one "Loading weights" bar per arm
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = resolve_model(args.model)
    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    batch = make_batch(AutoTokenizer.from_pretrained(model_path), args)
    lengths = [len(t.prompt_ids) + len(t.token_ids) for t in batch]
    args.max_response_tokens = max(len(t.token_ids) for t in batch)
    budget = args.pack_tokens or 3 * max(lengths)
    where = (torch.cuda.get_device_name(0) if args.device == "cuda"
             else f"CPU, {torch.get_num_threads()} threads")
    head = (f"{args.model}: {len(batch)} trajectories ({args.questions} questions x {args.group}) of {min(lengths)}-"
            f"{max(lengths)} tokens, {sum(lengths)} in all; {args.dtype}, micro-batch {args.micro_batch}, gradient "
            f"checkpointing {'on' if args.gradient_checkpointing else 'off'}; torch {torch.__version__}, {where}")
    print(head, flush=True)
    plan = [("padded (baseline)", 0, 0), (f"logits in chunks of {args.logits_chunk}", 0, args.logits_chunk),
            (f"packed into {budget}", budget, 0), ("packed + chunks", budget, args.logits_chunk)]
    arms: dict[str, dict] = {}
    for name, pack, chunk in plan:
        arms[name] = run_arm(args, model_path, batch, pack, chunk, vocab)
        gc.collect()  # the last arm's learner (its weights, AdamW state) before the next is built
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {arms[name]['step_s']:.3f} s/step {arms[name]['step_times_s']}", flush=True)
    base_s = arms[plan[0][0]]["step_s"]
    memory = "peak CUDA MiB" if args.device == "cuda" else "peak RSS rise MiB"
    print(f"arm | s/step | x baseline | tokens/pass incl. padding | padding share | logit positions | "
          f"largest vocab tensor MiB | {memory}")
    for name, arm in arms.items():
        arm["ratio"] = arm["step_s"] / base_s
        mem = arm["peak_cuda_allocated_bytes"] if args.device == "cuda" else arm["peak_rss_rise_bytes"]
        largest = arm["largest_vocab_tensor_bytes"] / MIB
        print(f"{name} | {arm['step_s']:.3f} | {arm['ratio']:.2f} | {arm['tokens_per_pass']} | "
              f"{arm['padding_share']:.1%} | {arm['logit_positions']} | {largest:.1f} | "
              f"{'n/a' if mem is None else f'{mem / MIB:.0f}'}")
    ok, lines = equality(arms)
    print(f"first step, pg_loss and grad_norm against the baseline (rel {REL_TOL:g}, abs {ABS_TOL:g}): "
          f"{'all equal' if ok else 'FAILED'}")
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"setup": head, "model": args.model, "device": args.device,
                                         "torch": torch.__version__, "threads": torch.get_num_threads(),
                                         "trajectories": len(batch), "real_tokens": sum(lengths),
                                         "pack_tokens": budget, "logits_chunk_tokens": args.logits_chunk,
                                         "repeats": args.repeats, "equal_first_step": ok, "arms": arms}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
