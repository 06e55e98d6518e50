"""Tokens/s of one GRPO update: our GRPOLearner vs TRL's GRPO loss path vs a naive baseline.

Same batch, same process, same model weights. Each contender does the full update work:
reference log-probs (no grad), policy forward + loss + backward, grad clipping, AdamW step.
- ours: `GRPOLearner.step` (logits only for response positions, logsumexp gather, old
  log-probs taken from the first forward since the batch is one mini-batch);
- trl: a `GRPOTrainer` built on the same model, its `_get_per_token_logps_and_entropies` for the
  reference and `compute_loss` (loss_type "bnpo" = token-mean, beta 0.001) for the policy;
- naive: full-sequence logits, full log_softmax, one batch.

    .venv/bin/python -m benchmarks.speed.grpo_step --models tiny smollm2-135m-instruct --repeats 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


from prompt_r1.config.experiment import parse_config
from prompt_r1.models.bundled import resolve_model
from prompt_r1.core.reward import RewardBreakdown
from prompt_r1.learner.grpo_learner import GRPOLearner
from prompt_r1.core.trajectory import Trajectory


def make_batch(vocab: int, n: int, prompt_len: int, resp_len: int, group: int) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(n):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()
        tokens = torch.randint(10, vocab, (resp_len,), generator=gen).tolist()
        reward = float(i % 3)
        trajs.append(Trajectory(question_id=f"q{i // group}", group_index=i % group,
                                prompt_ids=prompt if i % group == 0 else trajs[-1].prompt_ids,
                                token_ids=tokens, loss_mask=[1] * resp_len, logprobs=[-3.0] * resp_len,
                                reward=RewardBreakdown(1.0, reward, reward)))
    return trajs


def config(n: int, resp_len: int):
    return parse_config({"agent": {"model": "tiny", "max_response_tokens": resp_len},
                         "train": {"lr": 1e-6, "micro_batch_size": n, "mini_batch_questions": 64}})


DEVICE = "cpu"


def _sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def time_ours(model_path, trajs, repeats: int) -> list[float]:
    learner = GRPOLearner(config(len(trajs), len(trajs[0].token_ids)), model_path, device=DEVICE)
    learner.step(trajs)  # warm-up
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        learner.step(trajs)
        _sync()
        times.append(time.perf_counter() - start)
    return times


def _tensors(trajs):
    from prompt_r1.core.grpo import group_advantages

    prompt = torch.tensor([t.prompt_ids for t in trajs])
    completion = torch.tensor([t.token_ids for t in trajs])
    rewards = torch.tensor([t.reward.total for t in trajs])
    groups = torch.tensor([int(t.question_id[1:]) for t in trajs])
    return prompt, completion, group_advantages(rewards, groups)


def time_trl(model_path, trajs, repeats: int) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    n, resp_len = len(trajs), len(trajs[0].token_ids)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=n, num_generations=4,
                      max_completion_length=resp_len, loss_type="bnpo", beta=0.001, learning_rate=1e-6,
                      report_to=[], use_cpu=True, logging_steps=1000, save_strategy="no")
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["hi"] * n}),
                          processing_class=tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    trainer.current_gradient_accumulation_steps = 1  # normally set inside Trainer's training loop
    prompt, completion, advantages = _tensors(trajs)
    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
              "completion_mask": torch.ones_like(completion), "advantages": advantages}
    ids = torch.cat([prompt, completion], 1)

    def one_step() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, torch.ones_like(ids),
                                                                    resp_len)
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, {**inputs, "ref_per_token_logps": ref})
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        return time.perf_counter() - start

    one_step()
    return [one_step() for _ in range(repeats)]


def time_naive(model_path, trajs, repeats: int) -> list[float]:
    import copy

    from transformers import AutoModelForCausalLM

    from prompt_r1.core.grpo import policy_loss

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(DEVICE)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    prompt, completion, advantages = _tensors(trajs)
    ids = torch.cat([prompt, completion], 1).to(DEVICE)
    advantages = advantages.to(DEVICE)
    p = prompt.shape[1]

    def logps(m):
        full = torch.log_softmax(m(input_ids=ids).logits.float(), -1)[:, :-1]
        return full.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)[:, p - 1:]

    def one_step() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            ref, old = logps(reference), logps(model)
        loss, _ = policy_loss(logps(model), old, ref, advantages, torch.ones_like(old))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        _sync()
        return time.perf_counter() - start

    one_step()
    return [one_step() for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m-instruct"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (TRL is timed on CPU only).")
    parser.add_argument("--contenders", nargs="+", default=["ours", "trl", "naive"])
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"torch {torch.__version__}, device {DEVICE}, threads {torch.get_num_threads()}, batch {args.batch} x "
          f"({args.prompt_len} prompt + {args.response_len} response) tokens")
    for name in args.models:
        model_path = resolve_model(name)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_path).vocab_size
        trajs = make_batch(vocab, args.batch, args.prompt_len, args.response_len, group=4)
        tokens = args.batch * (args.prompt_len + args.response_len)
        results = {}
        contenders = {"ours": time_ours, "trl": time_trl, "naive": time_naive}
        for label, fn in ((c, contenders[c]) for c in args.contenders):
            try:
                results[label] = statistics.median(fn(model_path, trajs, args.repeats))
            except Exception as err:  # report and go on: TRL APIs move between versions
                print(f"{name} {label}: failed: {type(err).__name__}: {err}")
        for label, seconds in results.items():
            ratio = results["ours"] / seconds if "ours" in results else float("nan")
            print(f"{name:24s} {label:6s} {seconds:8.3f} s/step {tokens / seconds:9.0f} tok/s "
                  f"ours/this speed: {1 / ratio if ratio else float('nan'):.2f}x")


if __name__ == "__main__":
    main()
