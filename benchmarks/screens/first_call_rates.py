"""How often a cold-start agent's first call asks only the first hop, on *training* questions.

GRPO can only choose between first calls the agent samples. Before any registered run (and before
any probe is looked at) this measures, on the first N questions of `data/compositional/train`, the
share of first turns that decompose (`prompt_r1.data.first_call.asks_first_hop`) when sampled at
temperature 1 (`--samples` per question) and greedily, plus how many first turns are interaction
turns at all. Only the agent runs: no environment is called, so this takes a couple of minutes.

    .venv/bin/python benchmarks/screens/first_call_rates.py --agent smollm2-135m-protocol-followup-mix

Prints one JSON object; `--out` also writes it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from prompt_r1.core.protocol import parse_turn
from prompt_r1.core.tokens import agent_prompt_ids
from prompt_r1.data.compositional import known_questions
from prompt_r1.data.first_call import asks_first_hop

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "data" / "compositional" / "train" / "compositional_train.jsonl"


def first_turn_shares(policy, questions: list[str], samples: int, max_new_tokens: int = 64) -> dict[str, float]:
    """Shares over every first turn `policy` writes for `questions` (`samples` each, seeds 0..samples-1)."""
    known = known_questions()
    prompts, seeds, owners = [], [], []
    for i, question in enumerate(questions):
        ids = agent_prompt_ids(policy.tokenizer, question)
        for k in range(samples):
            prompts.append(ids)
            seeds.append(1000 * i + k)
            owners.append(question)
    turns = policy.generate(prompts, max_new_tokens, seeds)
    calls = [parse_turn(s.text).interaction_prompt for s in turns]
    first_hop = [c is not None and asks_first_hop(known[q], c) for q, c in zip(owners, calls)]
    return {"turns": len(turns), "interaction": sum(c is not None for c in calls) / len(turns),
            "first_hop": sum(first_hop) / len(turns)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="smollm2-135m-protocol-followup-mix")
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.policy.hf import TransformersPolicy

    started = time.monotonic()
    path = resolve_agent(args.agent)
    questions = [json.loads(line)["question"] for line in TRAIN.read_text().splitlines()[: args.questions]]
    sampled = TransformersPolicy(path, temperature=1.0, top_p=1.0, dtype="float32", seed=0)
    greedy = TransformersPolicy(path, temperature=0.0, top_p=1.0, dtype="float32", seed=0)
    result = {"agent": args.agent, "questions": len(questions), "source": str(TRAIN.relative_to(ROOT)),
              "sampled_t1": first_turn_shares(sampled, questions, args.samples),
              "greedy": first_turn_shares(greedy, questions, 1), "wall_s": round(time.monotonic() - started, 1)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
