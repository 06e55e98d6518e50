"""One process owns a run folder while it trains, and a killed owner's Ray leftovers are stopped.

Two `train` processes on the same run folder (even with different warehouses, even with
`--resume`) would both write `checkpoints/` and `agent/`. `own_run` takes an exclusive
`flock` on `run_dir/owner.lock` (`core.fsutil.file_lock`) for the whole session and writes the
holder (pid, host, start time, command) into it; a second process is refused with
`RunBusyError` naming that holder. The kernel releases the lock when its process dies, however it dies (`kill -9`
included), so a lock is never stale and there is nothing to clean up. The file stays: deleting
a lock file lets a third process lock a new file while the second still holds the old one.

A local Ray instance the driver started (`ray.init(address="local")`) mostly dies with it, but
its dashboard and runtime-env agents outlive a `kill -9` of the driver by a minute or more
(about 230 MB). `record_ray` writes the processes of the instance this run started into
`run_dir/ray.json` (pid, start time, and what its command line must still carry: the Ray
session's name, or the `ray::` title Ray gives its agents); the next owner of the folder,
holding the lock and so knowing the recorder is dead, stops those still running
(`sweep_ray_leftovers`). Start times and those markers, not bare pids, identify them, so a reused pid or another Ray instance on the machine is never touched. The
agents start a little after `ray.init` returns: the session records once its rollout actors
are up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import LockBusy, atomic_write_text, file_lock, holder_text, read_holder, record_holder
from prompt_r1.env.server_guard import process_cmdline, process_start

log = logging.getLogger(__name__)

LOCK_FILE = "owner.lock"
RAY_FILE = "ray.json"
RAY_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay for a killed run's Ray leftovers


class RunBusyError(UserError, RuntimeError):
    """Another live process trains this run folder; the message names it."""


@contextlib.contextmanager
def own_run(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` for this process until the block ends (or the process dies): raises
    `RunBusyError` naming the holder when another process holds it. A killed earlier owner's Ray
    leftovers are stopped once the folder is ours."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    with contextlib.ExitStack() as held:
        try:
            fd = held.enter_context(file_lock(path, wait_s=0))
        except LockBusy:
            raise RunBusyError(
                f"run folder {run_dir} is in use by {holder_text(read_holder(path))}; one process trains a run at a "
                "time: wait for it to end (or stop it), then `--resume` this run, or train another run id"
            ) from None
        record_holder(fd)
        sweep_ray_leftovers(run_dir)
        yield


def record_ray(run_dir: Path) -> list[int]:
    """Record the processes of the local Ray instance this process started (none when it joined
    a cluster or Ray is not running here); returns their pids."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # set only where this process started Ray
    if not ray.is_initialized() or node is None or not getattr(node, "head", False):
        return []
    session = node.session_name
    me = os.getpid()
    processes = []
    for pid in _descendants(me):
        marker = _ray_marker(process_cmdline(pid), session)
        if marker:
            processes.append({"pid": pid, "start": process_start(pid), "marker": marker})
    record = {"session": session, "owner_pid": me, "owner_start": process_start(me), "processes": processes}
    atomic_write_text(Path(run_dir) / RAY_FILE, json.dumps(record, indent=1) + "\n")
    return [p["pid"] for p in processes]


def _ray_marker(cmdline: str, session: str) -> str | None:
    """What marks a process as this Ray session's: the session name in its command line (GCS,
    raylet, monitors), or, for the processes Ray retitles (`ray::DashboardAgent`,
    `ray::RuntimeEnvAgent`, workers), that title, found among the driver's descendants.

    >>> _ray_marker("raylet --session_dir=/tmp/ray/session_1_2", "session_1_2")
    'session_1_2'
    >>> _ray_marker("ray::DashboardAgent", "session_1_2"), _ray_marker("sleep 300", "session_1_2")
    ('ray::DashboardAgent', None)
    """
    if session in cmdline:
        return session
    if cmdline.startswith("ray::"):
        return cmdline.split()[0]
    return None


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def sweep_ray_leftovers(run_dir: Path, grace_s: float = RAY_GRACE_S) -> list[int]:
    """Stop the Ray processes a dead earlier owner of `run_dir` recorded and left running
    (same pid, same start time, its marker in its command line); returns their pids.
    Call only while holding the folder (`own_run`): then the recorder is not running."""
    path = Path(run_dir) / RAY_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except ValueError as err:
        log.warning("ignoring unreadable %s (%s)", path, err)
        return []
    if process_start(record.get("owner_pid", 0)) == record.get("owner_start"):
        return []  # its recorder lives (this very process, on a second session): its Ray is in use
    session = record.get("session") or "\0"
    left = [p["pid"] for p in record.get("processes", [])
            if process_start(p["pid"]) == p["start"] and p.get("marker", session) in process_cmdline(p["pid"])]
    if left:
        log.warning("stopping %d process(es) of Ray session %s left running by a killed earlier run of %s "
                    "(pids %s)", len(left), session, run_dir, ", ".join(map(str, left)))
        _stop(left, grace_s)
    path.unlink(missing_ok=True)
    return left


def _stop(pids: list[int], grace_s: float) -> None:
    """SIGTERM, then SIGKILL what is still alive after `grace_s`; returns once they are gone
    (a killed process with many threads takes a moment to exit), or after another `grace_s`."""
    starts = {pid: process_start(pid) for pid in pids}

    def alive(among: list[int]) -> list[int]:
        return [pid for pid in among if process_start(pid) is not None and process_start(pid) == starts[pid]]

    def wait(among: list[int]) -> list[int]:
        deadline = time.monotonic() + grace_s
        while among and time.monotonic() < deadline:
            time.sleep(0.2)
            among = alive(among)
        return among

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        pids = wait(alive(pids))
        if not pids:
            return
    log.warning("Ray leftovers %s did not exit within %gs of SIGKILL", pids, grace_s)
