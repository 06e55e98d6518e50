"""The GPU check's runner: each part's commands under the part's deadline, their output in one log.

Its own file so that the parts (`check_parts`) and the driver (`gpu_check`) both import it, and
neither imports the other for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Runner:
    """Runs each part's commands under the part's deadline, logging their output to one file."""

    def __init__(self, log: Path, env: dict[str, str], budget_s: float, caps: dict[str, float]):
        self.log = log.open("a")
        self.env, self.caps = env, caps
        self.deadline = time.monotonic() + budget_s

    def start(self, part: str) -> None:
        """Part `part` begins: its commands share its cap (and the whole run's deadline)."""
        self.part_deadline = min(self.deadline, time.monotonic() + self.caps[part])

    def left(self, part: str) -> float:
        return max(0.0, self.part_deadline - time.monotonic())

    def run(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
            watch=None) -> subprocess.CompletedProcess:
        """`cmd` with its output in the log; past `timeout` its process group is killed (TimeoutError).
        `watch()`, polled every 0.2 s, may stop it early by returning True (then SIGINT)."""
        self.log.write(f"\n$ {' '.join(cmd)}\n")
        self.log.flush()
        with tempfile.TemporaryFile("w+") as output:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=output, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            end, stopped, killed = time.monotonic() + timeout, False, False
            while proc.poll() is None:
                if watch is not None and not stopped and watch():
                    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the CLI stops cleanly
                    stopped = True
                    # said in the log, so a run that went on anyway shows whether the stop was sent
                    self.log.write(f"[watch: SIGINT sent to process group {proc.pid} at {time.strftime('%H:%M:%S')}]\n")
                    self.log.flush()
                if time.monotonic() > end:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed = True
                    break
                time.sleep(0.2)
            output.seek(0)
            text = output.read()
        self.log.write(text)
        self.log.flush()
        if killed:
            raise TimeoutError(f"{' '.join(cmd[1:4])} ran past its {timeout:.0f} s; output tail: {text[-600:]}")
        return subprocess.CompletedProcess(cmd, proc.returncode, text, "")

    def checked(self, cmd: list[str], timeout: float, **kw) -> str:
        done = self.run(cmd, timeout, **kw)
        if done.returncode:
            raise RuntimeError(f"exit {done.returncode}: {done.stdout.strip()[-800:]}")
        return done.stdout
