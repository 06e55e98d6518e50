"""Real processes sharing a run folder or a home: one owner per run folder, a killed run's Ray
leftovers stopped by the next owner, MLflow's first database creation done once.

The locks are the kernel's (`fcntl.flock`), so the tests hold them from other real processes
and kill those with SIGKILL: a lock or a Ray instance that only a clean exit releases would
show here.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from prompt_r1.env.server_guard import process_cmdline, process_start
from prompt_r1.training.run_folder import (LOCK_FILE, RAY_FILE, RunBusyError, own_run, session_processes,
                                         sweep_ray_leftovers)

ROOT = Path(__file__).resolve().parents[2]

# Holds the run folder with the real `own_run` (and, given a second argument, starts a local Ray
# as the training session does), says so, then waits to be killed.
HOLDER = """
import json, sys, time
from prompt_r1.training.run_folder import RAY_FILE, own_run, session_processes
with own_run(sys.argv[1]):
    if len(sys.argv) > 2:
        from pathlib import Path
        from prompt_r1.config.experiment import RolloutConfig
        from prompt_r1.cluster.connect import init_ray
        init_ray(RolloutConfig(ray_num_cpus=1))
        record = json.loads((Path(sys.argv[1]) / RAY_FILE).read_text())
        deadline = time.monotonic() + 120  # Ray's agents start a little after ray.init returns
        while True:
            pids = session_processes(record)
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
        assert sorted(p.name for p in folder.iterdir()) == before == sorted([LOCK_FILE, RAY_FILE])
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
    next process to own the run folder stops exactly those (its session's, started after it)."""
    folder = tmp_path / "run"
    holder, line = start_holder(folder, "ray")
    recorded = [int(p) for p in line.split()[1:]]
    titles = [process_cmdline(pid) for pid in recorded]
    assert sum(t.startswith("ray::") and "Agent" in t for t in titles) >= 2, titles  # found by their open files
    starts = {pid: process_start(pid) for pid in recorded}

    def alive() -> list[int]:
        return [pid for pid in recorded if process_start(pid) is not None and process_start(pid) == starts[pid]]

    bystander = subprocess.Popen(["sleep", "300"])  # not Ray's: must survive the sweep
    kill9(holder)
    time.sleep(3)  # Ray's own clean-up of a dead driver gets its chance first
    try:
        assert alive(), "nothing of the killed driver's Ray outlived it: the fault did not happen"
        with own_run(folder):  # the sweep
            pass
        assert alive() == [], [(pid, process_cmdline(pid)[:80]) for pid in alive()]
        assert process_start(bystander.pid) is not None
    finally:
        bystander.kill()
        bystander.wait()
        for pid in alive():  # whatever a failed assertion left: only this session's processes
            os.kill(pid, signal.SIGKILL)


def sleeper(*args: str) -> subprocess.Popen:
    """A process that sleeps, with `args` on its command line."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args])


def stamp(at: float) -> str:
    """A Ray session name's date and time, as Ray writes it (local time)."""
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d_%H-%M-%S")


def test_sweep_stops_exactly_the_dead_owners_sessions_among_generated_processes(tmp_path):
    """Processes of many kinds (Ray's own programs or a user's reader of the session's logs, issue 62
    item 6; named by command line or by an open file; the owner's pid or another; dated before or
    after the record; started before or after the owner): the sweep stops exactly those a
    restatement of the rule picks, and a live owner's are left alone."""
    rng = random.Random(7)
    folder = tmp_path / "run"
    folder.mkdir()
    owner_pid = 4_000_000 + rng.randrange(100_000)  # beyond pid_max: no live process has it
    now = time.time()
    # names a matching session but started before the "owner" did: never its Ray's
    older = sleeper(f"--session_name=session_{stamp(now)}_000001_{owner_pid}")
    time.sleep(0.05)
    record = {"owner_pid": owner_pid, "owner_start": process_start(older.pid) + 1, "recorded_at": now}
    # a module of an installed `ray` package (as Ray's dashboard and agents are), and a user's own script
    agent = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "ray" / "agent.py"
    reader = tmp_path / "my_log_reader.py"
    for script in (agent, reader):
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("import sys, time\nfiles = [open(a, 'a') for a in sys.argv[1:] if a.endswith('.out')]\n"
                          "time.sleep(300)\n")
    procs, expected = [], []
    try:
        for i in range(16):
            pid_suffix = rng.choice([owner_pid, owner_pid, owner_pid + 1, owner_pid * 10 + 7])
            at = now + rng.choice([-3600, -30, 0, 5, 300])
            name = f"session_{stamp(at)}_{rng.randrange(10**6):06d}_{pid_suffix}"
            how = rng.choice(["cmdline", "open file"])
            ray_own = rng.random() < 0.6  # Ray's program, or a user's reader of the session's logs (tail -f)
            script = agent if ray_own else reader
            if how == "cmdline":
                proc = subprocess.Popen([sys.executable, str(script), f"--session_name={name}"])
            else:
                log_dir = tmp_path / "ray" / name / "logs"
                log_dir.mkdir(parents=True, exist_ok=True)
                proc = subprocess.Popen([sys.executable, str(script), str(log_dir / f"agent{i}.out")])
            procs.append(proc)
            if ray_own and pid_suffix == owner_pid and at >= now - 1:  # the rule, restated
                expected.append(proc.pid)
        time.sleep(1.0)  # each child has opened its file
        (folder / RAY_FILE).write_text(json.dumps(record))
        assert sorted(sweep_ray_leftovers(folder, grace_s=2)) == sorted(expected)
        assert all(p.wait(timeout=10) is not None for p in procs if p.pid in expected)
        assert all(p.poll() is None for p in procs if p.pid not in expected)
        assert older.poll() is None and not (folder / RAY_FILE).exists()

        live = {**record, "owner_pid": os.getpid(), "owner_start": process_start(os.getpid())}
        (folder / RAY_FILE).write_text(json.dumps(live))  # this process recorded it: its Ray is in use
        assert sweep_ray_leftovers(folder) == [] and (folder / RAY_FILE).exists()
        reused = {**record, "owner_pid": older.pid, "owner_start": 1}  # the pid now runs another process
        (folder / RAY_FILE).write_text(json.dumps(reused))
        assert sweep_ray_leftovers(folder) == [] and older.poll() is None
    finally:
        for proc in [older, *procs]:
            proc.kill()
            proc.wait()


# Owns the run folder, starts a local Ray as the CLI does (SIGTERM raising KeyboardInterrupt),
# then "trains" until interrupted; its clean-up takes a moment, as a session's does.
STARTER = """
import sys, time
from prompt_r1.core.signals import install_sigterm_interrupt
install_sigterm_interrupt()
from prompt_r1.config.experiment import RolloutConfig
from prompt_r1.cluster.connect import init_ray
from prompt_r1.training.run_folder import own_run
with own_run(sys.argv[1]):
    print("starting", flush=True)
    init_ray(RolloutConfig(ray_num_cpus=1))
    time.sleep(8)  # Ray's agents are up
    print("up", flush=True)
    try:
        time.sleep(600)
    finally:
        time.sleep(1.0)
"""


def start_starter(folder: Path, until: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", STARTER, str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.strip() == until:
            return proc
    raise AssertionError(f"the starter exited with {proc.wait()} before saying {until!r}")


def gone_within(record: dict, seconds: float) -> list[int]:
    """The recorded owner's Ray processes still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := session_processes(record)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.2, 1.0, 2.5])
def test_sigterm_while_ray_starts_leaves_nothing_after_the_next_owner(tmp_path, delay_s):
    """SIGTERM at several moments of `ray.init` (Ray's own handlers may end the process with no
    clean-up): whatever of its Ray is left, the next owner of the folder stops."""
    folder = tmp_path / "run"
    starter = start_starter(folder, "starting")
    record = json.loads((folder / RAY_FILE).read_text())
    time.sleep(delay_s)
    starter.send_signal(signal.SIGTERM)
    starter.wait(timeout=120)
    try:
        time.sleep(2)
        with own_run(folder):  # the sweep
            pass
        assert gone_within(record, 10) == []
    finally:
        for pid in session_processes(record):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("gap_s", [0.05, 0.4])
def test_three_quick_interrupts_still_stop_ray_at_exit(tmp_path, gap_s):
    """Three Ctrl-Cs, the later ones landing in clean-up and at exit: the driver still stops its
    Ray before it ends (the agents would otherwise run on for a minute or more), with no sweep."""
    folder = tmp_path / "run"
    starter = start_starter(folder, "up")
    record = json.loads((folder / RAY_FILE).read_text())
    assert session_processes(record), "no Ray processes to stop: the fault cannot happen"
    try:
        for _ in range(3):
            starter.send_signal(signal.SIGINT)
            time.sleep(gap_s)
        assert starter.wait(timeout=120) != 0
        assert gone_within(record, 5) == []
    finally:
        for pid in session_processes(record):
            os.kill(pid, signal.SIGKILL)


# Imports MLflow's set-up, says so, waits for the go file, then sets up MLflow on the home.
RACER = """
import os, sys, time
from tasks.tracking.runs import setup_mlflow
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
