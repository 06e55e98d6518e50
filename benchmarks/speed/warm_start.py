"""What running the output layer on the targets alone saves in the follow-up warm start: one
supervised step's forward and backward with the model's own `labels=` loss (logits at every
position) against `warm_start.target_loss` (logits at the labelled positions only).

The warm start (`prompt_r1/models/warm_start.py`) comes first in `make demo` from an empty `runs/`:
32 steps of 4 (context, target) pairs from SmolLM2-135M-Instruct, about 430 context tokens and 32
target tokens each, so the vocabulary-wide logits of the context positions are computed and thrown
away. Both losses run in one process on the same batches, alternating, so the ratio holds whatever
the machine; the losses printed beside them agree to float rounding.

    .venv/bin/python -m benchmarks.speed.warm_start
    .venv/bin/python -m benchmarks.speed.warm_start --steps 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def _batch(pairs, pad_id: int):
    width = max(len(c) + len(t) for c, t in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels, attention = torch.full_like(ids, -100), torch.zeros_like(ids)
    for i, (context, target) in enumerate(pairs):
        seq = context + target
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(context) : len(seq)] = torch.tensor(target)
        attention[i, : len(seq)] = 1
    return ids, attention, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="batches timed per loss (the median is reported)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.models.bundled import SMOLLM2, resolve_model
    from prompt_r1.models.warm_start import _examples, target_loss

    base = resolve_model(SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    pairs = _examples(tokenizer, random.Random(0), copy_question=True, follow_up=True)
    rng = random.Random(1)
    batches = [_batch(rng.sample(pairs, k=4), tokenizer.eos_token_id) for _ in range(args.steps + 1)]
    losses = {"model": lambda ids, att, lab: model(input_ids=ids, attention_mask=att, labels=lab).loss,
              "targets": lambda ids, att, lab: target_loss(model, ids, att, lab)}
    print(f"{SMOLLM2}: batches of 4 warm-start pairs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    times: dict[str, list[float]] = {name: [] for name in losses}
    for i, (ids, attention, labels) in enumerate(batches):
        for name, loss_of in losses.items():
            started = time.perf_counter()
            loss = loss_of(ids, attention, labels)
            loss.backward()
            model.zero_grad()
            if i:  # the first batch warms the allocator and kernels up
                times[name].append(time.perf_counter() - started)
            print(f"  batch {i} ({ids.shape[1]} wide), {name} loss: {loss.item():.6f}", flush=True)
    plain, targets = statistics.median(times["model"]), statistics.median(times["targets"])
    print("loss | forward + backward s (median) | x baseline")
    print(f"the model's own (logits at every position; baseline) | {plain:.2f} | 1.00")
    print(f"target_loss (logits at the targets only) | {targets:.2f} | {targets / plain:.2f}")


if __name__ == "__main__":
    main()
