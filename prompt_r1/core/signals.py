"""The one SIGTERM rule: SIGTERM stops the process as Ctrl-C does.

`interrupt_on_sigterm` raises `KeyboardInterrupt` in the main thread, so `finally` blocks and
context managers run (run records, managed servers, Ray actors) instead of the process dying at
once. The CLI installs it before any command (`cli.common._main`).

Libraries started later may take SIGTERM over. `ray.init` does twice: in Python (a handler that
calls `sys.exit`) and, when its driver connects, in C++ (absl's failure-signal handler, which
prints a stack dump and ends the process with SIGABRT, so no Python clean-up runs).
`sigterm_kept` wraps such a call and hands SIGTERM back afterwards: to the handler the caller had
installed, or to `interrupt_on_sigterm` when the caller had none (Python's default).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


def interrupt_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM handler: raise `KeyboardInterrupt`, as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


def install_sigterm_interrupt() -> bool:
    """Make SIGTERM raise `KeyboardInterrupt`; only the main thread can (Python's rule). True if installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    return True


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """Run code that may take SIGTERM over (`ray.init`); afterwards SIGTERM goes to the handler
    installed before, or raises `KeyboardInterrupt` if there was none. `signal.signal` is called
    again even when Python's record of the handler looks unchanged: a C library can replace the
    process's handler without Python knowing. Off the main thread nothing is done.

    >>> import signal
    >>> before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    >>> with sigterm_kept():
    ...     _ = signal.signal(signal.SIGTERM, lambda *a: None)  # a library's own handler
    >>> signal.getsignal(signal.SIGTERM) is interrupt_on_sigterm
    True
    >>> _ = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    >>> with sigterm_kept():
    ...     _ = signal.signal(signal.SIGTERM, lambda *a: None)
    >>> signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    True
    >>> _ = signal.signal(signal.SIGTERM, before)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        handler = interrupt_on_sigterm if previous in (signal.SIG_DFL, None) else previous
        signal.signal(signal.SIGTERM, handler)
