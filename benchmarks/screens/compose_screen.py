"""Screen two-hop questions: keep those the environment fails at once but answers hop by hop.

The compositional task (`prompt_r1/data/compositional.py`) exists to show an agent learning to
interact over several turns. A question is only worth that when one call fails and two succeed,
so every generated question is put to the environment alone (greedy, each phrasing of
`benchmarks/screens/screen.py`), composed and as each of its two hops. A question is kept when the
composed question fails in every phrasing and each hop passes in at least `--hop-min` of them
(a phrasing passes when the reply names a gold answer as whole words, `mentions`: plain
`substring_match` would find the gold `US` in "because").

The kept questions are split by country (`split_by_entity`: no country in both) into a probe set
(`data/compositional/test`, never trained on) and a training pool (`data/compositional/train`);
pass rates per chain and per relation go to `benchmarks/results/compose-screen.json`.

    .venv/bin/python -m benchmarks.screens.compose_screen                 # screen, split, pass rates
    .venv/bin/python -m benchmarks.screens.compose_screen --limit 40      # a quick look at 40 questions

About 3,200 environment calls (429 questions and 359 distinct hops, four phrasings each), asked
32 prompts at a time; on a loaded machine raise the per-call deadline
(`--set environment.call_deadline_s=1200`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.screens.screen import PHRASINGS, ask_all
from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import load_config, parse_overrides
from prompt_r1.core.fsutil import atomic_write_text
from prompt_r1.data.compositional import generate, mentions, split_by_entity

log = logging.getLogger("benchmarks.screens.compose_screen")
DATASETS = {"test": "compositional_probe", "train": "compositional_train"}


def pass_rates(env, prompts: dict[str, tuple[str, ...]], chunk: int) -> dict[str, dict]:
    """Each distinct prompt (text -> gold answers) in every phrasing: its passes, rate and replies.

    Asked `chunk` prompts at a time: a call's deadline includes its wait for a free slot, so
    thousands of calls queued at once would run out of time waiting, not answering."""
    texts = list(prompts)
    replies: list[dict[str, str]] = []
    for start in range(0, len(texts), chunk):
        replies += asyncio.run(ask_all(env, [{"question": t} for t in texts[start: start + chunk]]))
        log.info("screened %d of %d prompts", min(start + chunk, len(texts)), len(texts))
    out = {}
    for text, answered in zip(texts, replies):
        passes = {name: float(mentions(reply, prompts[text])) for name, reply in answered.items()}
        out[text] = {"passes": passes, "pass_rate": statistics.fmean(passes.values()), "replies": answered}
    return out


def summarise(rows: list[dict], key: str) -> dict[str, dict]:
    """Per value of `key`: candidates, composed / hop pass rates (means over phrasings), kept."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    mean = (lambda xs: round(statistics.fmean(xs), 3))
    return {k: {"n": len(v), "composed": mean(r["composed_rate"] for r in v),
                "hop1": mean(r["hop_rates"][0] for r in v), "hop2": mean(r["hop_rates"][1] for r in v),
                "composed_any": mean(float(r["composed_rate"] > 0) for r in v),
                "kept": sum(r["kept"] for r in v)}
            for k, v in sorted(groups.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/learning-compositional.yaml",
                        help="Its `environment` is screened (the learning run's, so the screen sees the same replies).")
    parser.add_argument("--probe", type=int, default=60, help="Least number of kept questions in the probe set.")
    parser.add_argument("--hop-min", type=float, default=0.25,
                        help="Least pass rate over the phrasings each hop needs (0.25: one phrasing of four).")
    parser.add_argument("--limit", type=int, help="Screen only the first N generated questions (a quick look).")
    parser.add_argument("--chunk", type=int, default=32, help="Prompts in flight together (each in every phrasing).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Config override KEY=VALUE, repeatable (e.g. environment.call_deadline_s=1200 on a "
                             "loaded machine).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-out", type=Path, default=ROOT / "data" / "compositional")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "compose-screen.json")
    args = parser.parse_args()
    setup_logging()
    from prompt_r1.env import open_environment

    cfg = load_config(ROOT / args.config, parse_overrides(args.overrides))
    questions = generate(args.seed)[: args.limit]
    prompts: dict[str, tuple[str, ...]] = {}
    for q in questions:
        prompts[q.question] = q.answers
        for hop in q.hops:
            prompts[hop.question] = hop.answers
    started = time.perf_counter()
    with open_environment(cfg.environment) as env:
        screened = pass_rates(env, prompts, args.chunk)
    wall = time.perf_counter() - started
    rows, kept = [], []
    for q in questions:
        composed = screened[q.question]
        hop_rates = [screened[h.question]["pass_rate"] for h in q.hops]
        keep = composed["pass_rate"] == 0 and all(r >= args.hop_min - 1e-9 for r in hop_rates)
        rows.append({"question": q.question, "answers": list(q.answers), "chain": q.chain,
                     "relation": q.chain.split(">")[1], "country": q.country,
                     "composed_rate": composed["pass_rate"], "hop_rates": hop_rates, "kept": keep,
                     "composed_replies": composed["replies"],
                     "hops": [{"question": h.question, "answers": list(h.answers), **screened[h.question]}
                              for h in q.hops]})
        if keep:
            kept.append(q)
    try:
        probe, train = split_by_entity(kept, args.probe, args.seed)
    except ValueError as err:  # the screen's figures are still worth keeping
        probe, train, failed = [], [], err
    else:
        failed = None
    summary = {
        "environment": cfg.environment.model, "candidates": len(rows), "distinct_prompts": len(prompts),
        "hop_min": args.hop_min, "kept": len(kept), "probe": len(probe), "train": len(train),
        "probe_countries": sorted({q.country for q in probe}), "wall_s": round(wall, 1),
        "by_chain": summarise(rows, "chain"), "by_relation": summarise(rows, "relation"),
        "kept_by_chain_split": {split: dict(sorted(_count(part).items())) for split, part in
                                (("probe", probe), ("train", train))},
        "composed_pass_by_phrasing": {name: round(statistics.fmean(screened[q.question]["passes"][name]
                                                                  for q in questions), 3) for name in PHRASINGS},
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.results, json.dumps({"summary": summary, "phrasings": PHRASINGS, "questions": rows},
                                               indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "probe_countries"}, indent=1))
    if failed:
        raise SystemExit(f"{failed} (the pass rates are in {args.results}; no data folder was written)")
    for split, part in (("test", probe), ("train", train)):
        lines = [json.dumps(q.row(DATASETS[split])) for q in part]
        (args.data_out / split).mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.data_out / split / f"{DATASETS[split]}.jsonl", "\n".join(lines) + "\n")
    print(f"wrote {args.data_out}/{{train,test}} and {args.results}")


def _count(part) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for q in part:
        counts[q.chain] += 1
    return counts


if __name__ == "__main__":
    main()
