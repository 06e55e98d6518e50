"""A scaffolded training run end to end, as a user starts it (`prompt-r1 train --set rollout.scaffold...`):
the scaffold's turn reaches the rollout actors, the last member of every training group starts from
it and its follow-up scaffold writes that member's second turn, the step trains, and a scaffold that names a gold answer stops the run before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROPOSED = "<think>I ask first.</think><interaction_prompt>What is asked here?</interaction_prompt>"
FOLLOWED = "<think>Then.</think><interaction_prompt>And next?</interaction_prompt>"


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def _task(folder: Path, body: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scaffold.py").write_text(f"def propose(question):\n    return {body}\n\n\n"
                                        f"def follow(question, replies):\n    return {FOLLOWED!r} if len(replies) == 1 "
                                        "else None\n")
    return f"{folder / 'scaffold.py'}:propose"


@pytest.mark.slow
def test_a_scaffolded_step_trains_and_its_last_members_start_from_the_scaffold(tmp_path) -> None:
    home = tmp_path / "runs"
    spec = _task(tmp_path / "task", repr(PROPOSED))
    trained = _cli("train", "-c", "configs/smoke.yaml", "--set", "train.steps=1", "--set", f"rollout.scaffold.fn={spec}",
                   "--set", "rollout.scaffold.members=1", "--set", "rollout.scaffold.ce_coef=0.5",
                   "--set", f"rollout.scaffold.follow_up={spec.replace(':propose', ':follow')}", home=home)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    import duckdb

    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT group_index, agent_turns, env_replies FROM trajectories WHERE step = 0").fetchall()
    assert rows and {g for g, _, _ in rows} == {0, 1}
    for group_index, turns, replies in rows:  # smoke groups of 2: member 1 is scaffolded, member 0 samples
        assert (turns[0] == PROPOSED) == (group_index == 1), (group_index, turns[0])
        if group_index == 1:  # after the first reply the follow-up scaffold writes turn 2
            assert replies and turns[1] == FOLLOWED, (turns, replies)


def test_a_scaffold_that_names_a_gold_answer_stops_the_run_before_any_model(tmp_path) -> None:
    spec = _task(tmp_path / "task", "'<think>x</think><interaction_prompt>Is it ' + question.golds[0] + '?</interaction_prompt>'")
    refused = _cli("train", "-c", "configs/smoke.yaml", "--set", "train.steps=1", "--set", f"rollout.scaffold.fn={spec}",
                   "--set", "rollout.scaffold.members=1", home=tmp_path / "runs")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = refused.stdout + refused.stderr
    assert "rollout.scaffold.fn" in said and "names a gold answer" in said and "Traceback" not in said
