"""A run folder's life: which run it is, so resuming continues only the same run, and the one
process that owns it while it trains, so a killed owner's Ray leftovers are stopped.

**Identity.** `run_dir/run.json` records the config hash, a hash of the training pool's question ids (train
and validation, in order: the data position is an index into them), when the run started and
when it finished. A resume compares them with the current config and pool: a changed config
or pool is refused unless forced (and then logged loudly and recorded in the file), and a
finished run is never continued. Every entry point picks the run to resume from these records
(`find_resumable`); the Prefect flow also keeps the same hashes as MLflow tags.

**Ownership.** Two `train` processes on the same run folder (even with different warehouses, even with
`--resume`) would both write `checkpoints/` and `agent/`. `own_run` takes an exclusive
`flock` on `run_dir/owner.lock` (`core.fsutil.file_lock`) for the whole session and writes the
holder (pid, host, start time, command) into it; a second process is refused with
`RunBusyError` naming that holder. The kernel releases the lock when its process dies, however it dies (`kill -9`
included), so a lock is never stale and there is nothing to clean up. The file stays: deleting
a lock file lets a third process lock a new file while the second still holds the old one.

A local Ray instance the driver started (`ray.init(address="local")`) mostly dies with it, but
its dashboard and runtime-env agents outlive a `kill -9` of the driver by a minute or more
(about 230 MB), and a SIGTERM while `ray.init` runs ends the driver under Ray's own handler
with no Python clean-up at all. So the owner writes `run_dir/ray.json` as it takes the folder
(its pid, start time, and the time), before anything can start Ray; the next owner, holding
the lock and so knowing the recorder is dead, stops every process of a Ray session it started
that is still running (`sweep_ray_leftovers`).

A process belongs to such a session when its command line or one of its open files names it:
Ray names a session `session_<date>_<time>_<microseconds>_<driver pid>`, puts that name in the
command line of its GCS, raylet and monitors, and every process it starts (the agents Ray
retitles `ray::DashboardAgent`, workers) writes its logs under `/tmp/ray/<session>/`. Only
sessions named after the recorder's pid and dated after its record count, and only processes
that started after it did, so another Ray instance on the machine is never touched; where the
recorder's pid now belongs to another live process, nothing is (that process may run Ray).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import LockBusy, atomic_write_text, file_lock, holder_text, read_holder, record_holder
from prompt_r1.env.server_guard import process_cmdline, process_start

if TYPE_CHECKING:
    from prompt_r1.config.experiment import Config

log = logging.getLogger(__name__)

RUN_FILE = "run.json"


class ResumeError(UserError, ValueError):
    """A run that must not be continued (changed config, finished, or already present)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")  # orders runs


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ResumeError(f"{path} is not valid JSON ({err}); fix or remove the run folder") from None


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Write `run.json` atomically (a crash leaves the old or the new file, never half of one)."""
    atomic_write_text(Path(run_dir) / RUN_FILE, json.dumps(record, indent=2) + "\n")


def _has_checkpoint(run_dir: Path) -> bool:
    from prompt_r1.learner.checkpoint import latest_checkpoint

    return latest_checkpoint(Path(run_dir) / "checkpoints") is not None


def changed_settings(run_dir: Path, config: Config) -> list[str]:
    """`key: old -> new` for each setting in which `config` differs from the config the run's newest
    checkpoint was written with (its `config.yaml`), so a refused resume names what changed, not
    two hashes. Left out, as from the hash: the layout keys (`prompt_r1.config.identity`: the
    learner's layout, where evaluation's engines run, where the run is tracked), and keys the
    checkpoint's config does not have (added to the project after it). Empty when there is no
    readable checkpoint config."""
    import yaml

    from prompt_r1.config.experiment import Config, flatten
    from prompt_r1.config.identity import layout_paths
    from prompt_r1.learner.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
    try:
        old = flatten(yaml.safe_load((ckpt / "config.yaml").read_text()) or {}) if ckpt is not None else {}
    except (OSError, yaml.YAMLError, AttributeError):
        return []
    new = config.flat()
    layout = set(layout_paths(Config))
    return [f"{key}: {old[key]!r} -> {new.get(key)!r}" for key in sorted(old)
            if not layout & _prefixes(key) and old[key] != new.get(key)]


def _prefixes(key: str) -> set[str]:
    """A dotted key and the sections above it: `a.b.c` -> {`a`, `a.b`, `a.b.c`}."""
    parts = key.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def mismatches(record: dict[str, Any], config_hash: str, pool: str, settings: list[str] | None = None) -> list[str]:
    """What differs between a run's record and the current settings (empty = the same run);
    `settings` (`changed_settings`) say which keys made the config hash differ.

    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "a", "p")
    []
    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "b", "q")
    ['config hash a -> b', 'training pool hash p -> q']
    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "b", "p", ["train.lr: 1e-06 -> 1e-05"])
    ['config hash a -> b (changed: train.lr: 1e-06 -> 1e-05)']
    """
    diffs = []
    if record.get("config_hash") != config_hash:
        shown = f" (changed: {', '.join(settings[:8])}{', ...' if len(settings) > 8 else ''})" if settings else ""
        diffs.append(f"config hash {record.get('config_hash')} -> {config_hash}{shown}")
    if record.get("pool_hash") != pool:
        diffs.append(f"training pool hash {record.get('pool_hash')} -> {pool}")
    return diffs


def changed_scorers(recorded: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The scorers whose code differs from a run's record (`core.scorer_code`); a record of an
    older version, with no `scorers`, has nothing to compare.

    >>> changed_scorers({"m:f": "a1"}, {"m:f": "b2", "n:g": "c3"})
    ['scorer code m:f a1 -> b2', 'scorer code n:g (none) -> c3']
    >>> changed_scorers(None, {"m:f": "b2"})
    []
    """
    if recorded is None:
        return []
    return [f"scorer code {spec} {recorded.get(spec, '(none)')} -> {current.get(spec, '(none)')}"
            for spec in sorted(set(recorded) | set(current)) if recorded.get(spec) != current.get(spec)]


