"""A deadline on every call of a task's own scorer, and no way for it to end the process.

A dataset scorer or turn scorer is user code run inside training and evaluation; the realistic
failures are a judge call with no timeout of its own (the run then waits forever, in silence) and a
`sys.exit()` (or `argparse` meant for the file's own script use), which used to end `evaluate` with
the scorer's exit status and no report. `call_with_deadline` runs one call in a daemon thread and
waits at most the deadline (`data.scorer_timeout_s`, set once per process by `set_deadline`), so
a hung call becomes an error naming the scorer and the question; a call that raises `SystemExit`
becomes one too. A timed-out call's thread is left behind (Python cannot stop a thread); the run
stops on the error, and the daemon thread does not keep the process alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

DEFAULT_DEADLINE_S = 60.0
_deadline_s = [DEFAULT_DEADLINE_S]


def set_deadline(seconds: float) -> None:
    """The deadline of every scorer call in this process from now on (`data.scorer_timeout_s`)."""
    if not seconds > 0:
        raise ValueError(f"a scorer deadline must be > 0 seconds, got {seconds!r}")
    _deadline_s[0] = float(seconds)


def deadline() -> float:
    return _deadline_s[0]


def call_with_deadline(call: Callable[[], Any], where: str, error: type[Exception],
                       timeout_s: float | None = None) -> Any:
    """`call()`'s result, its exception as it is, or `error` when it runs past the deadline (or
    `timeout_s`, for a batch of calls) or calls `sys.exit`; `where` names the scorer and the question.

    >>> call_with_deadline(lambda: 0.5, "scorer `f` for question 'q'", RuntimeError)
    0.5
    >>> import sys
    >>> call_with_deadline(lambda: sys.exit(3), "scorer `f` for question 'q'", RuntimeError)
    Traceback (most recent call last):
    ...
    RuntimeError: scorer `f` for question 'q' called sys.exit(3); a scorer returns a score (or raises), it never ends the process
    """
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as err:  # handed to the caller's thread, SystemExit included
            outcome.append((False, err))

    worker = threading.Thread(target=run, name="prompt-r1-scorer-call", daemon=True)
    limit = _deadline_s[0] if timeout_s is None else timeout_s
    worker.start()
    worker.join(limit)
    if not outcome:
        raise error(f"{where} did not return within {limit:g}s (data.scorer_timeout_s); give the calls it "
                    "makes (an LLM judge, a web request) a timeout of their own, or raise data.scorer_timeout_s")
    ok, value = outcome[0]
    if ok:
        return value
    if isinstance(value, SystemExit):
        raise error(f"{where} called sys.exit({value.code!r}); a scorer returns a score (or raises), it never ends "
                    "the process") from None
    raise value
