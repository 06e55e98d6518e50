"""Crash recovery of scheduled runs: a deployment's flow run that crashed for an infrastructure
reason is run again (the same flow run, Prefect's `AwaitingRetry`) and continues its own training
run from the last checkpoint.

Why here: Prefect's flow `retries` act on an exception the flow raised, whatever it was (a bad
config would be retried too), and never on a crash: a flow-run process killed with SIGKILL, or
orphaned by its worker, cannot retry itself. Prefect's own word for an infrastructure failure is
the `Crashed` state (the worker saw the process exit with a signal or status; the engine exited on
a signal or a broken pipe; the zombie automation saw the heartbeats stop). So one automation
(`retry_crashed_automation`) turns a deployment run's `Crashed` into `AwaitingRetry` (Scheduled);
the worker picks it up again as the same flow run, its `run_count` one higher. A user error
(bad config, missing file) ends `Failed` and is never retried.

What the retry continues (`ScheduledRun`): a training run started by a deployment's flow run is
tagged with that root flow run's id in MLflow (`OWNER_TAG`; the pipeline's train subflow carries
its pipeline's id). A retry continues the unfinished training run of its own id and no other
(`tasks.tracking.runs.continued_run`); the plain "continue the newest unfinished run of this
config" rule passes over a run another scheduled flow run owns; the run folder's lock
(`run_folder.own_run`) refuses a second process on a folder in any case. After `MAX_ATTEMPTS`
runs a flow run fails instead of starting (`check_attempts`), so a run that crashes every time
stops being retried.

The automation alone is not enough: in the soak it did not fire for crashes reported right after
the Prefect server restarted, nor for a run orphaned by a killed worker, though their `Crashed`
events are in the server's event log (docs/deployments.md). So a sweep (`retry_crashed`) does the
same from the API's state instead of its events: every deployment run tagged `prompt-r1` that is
`Crashed` with attempts left is set to `AwaitingRetry`. It is idempotent (a run it or the
automation already rescheduled is no longer `Crashed`), never touches a `Failed`, `Completed` or
`Cancelled` run nor a subflow run, and it is what the `recover-crashed` deployment of prefect.yaml
runs every few minutes on the worker (flows/recover.py); the soak runs it too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

OWNER_TAG = "prefect_flow_run"  # MLflow tag: the root deployment flow run a training run belongs to
RESUMES_TAG = "resumes"         # MLflow tag: "attempt:step" of every continuation, comma-separated
MAX_ATTEMPTS = 3                # a scheduled flow run runs at most this many times
AUTOMATION_NAME = "Retry crashed prompt-r1 runs"
SWEEP_TAG = "prompt-r1"         # the tag of the deployments (prefect.yaml) whose crashed runs the sweep retries
RETRY_MESSAGE = "retried after an infrastructure crash; it continues its training run from the last checkpoint"


class RetriesExhausted(RuntimeError):
    """A scheduled flow run crashed `MAX_ATTEMPTS` times: it fails (and is not retried again)."""


@dataclass(frozen=True)
class ScheduledRun:
    """The deployment flow run a flow runs for (the root of its subflows) and which attempt this is."""

    flow_run_id: str
    attempt: int


def scheduled_run() -> ScheduledRun | None:
    """This flow's root flow run when it belongs to a deployment (a scheduled or triggered run), else
    None: a flow called directly, a test, `prompt-r1 run-flow`."""
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return None
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    root_id = flow_run.root_flow_run_id
    with get_client(sync_client=True) as client:
        root = client.read_flow_run(root_id)
    if root.deployment_id is None:
        return None
    return ScheduledRun(str(root.id), max(int(root.run_count or 1), 1))


def check_attempts(run: ScheduledRun | None, limit: int = MAX_ATTEMPTS) -> None:
    """Raise `RetriesExhausted` past `limit` attempts (the flow then fails, which is not retried).

    >>> check_attempts(ScheduledRun("f", 3))
    >>> check_attempts(ScheduledRun("f", 4))
    Traceback (most recent call last):
    ...
    tasks.recovery.RetriesExhausted: scheduled flow run f crashed 3 times; not retried again: see its logs, then run the deployment again
    """
    if run is not None and run.attempt > limit:
        raise RetriesExhausted(f"scheduled flow run {run.flow_run_id} crashed {run.attempt - 1} times; not retried "
                               "again: see its logs, then run the deployment again")
    if run is not None and run.attempt > 1:
        log.warning("attempt %d of scheduled flow run %s (after a crash): continuing its own runs", run.attempt,
                    run.flow_run_id)


def add_resume(previous: str | None, attempt: int, step: int) -> str:
    """The `RESUMES_TAG` value with one more continuation (attempt 0: not a scheduled retry).

    >>> add_resume(None, 2, 1), add_resume("2:1", 3, 2)
    ('2:1', '2:1,3:2')
    """
    return ",".join(filter(None, [previous, f"{attempt}:{step}"]))


def parse_resumes(value: str | None) -> list[tuple[int, int]]:
    """(attempt, step) pairs of a `RESUMES_TAG` value.

    >>> parse_resumes("2:1,3:2"), parse_resumes(None)
    ([(2, 1), (3, 2)], [])
    """
    return [(int(a), int(s)) for a, s in (p.split(":") for p in (value or "").split(",") if p)]


def retry_crashed_automation():
    """The automation that retries a deployment run's crash: on `prefect.flow-run.Crashed` of a flow
    run related to a deployment (subflows, which no worker could run again, are left out), set that
    flow run to `AwaitingRetry` (a Scheduled state, now), which its work pool's worker picks up.
    Create it with `.create()` against the server (`scripts`/the soak do)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return Automation(
        name=AUTOMATION_NAME,
        description="A scheduled prompt-r1 run that crashed (process killed, worker lost, heartbeats stopped) "
                    "runs again and continues its training run from the last checkpoint (tasks/recovery.py).",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification({"prefect.resource.role": "deployment"}),
            posture=Posture.Reactive, threshold=1),
        actions=[ChangeFlowRunState(state=StateType.SCHEDULED, name="AwaitingRetry", message=RETRY_MESSAGE,
                                    force=True)],
    )


