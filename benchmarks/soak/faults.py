"""The soak's fault injectors: one per kind of `plan.KINDS`, each bounded in time.

Processes are found by the soak's tag in their environment (`services.TAG_VAR`), which every
process the soak starts passes on to its children: flow runs, their Ray's raylet and workers, the
rollout actors (`ray::RolloutWorker`) and learner ranks (`ray::LearnerRank`). Nothing outside
the soak is ever touched.

The disk: as root, where `mount` works, the runs home is a small ext4 filesystem in a file
(`DiskFull.setup`, loop-mounted, removed at the end) and a fault fills it with a ballast file for
its window; elsewhere the fault lowers the flow-run processes' RLIMIT_FSIZE (`prlimit`) for the
window, so their writes past a small size fail with EFBIG. `DiskFull.method` says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.soak.services import TAG_VAR

log = logging.getLogger(__name__)

FSIZE_LIMIT = 64 * 1024  # bytes a flow run may write to one file during a `disk_full` fault (fallback)


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries `tag`, this process excluded."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
    return found


SESSION = re.compile(r"(/[^\s=,'\"]*?/session_\d{4}-\d\d-\d\d_[\w.-]+?)(?=/|\s|$)")


def ray_sessions(tag: str) -> set[Path]:
    """The Ray session folders the soak's tagged processes name on their command lines (the GCS,
    raylet and agents name their session's folder): where Ray really writes, whatever the default.

    >>> SESSION.findall("raylet --session_dir=/scratch/t/ray/session_2026-12-07_01-02-03_456_77 --x=1")
    ['/scratch/t/ray/session_2026-12-07_01-02-03_456_77']
    """
    found: set[Path] = set()
    for proc in tagged(tag):
        with contextlib.suppress(psutil.Error):
            found |= {Path(m) for m in SESSION.findall(" ".join(proc.cmdline()))}
    return found


def ray_temp_root(env: dict[str, str]) -> Path:
    """Ray's temp folder for processes started with `env`, by Ray's own rule
    (`ray._common.utils.get_default_ray_temp_dir`): `$RAY_TMPDIR`, else `$TMPDIR` on Linux, else /tmp; then `ray`.

    >>> ray_temp_root({"TMPDIR": "/scratch/t"}), ray_temp_root({"RAY_TMPDIR": "/r", "TMPDIR": "/t"}), ray_temp_root({})
    (PosixPath('/scratch/t/ray'), PosixPath('/r/ray'), PosixPath('/tmp/ray'))
    """
    return Path(env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp") / "ray"


def describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"pid {proc.pid} {' '.join(proc.cmdline())[:120]}"
    return f"pid {proc.pid}"


def title(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        cmd = proc.cmdline()
        return cmd[0] if cmd else ""
    return ""


def flow_runs(tag: str) -> list[psutil.Process]:
    """The flow-run processes (`python -m prefect.engine`) of the soak."""
    out = []
    for proc in tagged(tag):
        with contextlib.suppress(psutil.Error):
            if "prefect.engine" in proc.cmdline():
                out.append(proc)
    return out


def flow_run_id(proc: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        return proc.environ().get("PREFECT__FLOW_RUN_ID")
    return None


def kill_titled(tag: str, prefix: str, runs: set[str | None] | None = None) -> dict[str, Any] | None:
    """kill -9 the first tagged process whose title starts with `prefix` (of one of the flow
    `runs`, when given); what was killed, or None."""
    for proc in tagged(tag):
        if title(proc).startswith(prefix) and (runs is None or flow_run_id(proc) in runs):
            hit = {"pid": proc.pid, "title": title(proc), "flow_run": flow_run_id(proc)}
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                return hit
    return None


def kill_rollout_actor(tag: str) -> dict[str, Any] | None:
    """kill -9 a rollout actor while it rolls out for a flow run that can still finish: one whose
    process still has the worker that started it (a run orphaned by a killed worker crashes with
    it, and a restart there would show nothing)."""
    live = set()
    for proc in flow_runs(tag):
        with contextlib.suppress(psutil.Error):
            parent = proc.parent()
            if parent is not None and parent.environ().get(TAG_VAR) == tag:
                live.add(flow_run_id(proc))
    return kill_titled(tag, "ray::RolloutWorker.rollout", live)


def kill_learner(tag: str) -> dict[str, Any] | None:
    """A learner rank when the learner runs in Ray (`train.world_size` > 1), else the flow-run
    process that holds the learner, while it trains (it has a rollout actor)."""
    hit = kill_titled(tag, "ray::LearnerRank")
    if hit is not None:
        return {**hit, "target": "learner rank"}
    training = {flow_run_id(p) for p in tagged(tag) if title(p).startswith("ray::RolloutWorker")}
    for proc in flow_runs(tag):
        if flow_run_id(proc) in training:
            hit = {"pid": proc.pid, "title": "python -m prefect.engine", "flow_run": flow_run_id(proc),
                   "target": "flow-run process holding the learner (train.world_size 1)"}
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                return hit
    return None


class EnvFaults:
    """Windows of environment faults on one `ChaosProxy`; overlapping windows combine (the highest
    rate, every fault kind, the longest latency)."""

    SETTINGS = {"env_fail": (0.5, ("500", "429"), (0.0, 0.0)),
                "env_slow": (0.1, ("hang",), (1.0, 4.0)),
                "env_malformed": (0.3, ("malformed",), (0.0, 0.0))}

    def __init__(self, proxy: Any):
        self.proxy, self.active, self._lock = proxy, [], threading.Lock()

    def _apply(self) -> None:
        kinds = [self.SETTINGS[k] for k in self.active]
        self.proxy.rate = max((k[0] for k in kinds), default=0.0)
        self.proxy.faults = tuple(dict.fromkeys(f for k in kinds for f in k[1])) or ("500",)
        self.proxy.latency_s = max((k[2] for k in kinds), default=(0.0, 0.0))

    def start(self, kind: str) -> None:
        with self._lock:
            self.active.append(kind)
            self._apply()

    def stop(self, kind: str) -> None:
        with self._lock:
            self.active.remove(kind)
            self._apply()


class DiskFull:
    """The runs home's disk, filled for a window (see the module docstring)."""

    def __init__(self, home: Path, image: Path, size_mib: int):
        self.home, self.image, self.size_mib = home, image, size_mib
        self.method = "fsize"
        self.ballast = home / ".soak-ballast"
        self._limited: list[tuple[int, tuple[int, int]]] = []

    def setup(self) -> str:
        """Mount a `size_mib` ext4 filesystem on the (empty) runs home where this machine allows it."""
        self.home.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or any(self.home.iterdir()):
            return self.method
        try:
            subprocess.run(["truncate", "-s", f"{self.size_mib}M", str(self.image)], check=True, timeout=30)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], check=True, timeout=120,
                           capture_output=True)
            subprocess.run(["mount", "-o", "loop", str(self.image), str(self.home)], check=True, timeout=60,
                           capture_output=True)
            self.method = "loop"
        except (subprocess.SubprocessError, OSError) as err:
            log.warning("no loop mount (%s): disk_full faults lower RLIMIT_FSIZE instead", err)
            self.image.unlink(missing_ok=True)
        return self.method

    def start(self, tag: str) -> dict[str, Any]:
        if self.method == "loop":
            stat = os.statvfs(self.home)
            free = stat.f_bavail * stat.f_frsize
            with open(self.ballast, "wb") as f:
                with contextlib.suppress(OSError):  # filled to the last block: that is the point
                    os.posix_fallocate(f.fileno(), 0, free)
            stat = os.statvfs(self.home)
            return {"method": "loop", "free_bytes_after": stat.f_bavail * stat.f_frsize}
        for proc in flow_runs(tag):
            with contextlib.suppress(psutil.Error, OSError):
                old = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (FSIZE_LIMIT, old[1]))
                self._limited.append((proc.pid, old))
        return {"method": "fsize", "processes": [pid for pid, _ in self._limited]}

    def stop(self) -> None:
        self.ballast.unlink(missing_ok=True)
        for pid, old in self._limited:
            with contextlib.suppress(psutil.Error, OSError):
                resource.prlimit(pid, resource.RLIMIT_FSIZE, old)
        self._limited = []

    def teardown(self, keep_image: bool = False) -> None:
        """Unmount and remove the filesystem (bounded: a lazy unmount if it is still busy); with
        `keep_image` the image file stays (`mount -o loop IMAGE DIR` shows the runs again)."""
        self.stop()
        if self.method != "loop":
            return
        for _ in range(10):
            if subprocess.run(["umount", str(self.home)], capture_output=True, timeout=60).returncode == 0:
                break
            time.sleep(2)
        else:
            subprocess.run(["umount", "-l", str(self.home)], capture_output=True, timeout=60)
        if not keep_image:
            self.image.unlink(missing_ok=True)


def hold_mlflow_lock(db: Path, seconds: float) -> dict[str, Any]:
    """Another writer: an exclusive transaction on `db` for `seconds` (waiting at most 30 s for it)."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        t0 = time.monotonic()
        conn.execute("BEGIN EXCLUSIVE")
        waited = time.monotonic() - t0
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        return {"waited_s": round(waited, 1), "held_s": seconds}
    finally:
        conn.close()
