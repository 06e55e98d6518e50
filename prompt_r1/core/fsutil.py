"""Publishing files and folders atomically: built under a temporary name, then renamed into place.

A checkpoint, an exported agent, a cached model folder or a run record is either absent or
complete, never half-written, even when a process dies mid-write or two processes build the same
thing at once. `atomic_dir` and `atomic_write_text` are the one implementation of that pattern.
`file_lock` is the one inter-process lock: the kernel's `flock`, released when its holder
exits however it exits, so no lock is ever stale. A holder writes who it is into the lock file
(`record_holder`), so a process that finds it busy can say who holds it (`holder_text`) and
whether that process is stopped (`holder_stopped`: Ctrl-Z), rather than wait in silence.

`check_output_folder` is the one rule for a folder a user names as an output (`export OUT_DIR`,
`evaluate --out`): new or empty, or holding an earlier output of the same kind (its marker file),
replaced only with `--overwrite`; anything else is refused, so a mistyped folder never loses files.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prompt_r1.core.failures import UserError


class OutputFolderError(UserError, FileExistsError):
    """An output folder that holds files this command may not replace; nothing was changed."""


def check_output_folder(folder: str | os.PathLike, overwrite: bool, marker: str, what: str) -> None:
    """Refuse `folder` unless it is new, empty, or an earlier `what` (it holds `marker`), the
    latter only with `overwrite`.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "notes.txt").write_text("mine")
    >>> check_output_folder(d, True, ".m", "report")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    prompt_r1.core.fsutil.OutputFolderError: /... is not empty and is not an earlier report (no .m); nothing was changed: give a new or empty folder
    """
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OutputFolderError(f"{folder} exists and is not a plain folder; give a new or empty folder")
    if not folder.exists() or not any(folder.iterdir()):
        return
    if not (folder / marker).is_file():
        raise OutputFolderError(f"{folder} is not empty and is not an earlier {what} (no {marker}); "
                                "nothing was changed: give a new or empty folder")
    if not overwrite:
        raise OutputFolderError(f"{folder} holds an earlier {what}; pass --overwrite to replace it")


def _temp_beside(target: Path, kind: str) -> Path:
    """A fresh hidden name next to `target` (same filesystem, so the rename is atomic)."""
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextmanager
def atomic_dir(target: str | os.PathLike, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; when the block ends without error it
    becomes `target`, and on an error it is deleted (`target` untouched).

    An existing `target`: with `replace`, it is moved aside, the new folder renamed in (the old
    one is put back if that fails) and then deleted; without it, the first folder to arrive wins
    and this one is discarded (concurrent builders of the same cache entry).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> with atomic_dir(root / "out") as tmp:
    ...     _ = (tmp / "a.txt").write_text("1")
    >>> sorted(p.name for p in root.iterdir()), (root / "out" / "a.txt").read_text()
    (['out'], '1')
    >>> with atomic_dir(root / "out") as tmp:  # already there: the first one wins
    ...     _ = (tmp / "a.txt").write_text("2")
    >>> (root / "out" / "a.txt").read_text(), len(list(root.iterdir()))
    ('1', 1)
    >>> with atomic_dir(root / "out", replace=True) as tmp:
    ...     _ = (tmp / "b.txt").write_text("3")
    >>> sorted(p.name for p in (root / "out").iterdir()), len(list(root.iterdir()))
    (['b.txt'], 1)
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(target, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        if replace and target.exists():
            _swap_in(tmp, target)
        else:
            try:
                tmp.rename(target)
            except OSError:
                if not target.exists():  # not a lost race: a real failure
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, target: Path) -> None:
    """Replace `target` by `tmp`: the old one is moved aside first, put back if the rename
    fails, and deleted once the new one is in place."""
    aside = _temp_beside(target, "old")
    target.rename(aside)
    try:
        tmp.rename(target)
    except OSError:
        aside.rename(target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file so readers see the old or the new content, never part of one.

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "run.json"
    >>> atomic_write_text(f, "{}"); atomic_write_text(f, "[]"); f.read_text(), len(list(f.parent.iterdir()))
    ('[]', 1)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path, "tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy a file so that `dst` appears whole or not at all (a reader never opens half of it).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / "a.db").write_bytes(b"123")
    >>> atomic_copy_file(root / "a.db", root / "sub" / "b.db"); sorted(p.name for p in (root / "sub").iterdir())
    ['b.db']
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(dst, "tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class LockBusy(OSError):
    """`file_lock` waited its `wait_s` and another process still holds the lock."""


def record_holder(fd: int) -> None:
    """Write this process (pid, host, start time, command) into the lock file `fd` it holds."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)


def read_holder(path: str | os.PathLike) -> dict[str, Any]:
    """What `record_holder` wrote into the lock file `path`; {} when nothing (yet) or unreadable."""
    try:
        holder = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def holder_text(holder: dict[str, Any]) -> str:
    """The holder of a lock in words.

    >>> holder_text({"pid": 7, "host": "h", "started_at": "t", "command": "prompt-r1 train"})
    'pid 7 on host h, started t (`prompt-r1 train`)'
    >>> holder_text({})
    'another process (it is just starting)'
    """
    if not holder.get("pid"):  # it has the lock but has not written its name yet
        return "another process (it is just starting)"
    return (f"pid {holder['pid']} on host {holder.get('host', '?')}, started {holder.get('started_at', '?')}"
            f" (`{holder.get('command', '?')}`)")


def holder_stopped(holder: dict[str, Any]) -> bool:
    """Whether the holder is a process on this host that is stopped (Ctrl-Z, SIGSTOP, a debugger):
    it holds the lock but will not go on until someone resumes it."""
    if not holder.get("pid") or holder.get("host") != socket.gethostname():
        return False
    try:
        stat = Path(f"/proc/{int(holder['pid'])}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat[stat.rindex(")") + 2:][:1] in ("T", "t")  # the state follows the command name in parentheses


@contextmanager
def file_lock(path: str | os.PathLike, wait_s: float, poll_s: float = 0.05) -> Iterator[int]:
    """Hold an exclusive `flock` on `path` (created if missing, never deleted: deleting a lock
    file lets a third process lock a fresh file while a second still holds the old one) for the
    block; yields the open descriptor. Waits up to `wait_s` (0: one try), then raises `LockBusy`.

    >>> import tempfile
    >>> lock = Path(tempfile.mkdtemp()) / "x.lock"
    >>> with file_lock(lock, wait_s=0):
    ...     with file_lock(lock, wait_s=0.1):  # another open file: refused as another process would be
    ...         pass
    Traceback (most recent call last):
    ...
    prompt_r1.core.fsutil.LockBusy: ...x.lock is held by another process (waited 0.1s)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusy(f"{path} is held by another process (waited {wait_s:g}s)") from None
                time.sleep(poll_s)
        yield fd
    finally:
        os.close(fd)  # releases the lock
