"""Integration: the Prefect flows on configs/smoke.yaml with real Ray, DuckDB and MLflow.

Runs under Prefect's test harness (a temporary Prefect API), a local Ray instance, a real
DuckDB file and a real MLflow sqlite store in a temporary PROMPT_R1_HOME.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def _client():
    import mlflow
    from mlflow import MlflowClient

    from tasks.tracking.runs import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    return MlflowClient()


def test_pipeline_flow_end_to_end_and_rerun(prefect_api, home, monkeypatch):
    import tasks.stages
    from flows.cli import rerun_mlflow_run
    from flows.pipeline import pipeline_flow
    from prompt_r1.data.pool import TrainingPool
    from warehouse.store import Warehouse

    calls = {"ingest": 0, "pool": 0}
    real_ingest, real_load = tasks.stages.ingest, TrainingPool.load.__func__

    def counted_ingest(*args, **kwargs):
        calls["ingest"] += 1
        return real_ingest(*args, **kwargs)

    def counted_load(cls, *args, **kwargs):
        calls["pool"] += 1
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(tasks.stages, "ingest", counted_ingest)
    monkeypatch.setattr(TrainingPool, "load", classmethod(counted_load))
    state = pipeline_flow("configs/smoke.yaml", return_state=True)
    assert state.is_completed(), state.message
    assert calls == {"ingest": 1, "pool": 1}, "a pipeline run ingests once and builds its training pool once"
    result = state.result()
    steps = 2

    client = _client()
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    by_name = {r.info.run_name: r for r in runs}
    parent = client.get_run(result["run_id"])
    assert parent.data.params["config_hash"] and parent.data.params["git_commit"]
    assert any(k.startswith("data_hash.") for k in parent.data.params)
    train_run = client.get_run(result["train"]["run_id"])
    assert train_run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    history = client.get_metric_history(train_run.info.run_id, "reward_mean")
    assert sorted(m.step for m in history) == list(range(steps))
    # validation of the untrained agent (0 updates) and of the final weights (`steps` updates)
    validation = client.get_metric_history(train_run.info.run_id, "val_reward")
    assert sorted(m.step for m in validation) == [0, steps]
    assert set(result["train"]["validation_before"]) == set(result["train"]["validation"]) >= {"val_reward"}
    for key in ("pg_loss", "kl", "clip_fraction", "grad_norm", "tokens_per_s", "response_length"):
        assert client.get_metric_history(train_run.info.run_id, key), key
    eval_run_id = result["evaluate"]["run_id"]
    env_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == eval_run_id]
    assert {r.data.tags["env_model"] for r in env_runs} == {"tiny"}
    method_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in {e.info.run_id for e in env_runs}]
    assert {r.data.tags["method"] for r in method_runs} >= {"direct", "cot", "agent:base", "agent:trained"}
    version = client.get_model_version_by_alias("prompt-r1-smoke", "champion")  # the config's own model
    assert version.run_id == train_run.info.run_id
    assert "eval-tiny-env" in by_name

    with Warehouse(home / "warehouse.duckdb") as wh:
        counts = wh.table_counts()
        assert counts["questions"] == 40
        n_traj = wh.query("SELECT COUNT(*) FROM trajectories WHERE run_id = ?", [train_run.info.run_id])[0][0]
        assert n_traj == steps * 2 * 2  # steps x questions x group
        assert wh.query("SELECT COUNT(*) FROM env_calls WHERE run_id = ?", [train_run.info.run_id])[0][0] > 0
        first = wh.eval_results(eval_run_id)
        assert {r["method"] for r in first} == {"direct", "cot", "agent:base", "agent:trained",
                                               "agent_only:base", "agent_only:trained"}
        assert len(first) == 6 * 4  # methods x sample datasets
    report = Path(result["evaluate"]["report"])
    assert report.exists() and (report.parent / "averages_by_environment.png").exists()

    again = rerun_mlflow_run(eval_run_id)
    with Warehouse(home / "warehouse.duckdb") as wh:
        second = wh.eval_results(again["run_id"])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert strip(second) == strip(first)
    assert client.get_run(again["run_id"]).data.tags["rerun_of"] == eval_run_id


def test_train_flow_rolls_out_ahead_at_max_staleness_1(prefect_api, home):
    """The Prefect flow at `rollout.max_staleness` 1: the next step's batch is queued by its own
    task before the update, every trajectory is at most one version old, and MLflow and DuckDB hold
    the ages (the schedule itself is checked stage by stage in test_staleness.py)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    from flows.train import train_flow
    from warehouse.store import Warehouse

    steps = 3
    result = train_flow("configs/smoke.yaml", {"rollout.max_staleness": 1, "train.steps": steps}, resume=False)
    run_id = result["run_id"]
    client = _client()
    for key, want in (("policy_age_max", [0.0, 1.0, 1.0]), ("policy_age_mean", [0.0, 1.0, 1.0])):
        assert [v for _, v in sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))] == want, key
    assert client.get_run(run_id).data.params["rollout.max_staleness"] == "1"
    with Warehouse(home / "warehouse.duckdb") as wh:
        versions = wh.query("SELECT step, MIN(policy_version), MAX(policy_version) FROM trajectories "
                            "WHERE run_id = ? GROUP BY 1 ORDER BY 1", [run_id])
    assert versions == [(0, 0, 0), (1, 0, 0), (2, 1, 1)]  # step s trains on version s - 1 after the first
    with get_client(sync_client=True) as prefect:
        submitted = prefect.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="rollout-submit")))
    assert len(submitted) == steps - 1  # one batch ahead of each update but the last
    assert Path(result["checkpoint"]).is_dir()


