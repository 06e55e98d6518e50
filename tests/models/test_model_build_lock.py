"""A bundled model is built once when several processes ask for it at the same time.

`make test` runs two workers that share one model cache, and two runs on one machine share
`runs/models`: the second asker waits on the build lock beside the folder, then uses what the
first built; a lock held past the deadline is an error naming the lock file, never a hang (a holder that dies
releases it: `file_lock` is an flock).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prompt_r1.core.fsutil import file_lock
from prompt_r1.models import bundled


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPT_R1_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def lock_of(name: str):
    folder = bundled.bundled_folder(name)
    return file_lock(folder.with_name(folder.name + ".lock"), wait_s=0)


def test_a_second_asker_waits_for_the_build_then_uses_it(empty_cache):
    results = []
    with lock_of("tiny"):  # another process is building it
        asker = threading.Thread(target=lambda: results.append(bundled.resolve_model("tiny")))
        asker.start()
        time.sleep(1.0)
        assert asker.is_alive() and not results
        built = bundled.build_tiny_model(bundled.bundled_folder("tiny"))  # the other process's build
        stamp = (built / "config.json").stat().st_mtime_ns
    asker.join(timeout=60)
    assert results == [built]
    assert (built / "config.json").stat().st_mtime_ns == stamp  # used, not built again


def test_a_lock_held_past_the_deadline_is_an_error_naming_it(empty_cache, monkeypatch):
    monkeypatch.setattr(bundled, "BUILD_LOCK_TIMEOUT_S", 0.3)
    with lock_of("tiny"):
        started = time.monotonic()
        with pytest.raises(bundled.ModelLoadError, match=r"tiny-bytes\.lock.*stop that process"):
            bundled.resolve_model("tiny")
    assert time.monotonic() - started < 10
    assert not (empty_cache / "tiny-bytes").exists()


def test_a_built_model_or_a_local_folder_takes_no_lock(empty_cache, tmp_path):
    built = bundled.build_tiny_model(bundled.bundled_folder("tiny"))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with lock_of("tiny"):  # held: a resolve that took it would time out
        assert bundled.resolve_model("tiny") == built
        assert bundled.resolve_model(str(folder)) == folder.resolve()


HOLDER = """
import sys, time
from prompt_r1.core.fsutil import file_lock, record_holder
with file_lock(sys.argv[1], wait_s=0) as fd:
    record_holder(fd)
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def other_builder(empty_cache):
    """Another process holding the tiny model's build lock, as a builder does (its name in the lock)."""
    import subprocess
    import sys

    folder = bundled.bundled_folder("tiny")
    folder.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder.with_name(folder.name + ".lock"))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    import signal

    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.parametrize("stop", ["SIGSTOP", "SIGTSTP"])
def test_a_stopped_builder_is_named_at_once_not_waited_for(other_builder, monkeypatch, stop):
    import signal

    monkeypatch.setattr(bundled, "BUILD_LOCK_CHECK_S", 0.2)
    other_builder.send_signal(getattr(signal, stop))
    time.sleep(0.5)
    state = Path(f"/proc/{other_builder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    if state != "T":  # the kernel discards SIGTSTP to an orphaned process group (no terminal, as in CI)
        pytest.skip(f"{stop} did not stop the holder here (state {state}): nothing to name")
    started = time.monotonic()
    with pytest.raises(bundled.ModelLoadError, match=rf"pid {other_builder.pid} .*stopped.*kill -CONT {other_builder.pid}"):
        bundled.resolve_model("tiny")
    assert time.monotonic() - started < 10  # not BUILD_LOCK_TIMEOUT_S


def test_a_waiting_asker_says_once_whom_it_waits_for_and_the_deadline_names_it(other_builder, monkeypatch, caplog):
    import logging

    monkeypatch.setattr(bundled, "BUILD_LOCK_CHECK_S", 0.1)
    monkeypatch.setattr(bundled, "BUILD_LOCK_TIMEOUT_S", 1.0)
    with caplog.at_level(logging.WARNING, logger=bundled.__name__):
        with pytest.raises(bundled.ModelLoadError, match=rf"pid {other_builder.pid} on host .* has held the build lock"):
            bundled.resolve_model("tiny")
    said = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert len(said) == 1 and f"pid {other_builder.pid}" in said[0] and "-c" in said[0]
