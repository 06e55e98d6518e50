"""Real processes sharing a run folder or a home: one owner per run folder, a killed run's Ray
leftovers stopped by the next owner, MLflow's first database creation done once.

The locks are the kernel's (`fcntl.flock`), so the tests hold them from other real processes
and kill those with SIGKILL: a lock or a Ray instance that only a clean exit releases would
show here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prompt_r1.env.server_guard import process_cmdline, process_start
from prompt_r1.training.run_owner import LOCK_FILE, RAY_FILE, RunBusyError, own_run, sweep_ray_leftovers

ROOT = Path(__file__).resolve().parents[1]

# Holds the run folder with the real `own_run` (and, given a second argument, starts a local Ray
# as the training session does and records it), says so, then waits to be killed.
HOLDER = """
import sys, time
from prompt_r1.training.run_owner import own_run, record_ray
with own_run(sys.argv[1]):
    if len(sys.argv) > 2:
        from prompt_r1.config.experiment import RolloutConfig
        from prompt_r1.rollout.ray_connect import init_ray
        init_ray(RolloutConfig(ray_num_cpus=1))
        deadline = time.monotonic() + 120  # Ray's agents start a little after ray.init returns
        while True:
            pids = record_ray(sys.argv[1])
            titles = [open(f"/proc/{pid}/cmdline").read() for pid in pids]
            if sum(t.startswith("ray::") and "Agent" in t for t in titles) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print("pids", *pids, flush=True)
    print("held", flush=True)
    time.sleep(600)
"""


def start_holder(folder: Path, *extra: str, deadline_s: float = 240.0) -> tuple[subprocess.Popen, str]:
    """The holder process, once it holds `folder`, and the line it printed before `held`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    before, deadline = "", time.monotonic() + deadline_s
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.strip() == "held":
            return proc, before
        before = line.strip()
        assert time.monotonic() < deadline, "the holder did not take the folder in time"
    raise AssertionError(f"the holder exited with {proc.wait()} before taking the folder")


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_second_train_on_a_held_run_folder_is_refused_naming_the_holder(home, tmp_path):
    """`train --resume --run-id X` with another warehouse, while another process holds X: exit 2
    naming the holder's pid and host; nothing of the run folder is written by the second one."""
    folder = home / "smoke" / "owned"
    holder, _ = start_holder(folder)
    try:
        before = sorted(p.name for p in folder.iterdir())
        result = subprocess.run(
            [sys.executable, "-m", "flows.cli", "train", "-c", "configs/smoke.yaml", "--run-id", "owned",
             "--resume", "--db", str(tmp_path / "other.duckdb")],
            capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        output = result.stdout + result.stderr
        message = next(line for line in output.splitlines() if line.startswith("error: "))
        assert "Ray: started" not in result.stderr  # refused before Ray or any model starts
        assert f"run folder {folder} is in use by pid {holder.pid} on host {os.uname().nodename}" in message
        assert "--resume" in message
        assert sorted(p.name for p in folder.iterdir()) == before == [LOCK_FILE]
    finally:
        kill9(holder)
    # SIGKILL released the lock: no stale lock, nothing to clean up
    with own_run(folder):
        holder_now = json.loads((folder / LOCK_FILE).read_text())
        assert holder_now["pid"] == os.getpid()


def test_own_run_refuses_in_process_too_while_held(tmp_path):
    folder = tmp_path / "run"
    holder, _ = start_holder(folder)
    try:
        with pytest.raises(RunBusyError, match=f"in use by pid {holder.pid} on host"):
            with own_run(folder):
                pass
    finally:
        kill9(holder)
    with own_run(folder):
        pass


@pytest.mark.slow
def test_ray_leftovers_of_a_killed_driver_are_stopped_by_the_next_owner(tmp_path):
    """kill -9 of a driver that started a local Ray leaves some of Ray's processes running; the
    next process to own the run folder stops exactly those (same pid, start time, session)."""
    folder = tmp_path / "run"
    holder, line = start_holder(folder, "ray")
    recorded = [int(p) for p in line.split()[1:]]
    record = json.loads((folder / RAY_FILE).read_text())
    markers = {p["pid"]: p["marker"] for p in record["processes"]}
    assert sorted(markers) == sorted(recorded)
    assert all(markers[pid] in process_cmdline(pid) for pid in recorded)

    def alive() -> list[int]:
        return [pid for pid in recorded if process_start(pid) is not None and markers[pid] in process_cmdline(pid)]

    bystander = subprocess.Popen(["sleep", "300"])  # not Ray's: must survive the sweep
    kill9(holder)
    time.sleep(3)  # Ray's own clean-up of a dead driver gets its chance first
    try:
        assert alive(), "nothing of the killed driver's Ray outlived it: the fault did not happen"
        with own_run(folder):  # the sweep
            pass
        assert alive() == [], [(pid, markers[pid], process_cmdline(pid)[:80]) for pid in alive()]
        assert process_start(bystander.pid) is not None
        assert not (folder / RAY_FILE).exists()
    finally:
        bystander.kill()
        bystander.wait()
        for pid in alive():  # whatever a failed assertion left: only this session's processes
            os.kill(pid, signal.SIGKILL)


def test_sweep_spares_a_live_recorder_and_reused_pids(tmp_path):
    """A record whose recorder lives (this process) is left alone; one whose pids now belong to
    other processes (another start time) stops nothing."""
    folder = tmp_path / "run"
    folder.mkdir()
    other = subprocess.Popen(["sleep", "300"])
    try:
        mine = {"session": "session_x", "owner_pid": os.getpid(), "owner_start": process_start(os.getpid()),
                "processes": [{"pid": other.pid, "start": process_start(other.pid)}]}
        (folder / RAY_FILE).write_text(json.dumps(mine))
        assert sweep_ray_leftovers(folder) == [] and (folder / RAY_FILE).exists()
        reused = {**mine, "owner_pid": other.pid, "owner_start": 1,
                  "processes": [{"pid": other.pid, "start": 1}]}
        (folder / RAY_FILE).write_text(json.dumps(reused))
        assert sweep_ray_leftovers(folder) == [] and process_start(other.pid) is not None
    finally:
        other.kill()
        other.wait()


# Imports MLflow's set-up, says so, waits for the go file, then sets up MLflow on the home.
RACER = """
import os, sys, time
from tasks.tracking import setup_mlflow
print("ready", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.005)
print("experiment", setup_mlflow("smoke"), flush=True)
"""


def test_flows_starting_together_on_a_fresh_home_create_mlflow_once(home, tmp_path):
    """Four processes set MLflow up on the same fresh home at the same instant (all imported,
    then released together): each gets the one experiment; none dies on `table ... already
    exists` or on the experiment created twice."""
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROMPT_R1_HOME": str(home)}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(go)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(4)]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready", racer.stderr.read()[-3000:]  # type: ignore[union-attr]
        assert not (home / "mlflow.db").exists()  # a fresh home until the go
        go.touch()
        outcomes = [racer.communicate(timeout=600) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
            racer.wait()
    for racer, (out, err) in zip(racers, outcomes, strict=True):
        assert racer.returncode == 0, err[-3000:]
    assert len({out.split()[-1] for out, _ in outcomes}) == 1
