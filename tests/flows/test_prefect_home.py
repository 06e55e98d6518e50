"""`run-flow` on any PREFECT_HOME: a fresh one, a missing folder, a nested missing folder all work
without Prefect's tracebacks or telemetry errors; one that cannot be a folder stops with a message.

Issue #62 item 16: a nested missing home used to end in "unable to open database file" tracebacks
(then a start-up timeout), and a fresh home printed the server's telemetry failing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.prefect_home import prefect_home_problem, prepare_prefect_home

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("relative", ["", "fresh", "missing/nested/deeper"])
def test_prepare_creates_the_home_at_any_depth(tmp_path, relative):
    home = tmp_path / relative
    env = {"PREFECT_HOME": str(home)}
    assert prepare_prefect_home(env) is None
    assert home.is_dir()
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_prepare_keeps_the_users_telemetry_choice(tmp_path):
    env = {"PREFECT_HOME": str(tmp_path), "PREFECT_SERVER_ANALYTICS_ENABLED": "true"}
    assert prepare_prefect_home(env) is None
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"


@pytest.mark.parametrize("relative", ["a-file", "a-file/below"])
def test_prepare_names_a_home_that_cannot_be_a_folder(tmp_path, relative):
    (tmp_path / "a-file").write_text("not a folder")
    home = tmp_path / relative
    problem = prepare_prefect_home({"PREFECT_HOME": str(home)})
    assert problem is not None and f"PREFECT_HOME={home}" in problem and "Set PREFECT_HOME" in problem
    # another environment's home says nothing of this process's own, which the commands check
    assert prefect_home_problem() is None


def _run_flow(prefect_home: Path, runs: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(prefect_home), PROMPT_R1_HOME=str(runs),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300")
    return subprocess.run([sys.executable, "-m", "flows.cli", "run-flow", "ingest", "-c", "configs/smoke.yaml"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_run_flow_on_a_nested_missing_home_runs_quietly(tmp_path):
    """The real command on a home two folders below any that exists: it runs, and says nothing of
    Prefect's database or telemetry (the only ERROR line a fresh home used to print)."""
    home = tmp_path / "not" / "there" / "prefect"
    done = _run_flow(home, tmp_path / "runs")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert (home / "prefect.db").is_file()
    for noise in ("Traceback", "unable to open database file", "telemetry", "ERROR"):
        assert noise not in out, (noise, out[-3000:])


def test_run_flow_on_a_home_that_is_a_file_says_so(tmp_path):
    (tmp_path / "prefect").write_text("not a folder")
    done = _run_flow(tmp_path / "prefect", tmp_path / "runs")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"PREFECT_HOME={tmp_path / 'prefect'} is a file, not a folder" in " ".join((done.stdout + done.stderr).split())
    assert "Traceback" not in done.stderr
