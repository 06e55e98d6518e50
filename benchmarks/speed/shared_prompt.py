"""What running a micro-batch's shared prompt once saves: one GRPO update of the two-hop run's
shape with the learner's `share_prefix` on (its default where it applies) against off.

A GRPO group's trajectories start with the same prompt: the agent's chat template and question,
about 380 tokens, against 240 tokens of response. The micro-batches hold one question's samples,
so the learner (`core.grpo.token_logprobs`) runs that prompt once per micro-batch and repeats its
keys and values over the rows, instead of once per row. Both settings run in one process on the
same batch (`update_passes.batch`: the real prompt, random response ids), alternating, so the
ratio holds whatever the machine.

    .venv/bin/python -m benchmarks.speed.shared_prompt
    .venv/bin/python -m benchmarks.speed.shared_prompt --repeats 3
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from benchmarks.speed.update_passes import batch, batch_args
from prompt_r1.config.experiment import load_config
from prompt_r1.learner.grpo_learner import GRPOLearner
from prompt_r1.models.resolver import resolve_agent

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    args = batch_args(__doc__.split("\n\n")[0], repeats=2)
    cfg = load_config(ROOT / args.config)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": "cpu"})})
    questions, group = cfg.rollout.batch_questions, cfg.rollout.group_size
    path = resolve_agent(cfg.agent.model, config_name=cfg.name)
    print(f"{cfg.agent.model}: {questions} questions x {group} samples, micro-batches of "
          f"{cfg.train.micro_batch_size}, {cfg.train.mini_batch_questions} question(s) per optimiser step, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for share in (False, True):
            learner = GRPOLearner(cfg, path)
            learner.share_prefix = share
            trajectories = batch(learner.tokenizer, questions, group, args.turn_tokens, args.reply_tokens)
            started = time.perf_counter()
            metrics = learner.step(trajectories)
            times[share].append(time.perf_counter() - started)
            print(f"  share_prefix={share}: {times[share][-1]:.1f} s (pg_loss {metrics['pg_loss']:+.5f})", flush=True)
            del learner
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    print("setting | update s (median) | x baseline")
    print(f"every row runs its prompt (baseline) | {plain:.1f} | 1.00")
    print(f"shared prompt once per micro-batch | {shared:.1f} | {shared / plain:.2f}")


if __name__ == "__main__":
    main()
