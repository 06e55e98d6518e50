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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

OWNER_TAG = "prefect_flow_run"  # MLflow tag: the root deployment flow run a training run belongs to
RESUMES_TAG = "resumes"         # MLflow tag: "attempt:step" of every continuation, comma-separated
MAX_ATTEMPTS = 3                # a scheduled flow run runs at most this many times
AUTOMATION_NAME = "Retry crashed prompt-r1 runs"
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