async def crashed_runs(client, tag: str | None = SWEEP_TAG) -> list:
    """The deployment flow runs (root runs, not subflows) in a `Crashed` state, with `tag` (None: any)."""
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterDeploymentId,
                                                FlowRunFilterParentTaskRunId, FlowRunFilterState,
                                                FlowRunFilterStateType, FlowRunFilterTags)
    from prefect.client.schemas.objects import StateType

    where = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED])),
                          deployment_id=FlowRunFilterDeploymentId(is_null_=False),
                          parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True),
                          tags=FlowRunFilterTags(all_=[tag]) if tag else None)
    runs: list = []
    for page in range(50):  # bounded: 10,000 crashed runs
        batch = await client.read_flow_runs(flow_run_filter=where, limit=200, offset=page * 200)
        runs += batch
        if len(batch) < 200:
            break
    return runs


def should_retry(state_type: str, run_count: int | None, deployment_id: object, parent_task_run_id: object,
                 limit: int = MAX_ATTEMPTS) -> bool:
    """Whether the sweep sets a flow run to `AwaitingRetry`: a deployment's root run that crashed
    with attempts left (`run_count` below `limit`; a run that crashed before it ran counts 0).

    >>> should_retry("CRASHED", 1, "d", None), should_retry("CRASHED", 0, "d", None)
    (True, True)
    >>> should_retry("CRASHED", 3, "d", None), should_retry("FAILED", 1, "d", None)
    (False, False)
    >>> should_retry("CRASHED", 1, None, None), should_retry("CRASHED", 1, "d", "task-run")
    (False, False)
    """
    return (state_type == "CRASHED" and int(run_count or 0) < limit and deployment_id is not None
            and parent_task_run_id is None)


async def retry_crashed(client, tag: str | None = SWEEP_TAG, limit: int = MAX_ATTEMPTS) -> list[str]:
    """Set every crashed deployment run with attempts left (`should_retry`) to `AwaitingRetry`, the
    state the automation sets: its worker runs it again and it continues its training run. Each run's
    state is read again just before (the automation may have rescheduled it meanwhile), and the
    transition is not forced, so Prefect's orchestration rules still apply. Returns the ids set."""
    from prefect.states import AwaitingRetry

    done = []
    for run in await crashed_runs(client, tag):
        fresh = await client.read_flow_run(run.id)
        state = fresh.state.type.value if fresh.state else ""
        if not should_retry(state, fresh.run_count, fresh.deployment_id, fresh.parent_task_run_id, limit):
            if state == "CRASHED" and int(fresh.run_count or 0) >= limit:
                log.warning("flow run %s (%s) crashed %d times: not retried again", fresh.name, fresh.id,
                            fresh.run_count)
            continue
        result = await client.set_flow_run_state(fresh.id, AwaitingRetry(message=RETRY_MESSAGE), force=False)
        if result.status.value == "ACCEPT":
            log.warning("flow run %s (%s) crashed (%s); set to AwaitingRetry: it runs again and continues its "
                        "training run", fresh.name, fresh.id, (fresh.state.message or "")[:200])
            done.append(str(fresh.id))
        else:
            log.warning("flow run %s (%s): AwaitingRetry not accepted (%s: %s)", fresh.name, fresh.id,
                        result.status.value, getattr(result.details, "reason", ""))
    return done