def open_run(run_dir: Path, config_name: str, config_hash: str, pool: str, resume: bool,
             force: bool = False, config: Config | None = None,
             scorers: dict[str, str] | None = None) -> dict[str, Any]:
    """Start a new run in `run_dir` or check that resuming it is allowed; returns its record.

    Raises ResumeError for: an existing run without `resume`; a finished run; a run whose
    config, pool or scorer code (`scorers`: spec -> code hash, `data.scorers.scorer_fingerprints`)
    changed (unless `force`; with `config`, the message names the changed keys); checkpoints with no
    record (unless `force`).
    """
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    scorers = dict(scorers or {})
    if record is None and not _has_checkpoint(run_dir):
        record = {"config_name": config_name, "config_hash": config_hash, "pool_hash": pool,
                  "scorers": scorers, "started_at": _now(), "finished_at": None, "forced": []}
        write_record(run_dir, record)
        return record
    if not resume:
        raise ResumeError(f"run folder {run_dir} already holds a run; resume it (--resume) or "
                          "choose another run id")
    if record is None:
        record = {"config_name": config_name, "config_hash": None, "pool_hash": None,
                  "started_at": _now(), "finished_at": None, "forced": []}
        diffs = [f"no {RUN_FILE} records which config and pool its checkpoints were trained with"]
    else:
        changed = record.get("config_hash") != config_hash and config is not None
        diffs = mismatches(record, config_hash, pool, changed_settings(run_dir, config) if changed else None)
        diffs += changed_scorers(record.get("scorers"), scorers)
    if record.get("finished_at"):
        raise ResumeError(f"run {run_dir.name} finished at {record['finished_at']}; a finished run is "
                          "never resumed: start a new run (drop --resume / choose another run id)")
    if diffs and not force:
        raise ResumeError(f"refusing to resume run {run_dir.name} under a changed config: "
                          f"{'; '.join(diffs)}. Start a new run (drop --resume), or pass --force to "
                          "continue its checkpoints under the new settings")
    if diffs:
        log.warning("FORCED RESUME of run %s under changed settings (%s): its checkpoints were "
                    "trained with the old ones", run_dir.name, "; ".join(diffs))
        record["forced"] = [*record.get("forced", []), {"at": _now(), "from_config_hash": record.get("config_hash"),
                                                        "from_pool_hash": record.get("pool_hash"),
                                                        "from_scorers": record.get("scorers")}]
        record.update(config_hash=config_hash, pool_hash=pool, scorers=scorers)
        write_record(run_dir, record)
    elif record.get("scorers") is None and scorers:  # a run of an older version: recorded from now on
        record["scorers"] = scorers
        write_record(run_dir, record)
    return record


def mark_finished(run_dir: Path) -> None:
    """Record that the run reached its last step and exported its agent: never resumed again."""
    record = read_record(run_dir) or {}
    record["finished_at"] = _now()
    write_record(run_dir, record)


def find_resumable(runs_root: Path, config_hash: str, pool: str,
                   accept: Callable[[str], str | None] | None = None) -> tuple[str | None, list[str]]:
    """The newest unfinished run under `runs_root` (one config name's folder) with this config
    and pool, and why each newer or other candidate was passed over: the one rule for which run
    continues, used by `prompt-r1 train --resume`, `prompt_r1.train` and the train flow. `accept`
    (run id -> a reason to pass it over, or None) lets a caller add its own condition (the flow:
    the run is an unfinished MLflow training run)."""
    runs_root = Path(runs_root)
    candidates = []
    for folder in runs_root.iterdir() if runs_root.is_dir() else []:
        if not folder.is_dir():
            continue
        record = read_record(folder)
        if record is None:
            if _has_checkpoint(folder):
                candidates.append(("", folder.name, f"{folder.name}: no {RUN_FILE} (run of an older version)"))
            continue
        if record.get("finished_at"):
            reason = f"{folder.name}: finished at {record['finished_at']}"
        else:
            diffs = mismatches(record, config_hash, pool)
            if not diffs and accept is not None and (refused := accept(folder.name)):
                diffs = [refused]
            reason = f"{folder.name}: {'; '.join(diffs)}" if diffs else ""
        candidates.append((record.get("started_at") or "", folder.name, reason))
    skipped = []
    for _, name, reason in sorted(candidates, reverse=True):
        if not reason:
            return name, skipped
        skipped.append(reason)
    return None, skipped

