"""Child processes that die with the process that started them, and records to find any that did not.

A managed vLLM server holds about 1 GB and a port. When its parent dies without running its
cleanup (`kill -9`, the OOM killer), nothing in the parent can stop the server, so:

- `spawn_guarded(cmd, ...)` first starts this file as a watchdog leading a new process group,
  then starts `cmd` inside that group. The watchdog polls its parent pid; once the parent is
  gone it SIGTERMs the group and SIGKILLs whatever is left after a grace period. Polling rather
  than `prctl(PR_SET_PDEATHSIG)`: that signal fires when the *thread* that forked exits (Prefect
  runs tasks in worker threads), and it reaches only the direct child, not the engine processes
  vLLM forks on a GPU.
- `write_record` leaves one JSON file per server (pid and start time, group, port, parent pid
  and start time, host) in a folder; `sweep_leftovers(folder)` stops servers whose parent is
  gone (their watchdog was killed too, e.g. by `kill -9` of both) and drops records of servers
  that have exited. Start times, not bare pids, identify processes, so a reused pid is never
  mistaken for a server or for its live parent.

Standard library only: the watchdog runs this file by path (`python -I -S`), without the package.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

log = logging.getLogger("prompt_r1.env.server_guard")

POLL_S = 0.5  # how often the watchdog checks its parent: the server outlives it by about this
ORPHAN_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay for a server whose parent is gone


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after "pid (comm) ": fields[0] is the state (field 3 of proc(5))."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def process_start(pid: int) -> int | None:
    """Start time of a live (not zombie) process in clock ticks since boot; None if there is none."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22: starttime


def process_cmdline(pid: int) -> str:
    """The command line of `pid`, arguments joined by spaces ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc; falls back to `killpg(pgid, 0)`."""
    proc = Path("/proc")
    if not proc.is_dir():  # pragma: no cover - not Linux
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_group(pgid: int, grace_s: float, spare: tuple[int, ...] = ()) -> bool:
    """SIGTERM a process group, SIGKILL it if members other than `spare` remain after `grace_s`.

    Returns True when SIGKILL was needed.
    """
    deadline = time.monotonic() + grace_s
    signal_group(pgid, signal.SIGTERM)
    while time.monotonic() < deadline:
        if not set(group_members(pgid)) - set(spare):
            return False
        time.sleep(0.2)
    return signal_group(pgid, signal.SIGKILL)


def watch(parent: int, poll_s: float = POLL_S, grace_s: float = ORPHAN_GRACE_S) -> None:
    """The watchdog: wait until `parent` is no longer this process's parent, then stop the group."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the others
    stop_group(os.getpgrp(), grace_s, spare=(os.getpid(),))


def spawn_guarded(cmd: list[str], *, stdout: IO[bytes] | int | None = None, env: dict[str, str] | None = None,
                  poll_s: float = POLL_S, grace_s: float = ORPHAN_GRACE_S,
                  ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Start `cmd` in a new process group led by a watchdog; returns (process, watchdog).

    The group id is `watchdog.pid`: stopping the group (`stop_group`) stops both. Output of
    `cmd` goes to `stdout` (stderr too); stdin is closed.
    """
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid()), str(poll_s), str(grace_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    try:
        # Same session as this process (setpgid cannot cross sessions), own group: Ctrl-C in a
        # terminal reaches the foreground group only, so this process decides when to stop it.
        process = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, process_group=watchdog.pid)
    except BaseException:
        watchdog.kill()
        watchdog.wait()
        raise
    return process, watchdog


# -- records of running servers ----------------------------------------------------------------

@dataclass(frozen=True)
class ServerRecord:
    pid: int
    start: int  # process_start(pid) when recorded
    pgid: int
    port: int
    parent_pid: int
    parent_start: int
    host: str
    label: str  # what the server is, for messages ("vLLM smollm2-135m-instruct (env)")
    marker: str  # text its command line must still contain (case-insensitive) to be stopped


def write_record(folder: Path, process: subprocess.Popen, pgid: int, port: int, label: str, marker: str) -> Path:
    """Record a running server so a later start can find it if this process dies first."""
    folder.mkdir(parents=True, exist_ok=True)
    record = ServerRecord(process.pid, process_start(process.pid) or 0, pgid, port, os.getpid(),
                          process_start(os.getpid()) or 0, socket.gethostname(), label, marker)
    path = folder / f"server-{port}-{process.pid}.json"
    path.write_text(json.dumps(asdict(record), indent=1))
    return path


State = Literal["elsewhere", "gone", "owned", "orphan"]


def record_state(record: ServerRecord) -> State:
    """`elsewhere` (another host), `gone` (exited, pid reused), `owned` (its parent lives), `orphan`."""
    if record.host != socket.gethostname():
        return "elsewhere"
    if process_start(record.pid) != record.start or record.marker.lower() not in process_cmdline(record.pid).lower():
        return "gone"
    if process_start(record.parent_pid) == record.parent_start:
        return "owned"
    return "orphan"


def sweep_leftovers(folder: Path, grace_s: float = ORPHAN_GRACE_S) -> list[ServerRecord]:
    """Stop orphaned servers recorded in `folder`, drop records of exited ones.

    Returns the records of servers still running for a live parent (to name who holds a port).
    """
    owned = []
    for path in sorted(folder.glob("server-*.json")) if folder.is_dir() else []:
        try:
            record = ServerRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            log.warning("ignoring unreadable server record %s (%s); delete it if it stays", path, err)
            continue
        state = record_state(record)
        if state == "owned":
            owned.append(record)
        elif state == "orphan":
            log.warning("stopping a leftover %s (pid %d, port %d): the process that started it (pid %d) is "
                        "gone; record %s", record.label, record.pid, record.port, record.parent_pid, path)
            try:
                same_group = os.getpgid(record.pid) == record.pgid
            except ProcessLookupError:
                same_group = False
            if same_group:
                stop_group(record.pgid, grace_s)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
        if state in ("orphan", "gone"):
            path.unlink(missing_ok=True)
    return owned


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
