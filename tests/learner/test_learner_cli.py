"""A learner group through `prompt-r1 train`, as a user runs it: a rank killed mid-run, then `--resume`.

The first command trains with `train.world_size=2`; once its first checkpoint is on disk, the test
SIGKILLs learner rank 1's process (found from the command's own log line `learner rank 1: node
..., pid N`), as the OOM killer or a lost node would. The command must stop within the
`train.dist_timeout_s` deadline with exit 2 and one message naming rank 1 and `--resume`, no
traceback. `train --resume` then continues the run from that checkpoint and must export the agent
an uninterrupted one-rank run exports (rollouts are seeded by run seed, step, question, sample and
turn, and the checkpoint holds weights, optimiser state, RNG and data position), with every step
recorded once in the warehouse.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
DIST_TIMEOUT_S = 60
# four questions a step (two groups per rank), no validation rollouts: the updates are what is compared;
# rollout.ray_num_cpus unset: the local Ray instance holds the rollout actor and two ranks, on
# however few cores (tiny models: they mostly wait on each other)
SETTINGS = [f"train.steps={STEPS}", "rollout.batch_questions=4", "data.validation_fraction=0",
            f"train.dist_timeout_s={DIST_TIMEOUT_S}", "train.checkpoint_every=1"]
RANK_LINE = re.compile(r"learner rank 1: node \S+ \(\S+\), GPUs \S+, pid (\d+)")


def _command(world_size: int, run_id: str, *extra: str) -> list[str]:
    sets = [arg for key in [*SETTINGS, f"train.world_size={world_size}"] for arg in ("--set", key)]
    return [sys.executable, "-m", "flows.cli", "train", "-c", "configs/smoke.yaml", *sets, "--run-id", run_id, *extra]


def _agent(home: Path, run_id: str) -> dict[str, torch.Tensor]:
    return load_file(str(home / "smoke" / run_id / "agent" / "model.safetensors"))


def test_a_killed_rank_stops_train_naming_it_and_resume_finishes_the_run(home, tmp_path) -> None:
    from prompt_r1.learner.checkpoint import step_dir_name
    from warehouse.store import Warehouse

    env = {**os.environ, "PROMPT_R1_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "1000"}
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(_command(2, "killed"), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        first_checkpoint = home / "smoke" / "killed" / "checkpoints" / step_dir_name(1)
        deadline, pid = time.monotonic() + 600, None
        while time.monotonic() < deadline and proc.poll() is None:
            found = RANK_LINE.search(log_path.read_text())
            pid = int(found.group(1)) if found else None
            if pid and first_checkpoint.is_dir():
                break
            time.sleep(0.2)
        assert pid and proc.poll() is None, log_path.read_text()[-3000:]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        code = proc.wait(timeout=DIST_TIMEOUT_S + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log_path.read_text()
    assert time.monotonic() - killed_at < DIST_TIMEOUT_S + 30  # the deadline, plus the process's own exit
    assert code == 2, out[-3000:]
    assert re.search(r"error: learner rank 1 died during .*--resume", out), out[-3000:]
    assert "Traceback" not in out, out[-3000:]

    resumed = subprocess.run(_command(2, "killed", "--resume"), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming run killed" in resumed.stdout
    whole = subprocess.run(_command(1, "whole"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]

    killed, reference = _agent(home, "killed"), _agent(home, "whole")
    assert killed.keys() == reference.keys()
    assert max((killed[k].float() - reference[k].float()).abs().max().item() for k in killed) < 1e-5
    with Warehouse(home / "warehouse.duckdb") as wh:
        for run_id in ("killed", "whole"):
            assert wh.steps_recorded(run_id) == list(range(STEPS))
            per_step = wh.query("SELECT step, COUNT(*) FROM trajectories WHERE run_id = ? GROUP BY 1 ORDER BY 1",
                                [run_id])
            assert [n for _, n in per_step] == [4 * 2] * STEPS  # 4 questions x group_size 2, each step once