LOCK_FILE = "owner.lock"
RAY_FILE = "ray.json"
RAY_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay for a killed run's Ray leftovers
RAY_INIT_WINDOW_S = 600.0  # how long after the record `ray.init` may name its session


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
        record_owner(run_dir)
        yield


def record_owner(run_dir: Path) -> None:
    """Record this process as the one that may start Ray for `run_dir` (see the module's doc)."""
    me = os.getpid()
    record = {"owner_pid": me, "owner_start": process_start(me), "recorded_at": time.time()}
    with contextlib.suppress(OSError, ValueError):  # this process owned it before: its Ray may be older
        earlier = json.loads((Path(run_dir) / RAY_FILE).read_text())
        if (earlier.get("owner_pid"), earlier.get("owner_start")) == (me, record["owner_start"]):
            record["recorded_at"] = min(record["recorded_at"], float(earlier["recorded_at"]))
    atomic_write_text(Path(run_dir) / RAY_FILE, json.dumps(record, indent=1) + "\n")


def session_matcher(record: dict):
    """A function telling whether a text (a command line, an open file's path) names a Ray
    session the recorded owner started: named after its pid and dated no earlier than its record.

    >>> at = datetime(2026, 1, 2, 3, 4, 0).timestamp()
    >>> names = session_matcher({"owner_pid": 77, "recorded_at": at})
    >>> names("/tmp/ray/session_2026-01-02_03-04-05_123456_77/logs/raylet.out"), names("ray::IDLE")
    (True, False)
    >>> names("raylet --session_name=session_2026-01-02_03-04-05_123456_177")  # another driver's
    False
    >>> names("session_2026-01-01_23-59-59_1_77")  # dated before the record: an earlier process of that pid
    False
    """
    pattern = re.compile(r"session_(\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d)_\d+_%d(?!\d)" % int(record["owner_pid"]))
    since = float(record.get("recorded_at", 0.0)) - 1.0  # the session's stamp has whole seconds

    def names(text: str) -> bool:
        return any(datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S").timestamp() >= since
                   for stamp in pattern.findall(text))
    return names


def _open_files(pid: int) -> list[str]:
    """Where `pid`'s open file descriptors point ([] where that cannot be read)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    targets = []
    for fd in fds:
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


RAY_BINARIES = ("raylet", "gcs_server")
RAY_PACKAGE = ("site-packages/ray/", "dist-packages/ray/")


def is_ray_program(argv: list[str]) -> bool:
    """Whether a command line is a program of Ray's own: a worker (`ray::...`), its raylet or GCS
    server, or a Python process running a module of the installed `ray` package (dashboard, agents,
    monitors). A user's `tail -f`, `less`, editor or log shipper on a session's logs is none of them,
    even when its arguments name the session.

    >>> is_ray_program(["ray::RolloutWorker.rollout"])
    True
    >>> is_ray_program(["/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--session_name=s"])
    True
    >>> is_ray_program(["/v/bin/python", "-u", "/v/lib/python3.11/site-packages/ray/dashboard/agent.py", "--log-dir=x"])
    True
    >>> is_ray_program(["tail", "-f", "/tmp/ray/session_2026-01-02_03-04-05_1_77/logs/raylet.out"])
    False
    """
    if not argv:
        return False
    if argv[0].startswith("ray::") or Path(argv[0]).name in RAY_BINARIES:
        return True
    return any(marker in arg for arg in argv[:4] for marker in RAY_PACKAGE)


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def session_processes(record: dict) -> list[int]:
    """The live processes of the Ray sessions the recorded owner started: Ray's own programs
    (`is_ray_program`), started no earlier than it, naming such a session in their command line or
    an open file's path. Another program that merely reads the session's logs is never one."""
    names, since, me = session_matcher(record), record.get("owner_start") or 0, os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        start = process_start(pid)
        if start is None or start < since or not is_ray_program(_argv(pid)):
            continue
        if names(process_cmdline(pid)) or any(names(target) for target in _open_files(pid)):
            found.append(pid)
    return found


def sweep_ray_leftovers(run_dir: Path, grace_s: float = RAY_GRACE_S) -> list[int]:
    """Stop the processes of the Ray sessions a dead earlier owner of `run_dir` started and left
    running; returns their pids. Call only while holding the folder (`own_run`): then the
    recorder is not running."""
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
    if not isinstance(record.get("owner_pid"), int) or process_start(record["owner_pid"]) is not None:
        path.unlink(missing_ok=True)  # no owner named, or its pid now runs another process: that one's Ray is its own
        return []
    left = session_processes(record)
    if left:
        log.warning("stopping %d process(es) of Ray session %s left running by a killed earlier run of %s: %s",
                    len(left), f"session_*_{record['owner_pid']}", run_dir,
                    "; ".join(f"pid {pid} `{process_cmdline(pid)[:120]}`" for pid in left))
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
