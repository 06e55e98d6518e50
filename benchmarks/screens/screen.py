"""Screen candidate questions with the environment alone: keep those it answers when asked well.

GRPO learns only from groups whose rewards differ, and the agent can only earn answer reward on
questions the environment can answer. So before a learning run, every candidate question is
put to the environment LLM alone (no agent), greedily, in several phrasings (the bare question,
"answer in a few words", a `Question: .. Answer:` completion, ...); a phrasing passes when the
reply contains a gold answer (`substring_match`). A question is kept when at least one phrasing
passes: the environment knows the answer, and how it is asked decides whether it says it, which
is what the agent is trained to do.

The candidates (`benchmarks/screens/screen_candidates.jsonl`, written for this project: capitals,
chemical symbols, opposites, languages, everyday facts, small arithmetic) are screened against
the demo's environment (SmolLM2-135M-Instruct on a managed vLLM server). The kept questions are
shuffled with a fixed seed and split into a probe set (`data/screened/test/`, never trained on)
and a training pool (`data/screened/train/`); every pass rate goes to
`benchmarks/results/screen.json`.

    .venv/bin/python -m benchmarks.screens.screen                # screen, write the split and the pass rates
    .venv/bin/python -m benchmarks.screens.screen --probe 40     # probe-set size (the rest is the training pool)

A harder pool keeps only the questions whose answer depends on the asking: `--band 0.25 0.75`
drops those every phrasing gets right (a group of equal rewards teaches GRPO nothing) as well as
those none does, and `--arithmetic N` adds N generated sums, differences and products (seeded)
to the hand-written candidates, since the hand-written ones are mostly easy:

    .venv/bin/python -m benchmarks.screens.screen --arithmetic 600 --band 0.25 0.75 --probe 80 \
        --data-out data/screened-hard --results benchmarks/results/screen-hard.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import load_config
from prompt_r1.core.fsutil import atomic_write_text
from prompt_r1.core.metrics import substring_match
from prompt_r1.core.seeding import derive_seed
from prompt_r1.env import open_environment

PHRASINGS = {
    "bare": "{q}",
    "short": "{q} Answer in a few words.",
    "completion": "Question: {q}\nAnswer:",
    "one_word": "Answer with one word or number only. {q}",
}


def arithmetic_candidates(n: int, seed: int) -> list[dict]:
    """`n` generated arithmetic questions, distinct, in a seeded order: two-digit sums and
    differences, and products of a one-digit and a one- or two-digit number; answers of at least
    two digits that do not occur in the question."""
    rng = random.Random(derive_seed("screen_arithmetic", seed))
    seen: set[str] = set()
    out: list[dict] = []
    while len(out) < n:
        op = rng.choice(["+", "-", "times"])
        if op == "times":
            a, b = rng.randint(2, 9), rng.randint(2, 19)
            answer = a * b
        else:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if op == "-" and a < b:
                a, b = b, a
            answer = a + b if op == "+" else a - b
        question = f"What is {a} {op} {b}?"
        if question in seen or answer < 10 or str(answer) in question:  # a reply echoing the question
            continue                                                     # must not pass the substring test
        seen.add(question)
        out.append({"dataset": "short_answer", "question": question, "answers": [str(answer)],
                    "task_family": "standard_qa", "kind": "arithmetic_generated"})
    return out


async def ask_all(env, questions: list[dict]) -> list[dict[str, str]]:
    """Each question in every phrasing, all calls in flight at once (the client bounds concurrency)."""
    calls = [(i, name, env.reply([{"role": "user", "content": template.format(q=row["question"])}]))
             for i, row in enumerate(questions) for name, template in PHRASINGS.items()]
    replies = await asyncio.gather(*(c for _, _, c in calls))
    out: list[dict[str, str]] = [{} for _ in questions]
    for (i, name, _), reply in zip(calls, replies):
        if reply.call.error:
            raise SystemExit(f"environment call failed ({reply.call.error}); a failed call is not a "
                             "screen result: fix the environment and run again")
        out[i][name] = reply.text
    await env.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml", help="Its `environment` is screened.")
    parser.add_argument("--candidates", type=Path, default=ROOT / "benchmarks" / "screen_candidates.jsonl")
    parser.add_argument("--probe", type=int, default=40, help="Kept questions held out as the probe set.")
    parser.add_argument("--arithmetic", type=int, default=0, metavar="N",
                        help="Also screen N generated arithmetic questions (seeded by --seed).")
    parser.add_argument("--band", type=float, nargs=2, default=(0.25, 1.0), metavar=("LO", "HI"),
                        help="Keep questions whose pass rate over the phrasings is within [LO, HI] "
                             "(default: any phrasing passes).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-out", type=Path, default=ROOT / "data" / "screened")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "screen.json")
    args = parser.parse_args()
    setup_logging()
    cfg = load_config(ROOT / args.config)
    candidates = [json.loads(line) for line in args.candidates.read_text().splitlines() if line.strip()]
    candidates += arithmetic_candidates(args.arithmetic, args.seed)
    started = time.perf_counter()
    with open_environment(cfg.environment) as env:
        replies = asyncio.run(ask_all(env, candidates))
    wall = time.perf_counter() - started
    rows = []
    for row, answered in zip(candidates, replies):
        passes = {name: substring_match(text, row["answers"]) for name, text in answered.items()}
        rows.append({**row, "passes": passes, "pass_rate": statistics.fmean(passes.values()),
                     "replies": answered})
    low, high = args.band
    kept = [r for r in rows if low - 1e-9 <= r["pass_rate"] <= high + 1e-9]
    random.Random(derive_seed("screen_split", args.seed)).shuffle(kept)
    if len(kept) <= args.probe:
        raise SystemExit(f"only {len(kept)} questions passed the screen; a probe set of {args.probe} "
                         "needs more candidates")
    probe, train = kept[: args.probe], kept[args.probe:]
    for split, part in (("test", probe), ("train", train)):
        lines = [json.dumps({"dataset": f"screened_{'probe' if split == 'test' else 'train'}",
                             "question": r["question"], "answers": r["answers"],
                             "task_family": r["task_family"]}) for r in part]
        (args.data_out / split).mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.data_out / split / f"screened_{split}.jsonl", "\n".join(lines) + "\n")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r["pass_rate"])
    by_phrasing = {name: statistics.fmean(r["passes"][name] for r in rows) for name in PHRASINGS}
    summary = {
        "environment": cfg.environment.model, "candidates": len(rows), "band": [low, high], "kept": len(kept),
        "probe": len(probe), "train": len(train), "wall_s": round(wall, 1),
        "pass_rate_by_kind": {k: {"n": len(v), "mean": round(statistics.fmean(v), 3),
                                  "kept": sum(1 for x in v if low - 1e-9 <= x <= high + 1e-9)}
                              for k, v in sorted(by_kind.items())},
        "pass_rate_by_phrasing": {k: round(v, 3) for k, v in by_phrasing.items()},
        "kept_pass_rate_mean": round(statistics.fmean(r["pass_rate"] for r in kept), 3),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.results, json.dumps({"summary": summary, "phrasings": PHRASINGS, "questions": rows},
                                               indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.data_out}/{{train,test}} and {args.results}")


if __name__ == "__main__":
    main()
