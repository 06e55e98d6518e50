"""`core.signals`: an interrupt that a wrapped library call swallowed still stops the caller.

Ray's `sys.exit` SIGTERM handler can fire inside an at-fork callback, where Python ignores the
exception and `ray.init` goes on; `sigterm_kept` must then run the caller's handler itself.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from prompt_r1.core.signals import interrupt_on_sigterm, sigterm_kept


def swallowing_handler(signum, frame):
    """A library's handler whose exception never reaches the caller (as in an at-fork callback)."""


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # Python runs handlers between bytecodes of the main thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_the_call_swallowed_is_raised_when_it_returns(signum):
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with sigterm_kept():
            signal.signal(signal.SIGTERM, swallowing_handler)
            signal.signal(signal.SIGINT, swallowing_handler)
            deliver(signum)
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the library hands Ctrl-C back
            finished = True
    assert finished, "the call itself ran to its end: only afterwards is the interrupt raised"
    assert signal.getsignal(signal.SIGTERM) is interrupt_on_sigterm


def test_a_caller_that_ignores_sigterm_still_ignores_it():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with sigterm_kept():
        signal.signal(signal.SIGTERM, swallowing_handler)
        deliver(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_call_with_no_interrupt_returns_quietly_and_its_own_errors_pass_through():
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    with sigterm_kept():
        signal.signal(signal.SIGTERM, swallowing_handler)
    with pytest.raises(ValueError, match="the call's own"):
        with sigterm_kept():
            raise ValueError("the call's own error")
    assert signal.set_wakeup_fd(-1) == -1, "the block's wakeup fd is left behind"


def test_a_wakeup_fd_set_before_gets_the_blocks_signals_too():
    import socket
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.signal(signal.SIGTERM, swallowing_handler)
    before = signal.set_wakeup_fd(writer.fileno())
    try:
        with sigterm_kept():
            deliver(signal.SIGTERM)
        assert signal.set_wakeup_fd(before) == writer.fileno()
        assert reader.recv(16) == bytes([signal.SIGTERM])
    finally:
        reader.close()
        writer.close()
