"""Evaluation's report of what the agent did with the environment (`prompt_r1.evaluation.turns`):
the rows against a restatement over generated episodes, the report section, and a real evaluation
of two-hop questions with the task's turn scorer beside single-hop ones it does not define."""

from __future__ import annotations

import csv
import random
import statistics
from pathlib import Path

import pytest

from prompt_r1.core.questions import QuestionRow
from prompt_r1.config.reward import RewardConfig
from prompt_r1.evaluation.turns import turn_rows, turn_table
from prompt_r1.rollout.reward_stage import RewardStage

ROOT = Path(__file__).resolve().parents[2]


def _scorer(question, trajectory):
    """Judges the second turn of questions of dataset `judged` by the length of the second turn's text."""
    if question.dataset != "judged":
        raise ValueError("not a judged question")
    values = [None] * len(trajectory.agent_turns)
    if len(values) > 1:
        values[1] = min(1.0, len(trajectory.agent_turns[1]) / 4)
    return values


def _indicators(question, trajectory):
    """A yes/no per episode: its first turn is longer than 3 characters (None without turns)."""
    return {"long_first": len(trajectory.agent_turns[0]) > 3 if trajectory.agent_turns else None}


STAGE = RewardStage(RewardConfig(turn={"scorer": "tests.evaluation.test_eval_turns:_scorer",
                                       "indicators": "tests.evaluation.test_eval_turns:_indicators"}), strict=False)


def test_turn_rows_match_a_restatement_on_generated_episodes() -> None:
    rng = random.Random(0)
    for _ in range(100):
        questions = {f"q{i}": QuestionRow(f"q{i}", rng.choice(["judged", "other"]), "test", "?", ["a"], "qa", "f1")
                     for i in range(6)}
        episodes = []
        for qid, q in questions.items():
            for method in ("agent:base", "agent:trained"):
                turns = ["x" * rng.randint(0, 6) for _ in range(rng.randint(1, 3))]
                episodes.append({"env_name": rng.choice(["e1", "e2"]), "method": method, "dataset": q.dataset,
                                 "question_id": qid, "error": rng.choice([None, None, None, "HTTP 500"]),
                                 "env_calls": [{}] * rng.randint(0, 2),
                                 "trajectory": {"agent_turns": turns, "env_replies": []}})
        rows = turn_rows(episodes, questions, STAGE)
        cells = {(e["env_name"], e["method"], e["dataset"]) for e in episodes if e["error"] is None}
        assert [(r["env_name"], r["method"], r["dataset"]) for r in rows] == sorted(cells)
        for r in rows:
            kept = [e for e in episodes if e["error"] is None
                    and (e["env_name"], e["method"], e["dataset"]) == (r["env_name"], r["method"], r["dataset"])]
            assert r["episodes"] == len(kept)
            assert r["calls"] == pytest.approx(statistics.fmean(len(e["env_calls"]) for e in kept))
            assert r["second_call"] == pytest.approx(statistics.fmean(len(e["env_calls"]) > 1 for e in kept))
            values = [min(1.0, len(e["trajectory"]["agent_turns"][1]) / 4) for e in kept
                      if len(e["trajectory"]["agent_turns"]) > 1]
            if r["dataset"] != "judged" or not values:
                assert "turn2_reward" not in r   # no turn reward is invented for what the scorer does not judge
                assert r["dataset"] == "judged" or "long_first" not in r
                continue
            assert r["turn2_reward"] == pytest.approx(statistics.fmean(values))
            assert r["turn2_full"] == pytest.approx(statistics.fmean(v == 1.0 for v in values))
            assert r["turn2_some"] == pytest.approx(statistics.fmean(v > 0 for v in values))
            assert r["long_first"] == pytest.approx(statistics.fmean(len(e["trajectory"]["agent_turns"][0]) > 3
                                                                     for e in kept))
        without = turn_rows(episodes, questions)
        assert all(not any(k.startswith("turn") for k in r) for r in without)
        assert turn_table(rows).count("\n") == len(rows) + 1


def test_the_report_shows_the_turns_and_writes_them_whole(tmp_path) -> None:
    from prompt_r1.evaluation.report import write_report

    rows = [{"env_name": "e", "method": "agent:base", "dataset": "other", "episodes": 2, "calls": 1.0,
             "second_call": 0.0},
            {"env_name": "e", "method": "agent:base", "dataset": "judged", "episodes": 3, "calls": 2.0,
             "second_call": 1.0, "turn2_reward": 0.5, "turn2_full": 0.33, "turn2_some": 0.67}]
    result = {"env_name": "e", "dataset": "judged", "method": "agent:base", "n": 3, "primary_metric": "f1",
              "score": 0.5, "f1": 0.5, "errors": 0, "env_prompt_tokens": 10, "env_completion_tokens": 5,
              "cost_usd": 0.0}
    files = write_report([result], [], tmp_path / "rep", turns=rows)
    text = files["markdown"].read_text()
    assert "## What the agent did with the environment" in text and "| e | agent:base | judged | 3 |" in text
    with files["turns"].open() as fh:
        read = list(csv.DictReader(fh))
    assert read[0]["turn2_reward"] == "" and read[1]["turn2_reward"] == "0.5"
    assert "What the agent did" not in write_report([result], [], tmp_path / "none")["markdown"].read_text()


def test_an_evaluation_reports_the_turn_scorer_on_the_datasets_it_defines(warehouse) -> None:
    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.evaluation.evaluate import evaluate
    from prompt_r1.models.resolver import resolve_agents

    ingest(warehouse, [ROOT / "data" / "sample", ROOT / "data" / "compositional"])
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {
        "eval.limit_per_dataset": 2, "eval.methods": ["agent"], "eval.suites": ["sample", "compositional_probe"],
        "reward.turn.scorer": "prompt_r1.data.compositional:follow_up_turn_rewards"})
    out = evaluate(cfg, warehouse, "turns", resolve_agents(cfg))
    by_dataset = {r["dataset"]: r for r in out.turns}
    assert "compositional_probe" in by_dataset and any(d.startswith("sample_") for d in by_dataset)
    assert all(not any(k.startswith("turn") for k in r) for d, r in by_dataset.items() if d != "compositional_probe")
    episodes = [e for e in out.episodes if e["dataset"] == "compositional_probe" and e["error"] is None]
    assert by_dataset["compositional_probe"]["episodes"] == len(episodes)
    reached = [e for e in episodes if len(e["trajectory"]["agent_turns"]) > 1]
    assert ("turn2_reward" in by_dataset["compositional_probe"]) == bool(reached)
