"""How far a rollout has got: trajectories done out of the batch, on stderr while it runs.

A training step's rollout takes minutes on a CPU and used to say nothing until it ended. Each
`rollout_batch` call can take a `RolloutProgress`, advanced once per finished trajectory. On a
terminal it is a tqdm bar (stderr, cleared at the end). Anywhere else (a log file, a Prefect
worker, a Ray actor, whose output Ray forwards to the driver line by line) a bar's carriage
returns would garble the log, so it writes a plain line at most every `every_s` seconds
(`rollout step 3: 12/40 trajectories done, 35 s`) and, when it wrote any, a last one at the end;
a rollout quicker than `every_s` writes nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


class RolloutProgress:
    """Trajectories done of `total`, shown on `stream` (default stderr) as described above.

    >>> import io
    >>> clock = iter([0.0, 4.0, 11.0, 12.0, 25.0]).__next__
    >>> out = io.StringIO()
    >>> p = RolloutProgress(4, "rollout step 0", stream=out, clock=clock)
    >>> for _ in range(4):
    ...     p.advance()
    >>> p.close()
    >>> print(out.getvalue(), end="")
    rollout step 0: 2/4 trajectories done, 11 s
    rollout step 0: 4/4 trajectories done, 25 s
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, bar_interval_s: float = 0.5):
        self.total, self.label, self.every_s, self.clock = total, label, every_s, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.started = 0, clock()
        self._written = -1  # `done` when the last plain line was written
        self._last_line: float | None = None  # when a plain line was last written (None: never)
        self._bar: Any = None
        if _is_tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="traj", file=self.stream, leave=False,
                             dynamic_ncols=True, mininterval=bar_interval_s, miniters=1)

    def advance(self, n: int = 1) -> None:
        """`n` more trajectories finished."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = self.clock()
        if now - (self._last_line if self._last_line is not None else self.started) >= self.every_s:
            self._line(now)

    def close(self) -> None:
        """The end: the bar goes; a last line when lines were written (and that one was not it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            return
        if self._last_line is not None and self._written != self.done:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.stream.write(f"{self.label}: {self.done}/{self.total} trajectories done, {now - self.started:.0f} s\n")
        self.stream.flush()
        self._last_line, self._written = now, self.done

    def __enter__(self) -> RolloutProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream: plain lines
        return False