def test_train_flow_killed_mid_run_resumes_without_duplicates(home, tmp_path):
    """SIGKILL the training flow after its second checkpoint, run it again, count the steps."""
    from prompt_r1.learner.checkpoint import step_dir_name
    from warehouse.store import Warehouse

    steps = 4
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    cmd = [sys.executable, "-m", "flows.cli", "run-flow", "train", "-c", "configs/smoke.yaml",
           "--set", f"train.steps={steps}"]
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if list(home.glob(f"smoke/*/checkpoints/{step_dir_name(2)}")):
            break
        time.sleep(0.5)
    assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    client = _client()
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id], "tags.flow = 'train'")
    assert len(runs) == 1, "the second invocation must continue the killed run, not start another"
    run_id = runs[0].info.run_id
    assert sorted(m.step for m in client.get_metric_history(run_id, "reward_mean")) == list(range(steps))
    with Warehouse(home / "warehouse.duckdb") as wh:
        assert wh.steps_recorded(run_id) == list(range(steps))
        per_step = wh.query("SELECT step, COUNT(*) FROM trajectories WHERE run_id = ? GROUP BY 1 ORDER BY 1", [run_id])
        assert [n for _, n in per_step] == [4] * steps


def test_train_flow_continues_only_a_run_with_the_same_config_and_pool(home):
    """The flow continues by the rule every entry point uses (`find_resumable` over run folders),
    and only a run that is an unfinished MLflow training run of its experiment: the newest
    folder of a changed config or pool, a finished folder, a folder of `prompt-r1 train` (no
    MLflow run) and a folder whose MLflow run finished are passed over."""
    from types import SimpleNamespace

    from prompt_r1.config.experiment import load_config
    from prompt_r1.config.run_home import run_dir
    from prompt_r1.training.run_folder import write_record
    from tasks.tracking.runs import continued_run, setup_mlflow

    cfg = load_config("configs/smoke.yaml")
    pool = SimpleNamespace(hash="P")
    exp = setup_mlflow("smoke")
    client = _client()

    def run(status: str, started: str, config_hash: str = cfg.hash(), pool_hash: str = "P",
            finished: str | None = None, mlflow_run: bool = True) -> str:
        run_id = client.create_run(exp, tags={"flow": "train"}).info.run_id if mlflow_run else f"cli-{started}"
        if mlflow_run:
            client.set_terminated(run_id, status)
        write_record(run_dir("smoke", run_id), {"config_hash": config_hash, "pool_hash": pool_hash,
                                                "started_at": started, "finished_at": finished})
        return run_id

    same = run("FAILED", "2025-01-01")
    run("FAILED", "2025-01-02", pool_hash="Q")  # other training questions
    run("KILLED", "2025-01-03", config_hash="B")  # changed config
    run("FAILED", "2025-01-04", finished="2025-01-04")  # its folder says it finished
    run("FAILED", "2025-01-05", mlflow_run=False)  # a run of `prompt-r1 train`
    run("FINISHED", "2025-01-06")  # its MLflow run finished
    assert continued_run(exp, cfg, pool) == same
    assert continued_run(exp, cfg, SimpleNamespace(hash="R")) is None
    write_record(run_dir("smoke", same), {"config_hash": cfg.hash(), "pool_hash": "P", "started_at": "2025-01-01",
                                          "finished_at": "2025-02-01"})
    assert continued_run(exp, cfg, pool) is None
