"""Crash recovery of scheduled runs (`tasks.recovery`): which training run a retry continues, the
automation that retries a crash, and (slow) a deployment's flow run killed mid-training with
SIGKILL, retried as Prefect's automation does, resuming from its last checkpoint under a real
Prefect API.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.recovery import AUTOMATION_NAME, OWNER_TAG, RESUMES_TAG, ScheduledRun, parse_resumes

ROOT = Path(__file__).resolve().parents[2]


def test_the_automation_retries_only_a_deployment_run_s_crash():
    """Crashed, and only Crashed (a bad config ends Failed: never retried), of a flow run related to a
    deployment (a subflow has no worker to run it again); the action schedules the same flow run."""
    from prefect.client.schemas.objects import StateType

    from tasks.recovery import retry_crashed_automation

    automation = retry_crashed_automation()
    trigger, (action,) = automation.trigger, automation.actions
    assert automation.name == AUTOMATION_NAME
    assert trigger.expect == {"prefect.flow-run.Crashed"} and trigger.posture == "Reactive"
    assert trigger.threshold == 1 and not trigger.after
    assert trigger.model_dump(mode="json")["match_related"] == {"prefect.resource.role": "deployment"}
    assert action.type == "change-flow-run-state" and action.state == StateType.SCHEDULED
    assert action.name == "AwaitingRetry" and action.force


def _runs(home):
    from prompt_r1.config.experiment import load_config
    from prompt_r1.config.run_home import run_dir
    from prompt_r1.training.run_folder import write_record
    from tasks.tracking.runs import setup_mlflow, tracking_uri

    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking_uri())
    cfg = load_config("configs/smoke.yaml")
    exp = setup_mlflow("smoke")
    client = MlflowClient()

    def run(started: str, owner: str | None = None) -> str:
        tags = {"flow": "train", **({OWNER_TAG: owner} if owner else {})}
        run_id = client.create_run(exp, tags=tags).info.run_id
        client.set_terminated(run_id, "FAILED")
        write_record(run_dir("smoke", run_id), {"config_hash": cfg.hash(), "pool_hash": "P", "started_at": started})
        return run_id

    return cfg, exp, run


def test_a_retry_continues_its_own_training_run_and_no_other(home):
    """The newest unfinished run of the config is another scheduled run's: the plain rule passes
    over it, a retry of flow run A takes A's (older) run, and a retry never takes an unowned run."""
    from tasks.tracking.runs import continued_run, open_training_run

    cfg, exp, run = _runs(home)
    pool = SimpleNamespace(hash="P")
    unowned = run("2025-01-01")
    mine = run("2025-01-02", owner="A")
    theirs = run("2025-01-03", owner="B")
    assert continued_run(exp, cfg, pool) == unowned           # B's and A's runs are theirs to continue
    assert continued_run(exp, cfg, pool, owner="A") == mine   # A's own, newer than the unowned one
    assert continued_run(exp, cfg, pool, owner="B") == theirs
    assert continued_run(exp, cfg, pool, owner="C", mine_only=True) is None  # a retry takes nothing else
    # the pipeline's train subflow (resume=False): a first attempt starts a new run, a retry its own
    active, continued = open_training_run(exp, cfg, pool, resume=False, scheduled=ScheduledRun("A", 2))
    with active as opened:
        assert continued and opened.info.run_id == mine
    active, continued = open_training_run(exp, cfg, pool, resume=False, scheduled=ScheduledRun("C", 1))
    with active as opened:
        assert not continued and opened.data.tags[OWNER_TAG] == "C"
    import mlflow

    client_run = mlflow.MlflowClient().create_run(exp, tags={"flow": "pipeline"}).info.run_id
    with mlflow.start_run(run_id=client_run) as parent:  # a retried pipeline run: its train subflow inside it
        mlflow.MlflowClient().set_terminated(mine, "FAILED")
        active, continued = open_training_run(exp, cfg, pool, resume=False, scheduled=ScheduledRun("A", 3),
                                              parent_run_id=parent.info.run_id)
        with active as opened:
            assert continued and opened.info.run_id == mine
        assert mlflow.active_run().info.run_id == parent.info.run_id


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def _deployment_run(parameters: dict) -> str:
    """A flow run of a `train` deployment (entrypoint flows/train.py:train_flow), as a schedule creates it."""
    from prefect.client.orchestration import get_client

    from flows.train import train_flow

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(train_flow)
        deployment_id = client.create_deployment(flow_id, "train-test", entrypoint="flows/train.py:train_flow",
                                                 path=str(ROOT), tags=["prompt-r1", "training"])  # prefect.yaml's
        return str(client.create_flow_run_from_deployment(deployment_id, parameters=parameters).id)


