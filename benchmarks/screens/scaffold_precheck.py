"""Pre-check of the scaffold recipe on *training* questions only: is there a reward gap to learn from?

Before the registered run (`benchmarks/criteria/first-call.json`) and without looking at the probe
set, this opens the real training session of a config with `rollout.scaffold` (fresh warehouse,
managed environment server, rollout actors), rolls out `--batches` training batches exactly as a
training step does (the last `members` of each group start from the scaffold's first turn) and
scores them through the reward stage, with no update. It reports, for scaffolded and sampled
members apart: mean reward and answer score, the share whose first reply names the bridge (turn-1
reward), the share of verified successes, and the sampled members' first-call indicators. The
recipe goes ahead only when the scaffolded members' answer score is at least 0.15 higher (the
registered gate); the rollout time per batch is printed too.

    .venv/bin/python benchmarks/screens/scaffold_precheck.py --config configs/learning-first-call-scaffold.yaml

Prints one JSON object; `--out` also writes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATE = 0.15  # registered: scaffolded answer score - sampled answer score on training questions


def _summary(trajectories, verified_at: float) -> dict:
    scored = [t for t in trajectories if t.reward is not None]
    mean = (lambda xs: round(statistics.fmean(xs), 3) if xs else None)
    return {"n": len(scored), "reward": mean([t.reward.total for t in scored]),
            "answer": mean([t.reward.answer for t in scored]),
            "first_reply_names_bridge": mean([t.turn_rewards[0] for t in scored if t.turn_rewards]),
            "verified": mean([float(t.reward.total >= verified_at) for t in scored]),
            "env_errors": len(trajectories) - len(scored)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/learning-first-call-scaffold.yaml")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from prompt_r1.cli.logging_setup import setup_logging
    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    setup_logging()
    cfg = load_config(ROOT / args.config)
    if cfg.rollout.scaffold.fn is None:
        raise SystemExit(f"{args.config} sets no rollout.scaffold.fn: nothing to pre-check")
    started = time.monotonic()
    trajectories, seconds = [], []
    with tempfile.TemporaryDirectory(prefix="scaffold-precheck-") as home:
        with Warehouse(Path(home) / "warehouse.duckdb") as wh:
            ingest(wh, cfg.data.sources, cfg.data.max_question_chars)
            with TrainingSession(cfg, wh, "precheck", Path(home) / "run") as session:
                for index in range(args.batches):
                    t0 = time.monotonic()
                    batch = session.rollout(session.next_batch())
                    seconds.append(time.monotonic() - t0)
                    session.score(batch)
                    trajectories += batch
                    print(f"batch {index + 1}/{args.batches}: {len(batch)} trajectories in {seconds[-1]:.0f} s, "
                          f"indicators of sampled members {session.step_indicators}", flush=True)
                stage = session.reward_stage
                sampled = [t for t in trajectories if not t.scaffold_turns and t.reward is not None]
                from prompt_r1.rollout.reward_stage import indicator_shares

                indicators = indicator_shares([stage.indicators(session.by_id[t.question_id], t) for t in sampled])
    verified_at = cfg.rollout.scaffold.verified_at
    scaffolded = _summary([t for t in trajectories if t.scaffold_turns], verified_at)
    plain = _summary([t for t in trajectories if not t.scaffold_turns], verified_at)
    gap = None if None in (scaffolded["answer"], plain["answer"]) else round(scaffolded["answer"] - plain["answer"], 3)
    result = {"config": args.config, "batches": args.batches, "questions": args.batches * cfg.rollout.batch_questions,
              "scaffolded": scaffolded, "sampled": plain, "sampled_indicators": indicators,
              "answer_gap": gap, "gate": GATE, "go": gap is not None and gap >= GATE,
              "rollout_s_per_batch": round(statistics.median(seconds), 1),
              "wall_s": round(time.monotonic() - started, 1)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
