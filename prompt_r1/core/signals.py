"""The one SIGTERM rule: SIGTERM stops the process as Ctrl-C does (and Ctrl-C stops it even
where a parent shell started it with SIGINT ignored).

`interrupt_on_sigterm` raises `KeyboardInterrupt` in the main thread, so `finally` blocks and
context managers run (run records, managed servers, Ray actors) instead of the process dying at
once. The CLI installs it before any command (`cli.common._main`).

Libraries started later may take SIGTERM over. `ray.init` does twice: in Python (a handler that
calls `sys.exit`) and, when its driver connects, in C++ (absl's failure-signal handler, which
prints a stack dump and ends the process with SIGABRT, so no Python clean-up runs).
`sigterm_kept` wraps such a call and hands SIGTERM back afterwards: to the handler the caller had
installed, or to `interrupt_on_sigterm` when the caller had none (Python's default). An interrupt
whose exception the library's code swallowed is raised again when the call returns: Ray's
`sys.exit` handler can fire inside an at-fork callback (logging's lock release after Ray forks a
server), where Python prints "Exception ignored" and goes on, and the driver would then run on.
Python's C-level handler notes every signal it takes on the wakeup fd (`signal.set_wakeup_fd`),
whichever Python handler then runs, so the block listens there.

`interrupts_held` is the other direction: clean-up that must finish once begun (stopping Ray)
takes no second Ctrl-C for a while.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator


def interrupt_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM handler: raise `KeyboardInterrupt`, as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


def install_sigterm_interrupt() -> bool:
    """Make SIGTERM raise `KeyboardInterrupt`, and SIGINT too where the process inherited it ignored
    (a background job of a non-interactive shell does, and Python then never raises on Ctrl-C or
    `kill -INT`, so a watcher's stop would be lost); only the main thread can (Python's rule). True
    if installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
    with _signals_noted() as noted:
        try:
            yield
        finally:
            handler = interrupt_on_sigterm if previous in (signal.SIG_DFL, None) else previous
            signal.signal(signal.SIGTERM, handler)
    for signum in sorted({signal.SIGINT, signal.SIGTERM} & noted):
        handler = signal.getsignal(signum)  # what the signal would have run, had the call not swallowed it
        if callable(handler):
            handler(signum, None)


@contextlib.contextmanager
def _signals_noted() -> Iterator[set[int]]:
    """The signals Python's C-level handler took while the block ran (main thread only), read from
    a wakeup fd set for the block; a wakeup fd set before (asyncio's) gets the same bytes after."""
    noted: set[int] = set()
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield noted
    finally:
        signal.set_wakeup_fd(before)
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := reader.recv(4096):
                data += chunk
        reader.close()
        writer.close()
        noted.update(data)
        if before != -1 and data:
            with contextlib.suppress(OSError):
                os.write(before, data)


@contextlib.contextmanager
def interrupts_held(what: str, patience_s: float) -> Iterator[None]:
    """Run clean-up that a second Ctrl-C must not cut short (stopping Ray: cut, it leaves its
    agents running for minutes): Ctrl-C and SIGTERM within `patience_s` say that `what` is under
    way and are otherwise ignored; one after that interrupts as usual, so a stuck clean-up never
    holds the terminal for good. Afterwards both signals go back to their handlers. Off the main
    thread nothing is done.

    >>> import os, signal, time
    >>> before = signal.getsignal(signal.SIGINT)  # whatever the process had (a test runner may set its own)
    >>> with interrupts_held("a test", patience_s=60):
    ...     os.kill(os.getpid(), signal.SIGINT); time.sleep(0.1)
    >>> signal.getsignal(signal.SIGINT) is before
    True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    deadline = time.monotonic() + patience_s
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def held(signum: int, frame: object) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KeyboardInterrupt(f"signal {signum}")
        print(f"{what}: under way, ignoring this interrupt for up to {left:.0f} s more", file=sys.stderr, flush=True)

    for sig in previous:
        signal.signal(sig, held)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