def _engine(flow_run_id: str, home: Path, log: Path) -> subprocess.Popen:
    """The flow run's process, as a process worker starts it."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT__FLOW_RUN_ID": flow_run_id, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PROMPT_R1_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "prefect.engine"], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _state(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


@pytest.mark.slow
def test_a_killed_scheduled_run_is_retried_and_resumes_from_its_checkpoint(prefect_api, home, tmp_path):
    """SIGKILL a deployment's train run after a checkpoint; mark it Crashed (the worker would) and
    AwaitingRetry by the sweep (`tasks.recovery.retry_crashed`, the recover-crashed deployment's flow;
    the automation does the same from the event), once; the same flow run runs again (attempt 2), continues its
    own training run at the step of its last checkpoint, not a newer unfinished run of the same
    config, and records each step once. A bad config ends Failed, which the automation leaves."""
    from prefect.states import Crashed, Running, Scheduled

    from prompt_r1.learner.checkpoint import step_dir_name
    from tasks.tracking.runs import tracking_uri
    from warehouse.store import Warehouse

    import mlflow
    from mlflow import MlflowClient

    steps = 4
    flow_run_id = _deployment_run({"config": "configs/smoke.yaml", "overrides": {"train.steps": steps}})
    first = _engine(flow_run_id, home, tmp_path / "first.log")
    deadline = time.time() + 900
    while time.time() < deadline and first.poll() is None and not list(home.glob(f"smoke/*/checkpoints/{step_dir_name(1)}")):
        time.sleep(0.3)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    (folder,) = [p for p in (home / "smoke").iterdir() if (p / "checkpoints").is_dir()]
    last = max(int(p.name.split("-")[1]) for p in (folder / "checkpoints").glob("step-*"))
    assert 1 <= last < steps
    _, exp, run = _runs(home)
    newer = run("2999-01-01")  # a newer unfinished run of the same config: the retry must leave it be
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Crashed(message="exited with status -9"), force=True)
    # the sweep (the recover-crashed deployment's flow) reschedules it, once: a second sweep finds nothing
    assert _sweep() == [flow_run_id] and _sweep() == []
    assert _state(flow_run_id).state.name == "AwaitingRetry"
    second = _engine(flow_run_id, home, tmp_path / "second.log")
    assert second.wait(900) == 0, (tmp_path / "second.log").read_text()[-3000:]
    flow_run = _state(flow_run_id)
    assert flow_run.state.is_completed() and flow_run.run_count == 2
    mlflow.set_tracking_uri(tracking_uri())
    owned = MlflowClient().search_runs([exp], f"tags.{OWNER_TAG} = '{flow_run_id}'")
    assert [r.info.run_id for r in owned] == [folder.name]
    assert parse_resumes(owned[0].data.tags[RESUMES_TAG]) == [(2, last)]  # attempt 2 resumed at its checkpoint
    assert MlflowClient().get_run(newer).info.status == "FAILED" and not (home / "smoke" / newer / "agent").exists()
    with Warehouse(home / "warehouse.duckdb") as wh:
        assert wh.steps_recorded(folder.name) == list(range(steps))
        per_step = wh.query("SELECT step, COUNT(*) FROM trajectories WHERE run_id = ? GROUP BY 1 ORDER BY 1",
                            [folder.name])
    assert [n for _, n in per_step] == [4] * steps

    bad = _deployment_run({"config": str(tmp_path / "missing.yaml")})
    assert _engine(bad, home, tmp_path / "bad.log").wait(300) != 0
    assert _state(bad).state.type.value == "FAILED"  # a user error: not Crashed, so never retried
    assert _sweep() == [] and _state(bad).state.type.value == "FAILED" and _state(flow_run_id).state.is_completed()
    spent = _deployment_run({"config": "configs/smoke.yaml"})  # crashed on its last attempt: left Crashed
    with get_client(sync_client=True) as client:
        for _ in range(3):
            client.set_flow_run_state(spent, Scheduled(), force=True)
            client.set_flow_run_state(spent, Running(), force=True)
        client.set_flow_run_state(spent, Crashed(message="exited with status -9"), force=True)
    assert _state(spent).run_count == 3 and _sweep() == [] and _state(spent).state.type.value == "CRASHED"


def _sweep() -> list[str]:
    import asyncio

    from prefect.client.orchestration import get_client

    from tasks.recovery import retry_crashed

    async def main():
        async with get_client() as client:
            return await retry_crashed(client)

    return asyncio.run(main())


def test_attempts_are_capped_and_continuations_recorded_in_order():
    import doctest

    import tasks.recovery
    from tasks.recovery import RetriesExhausted, add_resume, check_attempts

    assert doctest.testmod(tasks.recovery).failed == 0
    check_attempts(None)  # not a scheduled run: no limit
    check_attempts(ScheduledRun("f", 3))
    with pytest.raises(RetriesExhausted, match="crashed 3 times"):
        check_attempts(ScheduledRun("f", 4))
    value = add_resume(add_resume(None, 0, 1), 2, 2)  # a plain resume at step 1, then a retry at step 2
    assert parse_resumes(value) == [(0, 1), (2, 2)]


def test_a_step_with_two_reports_of_one_metric_still_links_to_the_logged_model(home):
    """The retried run of the third short soak failed in `log_agent_model`: MLflow 3 links the run's
    step-0 metrics to the logged model, and step 0 held two values of `rollout_actor_restarts` at one
    timestamp (the validation before training and the first update both report it), which
    `logged_model_metrics`' key refuses. A buffer gives each entry its own timestamp: the run is
    killed after its first flush, continued, flushes again, and the model is logged."""
    import mlflow
    from mlflow import MlflowClient

    from tasks.tracking.runs import MetricBuffer, setup_mlflow

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    exp = setup_mlflow("metric-buffer", None)
    with mlflow.start_run(experiment_id=exp) as run:  # the first attempt: validation and step 0, flushed
        buffer = MetricBuffer(run.info.run_id)
        buffer.add(0, {"val_reward": 0.5, "rollout_actor_restarts": 1.0})
        buffer.add(0, {"reward_mean": 0.25, "rollout_actor_restarts": 0.0})
        buffer.flush()
    with mlflow.start_run(run_id=run.info.run_id):  # continued (a crash's retry): step 1, then the model
        buffer.add(1, {"reward_mean": 0.5, "rollout_actor_restarts": 1.0})
        buffer.add(0, {"reward_mean": 9.0})  # step 0 is in MLflow already: never logged again
        buffer.flush()
        mlflow.pyfunc.log_model(name="agent_model", python_model=Echo(), pip_requirements=[])
    history = MlflowClient().get_metric_history(run.info.run_id, "rollout_actor_restarts")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.0), (0, 1.0), (1, 1.0)]
    assert [m.value for m in MlflowClient().get_metric_history(run.info.run_id, "reward_mean")] == [0.25, 0.5]
