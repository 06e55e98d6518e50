"""The soak (`benchmarks/soak`): its fault plan and checks (fast), and ten minutes of it (slow).

The slow test runs `python -m benchmarks.soak.run --minutes 10` as a user would: a real Prefect
server and process worker, the pipeline and train deployments on interval schedules, SmolLM2 on
a managed vLLM server behind the fault proxy, and the plan's nine faults. It asserts what
BENCHMARKS.md records for the hour: every check passes, and the faults really landed (a check
that passes because nothing happened would prove nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.soak import checks
from benchmarks.soak.plan import ENV_KINDS, KINDS, MINUTES_PER_FAULT, WINDOW_S, make_plan, overlapping

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("minutes", [5, 10, 60, 180])
def test_the_plan_is_a_pure_function_of_its_seed_with_every_kind_in_bounds(minutes):
    for seed in range(40):
        plan = make_plan(seed, minutes)
        assert plan == make_plan(seed, minutes) and plan == sorted(plan, key=lambda f: (f.at_s, f.kind))
        per_kind = max(1, round(minutes / MINUTES_PER_FAULT))
        assert sorted(f.kind for f in plan) == sorted(k for k in KINDS for _ in range(per_kind))
        for fault in plan:  # after the warm-up, before the tail (the kill moved into a window: within the soak)
            assert 60 <= fault.at_s <= minutes * 60 - (0 if fault.kind == "rollout_actor" else 60)
            low, high = WINDOW_S[fault.kind]
            assert low <= fault.duration_s <= high or fault.kind == "rollout_actor"
        slow = min((f for f in plan if f.kind == "env_slow"), key=lambda f: f.at_s)
        kills = [f for f in plan if f.kind == "rollout_actor" and slow.at_s <= f.at_s <= slow.end_s]
        assert kills and (slow, kills[0]) in overlapping(plan)  # an actor dies while the environment is slow
    assert make_plan(0, minutes) != make_plan(1, minutes)
    assert set(ENV_KINDS) < set(KINDS)


def run(state: str, message: str = "", error_logs: int = 0, seconds: float | None = 10.0, start: str | None = "t",
        deployment: str = "pipeline", **extra) -> dict:
    return {"id": extra.get("id", state), "name": extra.get("name", state), "state": state, "message": message,
            "error_logs": error_logs, "seconds": seconds, "start_time": start, "deployment": deployment, **extra}


def test_runs_accounted_needs_a_reason_for_every_failure_and_no_run_left_running():
    good = [run("COMPLETED"), run("FAILED", "Flow run encountered an exception", error_logs=2),
            run("CRASHED", "Flow run infrastructure exited with non-zero status code -9."),
            run("SCHEDULED", start=None, due=True)]
    check = checks.runs_accounted(good)
    assert check.passed and check.counts["completed"] == 1 and check.counts["failed_with_reason"] == 2
    assert check.counts["due_never_started"] == 1
    assert not checks.runs_accounted(good + [run("FAILED", "", name="silent")]).passed
    assert not checks.runs_accounted(good + [run("RUNNING", name="stuck")]).passed
    assert not checks.runs_accounted([run("SCHEDULED", start=None)]).passed  # nothing ran: nothing shown


def test_time_lost_counts_failed_runs_whole_and_slow_completed_runs_over_the_fastest():
    runs = [run("COMPLETED", seconds=100), run("COMPLETED", seconds=160), run("CRASHED", seconds=40),
            run("COMPLETED", seconds=50, deployment="train"), run("FAILED", seconds=None)]
    assert checks.time_lost(runs)["seconds_lost"] == 60 + 40


def test_flow_runs_are_matched_to_the_training_runs_whose_metrics_they_logged():
    windows = {"crashed": (100.0, 200.0), "continued": (300.0, 400.0), "fresh": (500.0, 600.0), "idle": (700.0, 800.0)}
    runs, resumed = checks.match_runs(windows, {"a": [150.0, 350.0], "b": [550.0, 560.0]})
    assert runs == {"crashed": "a", "continued": "a", "fresh": "b"} and resumed == {"a"}


def test_no_secret_finds_the_key_in_any_file_and_only_there(tmp_path):
    (tmp_path / "a.log").write_text("nothing here")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "b.db").write_bytes(b"\x00\x01sk-soak-123\x00")
    check = checks.no_secret("sk-soak-123", [tmp_path], 0, set())
    assert not check.passed and check.counts["hits"] == [str(tmp_path / "deep" / "b.db")]
    assert checks.no_secret("sk-soak-123", [tmp_path], 0, {tmp_path / "deep" / "b.db"}).passed


@pytest.mark.slow
def test_ten_minutes_of_faults_pass_every_check(tmp_path, smollm2_path, tiny_model_path):
    from prompt_r1.models.bundled import resolve_model

    resolve_model("tiny-protocol")  # built here, once, not inside the first scheduled run
    out = tmp_path / "soak"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.soak.run", "--minutes", "10", "--seed", "0",
                           "--out", str(out), "--models", os.environ["PROMPT_R1_MODELS"],
                           "--pipeline-every", "120", "--train-every", "180", "--drain-minutes", "12"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60 * 60)
    result = json.loads((out / "result.json").read_text())
    lines = "\n".join(result.get("checks", {}).get("lines", [])) or done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, lines
    found = {c["name"]: c["counts"] for c in result["checks"]["checks"]}
    assert all(c["passed"] for c in result["checks"]["checks"]), lines
    # the faults landed: a quiet ten minutes would pass every check and show nothing
    landed = [e for e in result["events"] if "skipped" not in e and "error" not in e]
    assert len(landed) >= 7, result["events"]
    assert result["requests"]["proxied"] > 0  # the environment was used through the proxy
    accounted = found["runs finished or failed with a reason"]
    assert accounted["started"] >= 2 and accounted["completed"] >= 1, accounted
    assert found["no environment error scored"]["calls"] > 0
    assert found["nothing left behind"]["processes"] == []


@pytest.mark.parametrize("minutes", ["nan", "inf", "-inf", "-5", "0", "1.99", "ten", ""])
def test_a_soak_length_that_is_no_plan_is_an_argument_error(minutes, tmp_path) -> None:
    """`--minutes` NaN, infinite, negative or under the warm-up and tail (issue 62 item 15): exit 2 naming it,
    no traceback."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.soak.run", "--plan-only", f"--minutes={minutes}",
                             "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 2 and "--minutes must be a finite number" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
