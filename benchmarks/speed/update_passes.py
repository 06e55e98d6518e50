"""What more optimiser steps per rollout batch cost: one GRPO update of the two-hop run's shape
with 1, 2 or 4 mini-batches, and with 2 passes (`ppo_epochs`), against one mini-batch and one pass.

The two-hop run (`configs/learning-compositional.yaml`: 4 questions x 8 samples, up to three agent
turns) spent about 130 s a step generating and 50 s updating on this 2-core machine, and made one
optimiser step per batch, so its clip never acted (clip_fraction 0.0). Splitting the batch into
mini-batches gives more optimiser steps from the same trajectories for little more compute (each
token still takes one forward and one backward; the later mini-batches' old log-probs take one
more forward without gradients); a second pass (`ppo_epochs` 2) doubles the backward work. This
script measures both in one process on the same batch, so the ratios hold whatever the machine.

The batch is the run's shape: the agent's real prompt for a two-hop question (its chat template)
and a response of three agent turns with two inserted replies (mask 0) between them; token ids are
drawn at random (a speed measurement: the update's cost does not depend on which tokens they are).

    .venv/bin/python -m benchmarks.speed.update_passes                       # the two-hop run's settings
    .venv/bin/python -m benchmarks.speed.update_passes --repeats 2 --config configs/learning-compositional.yaml
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from prompt_r1.config.experiment import load_config
from prompt_r1.core.reward import RewardBreakdown
from prompt_r1.core.tokens import agent_prompt_ids
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.models.resolver import resolve_agent
from prompt_r1.learner.grpo_learner import GRPOLearner

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "On which continent is the country whose capital is Stockholm?"


def batch(tokenizer, questions: int, group: int, turn_tokens: int, reply_tokens: int) -> list[Trajectory]:
    """`questions` x `group` trajectories: three agent turns of `turn_tokens`, two replies of `reply_tokens`."""
    gen = torch.Generator().manual_seed(0)
    prompt = agent_prompt_ids(tokenizer, QUESTION, None)
    mask = [1] * turn_tokens + [0] * reply_tokens + [1] * turn_tokens + [0] * reply_tokens + [1] * turn_tokens
    out = []
    for q in range(questions):
        for g in range(group):
            ids = torch.randint(100, len(tokenizer) - 1, (len(mask),), generator=gen).tolist()
            total = float((q + g) % 3) - 1.0   # unequal rewards: every group is informative
            out.append(Trajectory(f"q{q}", g, list(prompt), token_ids=ids, loss_mask=list(mask),
                                  logprobs=[-2.0 if m else 0.0 for m in mask], agent_turns=["a", "b", "c"],
                                  reward=RewardBreakdown(1.0, total + 1.0, total)))
    return out


def batch_args(description: str, repeats: int) -> argparse.Namespace:
    """The command line of a benchmark on `batch`: the run's config, the response's shape, repeats."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="configs/learning-compositional.yaml")
    parser.add_argument("--turn-tokens", type=int, default=48, help="Tokens of each agent turn.")
    parser.add_argument("--reply-tokens", type=int, default=72, help="Tokens of each inserted reply (with its tags).")
    parser.add_argument("--repeats", type=int, default=repeats)
    return parser.parse_args()


def main() -> None:
    args = batch_args(__doc__.split("\n\n")[0], repeats=1)
    cfg = load_config(ROOT / args.config)
    questions, group = cfg.rollout.batch_questions, cfg.rollout.group_size
    settings = [("1 mini-batch, 1 pass (baseline)", questions, 1), ("2 mini-batches", max(1, questions // 2), 1),
                (f"{questions} mini-batches", 1, 1), ("1 mini-batch, 2 passes", questions, 2)]
    path = resolve_agent(cfg.agent.model, config_name=cfg.name)
    print(f"{cfg.agent.model}: {questions} questions x {group} samples, response "
          f"{3 * args.turn_tokens + 2 * args.reply_tokens} tokens ({3 * args.turn_tokens} sampled), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, mini, epochs in settings:
            run_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={
                "mini_batch_questions": mini, "ppo_epochs": epochs, "device": "cpu"})})
            learner = GRPOLearner(run_cfg, path)
            trajectories = batch(learner.tokenizer, questions, group, args.turn_tokens, args.reply_tokens)
            started = time.perf_counter()
            learner.step(trajectories)
            times.setdefault(name, []).append(time.perf_counter() - started)
            print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
            del learner
    base = statistics.median(times[settings[0][0]])
    print("setting | optimiser steps per batch | update s (median) | x baseline")
    for name, mini, epochs in settings:
        steps = epochs * -(-questions // mini)
        t = statistics.median(times[name])
        print(f"{name} | {steps} | {t:.1f} | {t / base:.2f}")


if __name__ == "__main__":
    main()
