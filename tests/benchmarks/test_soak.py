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


class _Warehouse:
    """The two tables `checks.env_exercised` reads, in a real DuckDB, with the store's `query`."""

    def __init__(self, trajectories: list[tuple], calls: list[tuple]):
        import duckdb

        self.con = duckdb.connect()
        self.con.execute("CREATE TABLE trajectories (run_id TEXT, step INT, question_id TEXT, group_index INT)")
        self.con.execute("CREATE TABLE env_calls (run_id TEXT, step INT, question_id TEXT, group_index INT, error TEXT)")
        self.con.executemany("INSERT INTO trajectories VALUES (?, ?, ?, ?)", trajectories)
        self.con.executemany("INSERT INTO env_calls VALUES (?, ?, ?, ?, ?)", calls)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        return self.con.execute(sql, params or []).fetchall()


def test_env_exercised_wants_every_question_to_call_and_a_fault_to_hit_a_call():
    traj = [("r", s, q, g) for s in range(2) for q in ("a", "b") for g in range(2)]
    calls = [("r", s, q, 1, None) for s in range(2) for q in ("a", "b")] + [("r", 0, "a", 0, "HTTP 500")]
    check = checks.env_exercised(_Warehouse(traj, calls), {"fail": 3, "hang": 1}, min_calls=4)
    assert check.passed, check.summary
    assert check.counts["calls"] == 5 and check.counts["failed_calls"] == 1 and check.counts["injected"] == 4
    assert check.counts["questions"] == 4 and check.counts["questions_without_call"] == 0
    silent = _Warehouse(traj, [c for c in calls if (c[1], c[2]) != (1, "b")])
    assert checks.env_exercised(silent, {"fail": 3}, 2).counts["questions_without_call"] == 1
    assert not checks.env_exercised(silent, {"fail": 3}, 2).passed       # one question never asked
    assert not checks.env_exercised(_Warehouse(traj, calls), {}, 4).passed  # no fault reached a call
    assert not checks.env_exercised(_Warehouse(traj, calls), {"fail": 1}, 6).passed  # too few calls


def test_crash_recovery_wants_every_crash_retried_and_each_retry_to_resume_its_training_run():
    runs = [run("COMPLETED", id="plain", attempts=1), run("COMPLETED", id="retried", name="retried", attempts=2),
            run("FAILED", id="exhausted", attempts=4, message="crashed 3 times"),
            run("FAILED", id="bad-config", attempts=1, message="config error", error_logs=1)]
    resumes = {"retried": [(2, 2)], "plain": []}
    check = checks.crash_recovery(runs, resumes, max_attempts=3)
    assert check.passed, check.summary
    assert check.counts["retried"] == 2 and check.counts["resumed_at"]["retried"] == [2]
    crashed = runs + [run("CRASHED", id="left", name="left", attempts=1)]
    assert checks.crash_recovery(crashed, resumes, 3).counts["crashed_not_retried"] == ["left"]
    assert not checks.crash_recovery(crashed, resumes, 3).passed
    # a retry that started its training run over (no continuation by attempt 2 or later) fails
    assert not checks.crash_recovery(runs, {"retried": [(0, 1)]}, 3).passed
    assert checks.crash_recovery(runs, {"retried": [(0, 1)]}, 3).counts["completed_not_resumed"] == ["retried"]


def test_the_secret_check_scans_ray_s_real_temp_folder(tmp_path):
    """Ray writes under $RAY_TMPDIR, else $TMPDIR, else /tmp (then `ray/`): a key in a session log there
    is found, and would be missed by a scan of /tmp/ray alone."""
    from benchmarks.soak.faults import ray_temp_root
    from ray._common.utils import get_default_ray_temp_dir

    real = ray_temp_root({"TMPDIR": str(tmp_path)})
    log = real / "session_2026-12-07_01-02-03_456789_77" / "logs" / "worker.err"
    log.parent.mkdir(parents=True)
    log.write_text("api_key=sk-soak-123")
    check = checks.no_secret("sk-soak-123", list(real.glob("session_*")), 0, set())
    assert not check.passed and check.counts["hits"] == [str(log)]
    assert real != Path("/tmp/ray")
    for env in ({"TMPDIR": str(tmp_path)}, {"RAY_TMPDIR": "/r", "TMPDIR": str(tmp_path)}, {}):  # Ray's own rule
        old = {k: os.environ.pop(k, None) for k in ("RAY_TMPDIR", "TMPDIR")}
        try:
            os.environ.update(env)
            assert ray_temp_root(env) == Path(get_default_ray_temp_dir())
        finally:
            for k, v in old.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


def test_the_soak_config_scaffolds_a_real_call_for_every_sample_training_question(tmp_path):
    """The soak's config validates with the scaffold, and the project's own scaffold check (gold answers
    never said) accepts its turn for every question of the sample data, which is what the runs train on."""
    from benchmarks.soak.run import write_config
    from prompt_r1 import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.rollout.scaffold import check_scaffold, load_scaffold
    from warehouse.store import Warehouse

    write_config(tmp_path / "soak.yaml", "http://127.0.0.1:9/v1", "m")
    cfg = load_config(tmp_path / "soak.yaml")
    assert cfg.rollout.scaffold.members == cfg.rollout.group_size - 1 >= 1
    with Warehouse(tmp_path / "w.duckdb") as wh:
        ingest(wh, [ROOT / "data" / "sample"])
        questions = wh.questions()
    assert len(questions) >= 16
    assert check_scaffold(load_scaffold(cfg.rollout.scaffold.fn), questions) == len(questions)


def test_a_crashed_run_s_retry_is_kept_when_the_schedules_stop():
    """Stopping the schedules deletes the runs not yet started, but not a retry (a Scheduled run
    that ran before, or `AwaitingRetry`): it resumes in the drain. And the modules' examples hold."""
    import doctest
    from types import SimpleNamespace

    from benchmarks.soak import calls, faults, prefect_api

    assert prefect_api.is_retry(SimpleNamespace(run_count=1, state_name="Scheduled"))
    assert prefect_api.is_retry(SimpleNamespace(run_count=0, state_name="AwaitingRetry"))
    assert not prefect_api.is_retry(SimpleNamespace(run_count=0, state_name="Scheduled"))
    for module in (calls, faults, prefect_api):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_a_run_s_training_run_is_read_from_its_own_line_only_and_retried_kills_are_left_out():
    """"not continuing unfinished training run X" (another run's, passed over) names no run of this one;
    an actor killed in a flow run that then crashed and was retried need not be in MLflow."""
    from benchmarks.soak.prefect_api import TRAINING_LINE

    assert TRAINING_LINE.match("continuing unfinished training run abc (config hash h)").group(2) == "abc"
    assert TRAINING_LINE.match("not continuing unfinished training run abc: it belongs to ...") is None
    kill = {"kind": "rollout_actor", "flow_run": "f"}
    assert not checks.actor_restarts([kill], {}, {"f": "t"}, {"f"}).passed
    assert checks.actor_restarts([kill], {}, {"f": "t"}, {"f"}, retried_flows={"f"}).passed
    assert checks.actor_restarts([kill], {"t": 1.0}, {"f": "t"}, {"f"}).passed
