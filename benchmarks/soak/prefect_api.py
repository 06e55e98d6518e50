"""The soak's calls to the Prefect API, each run with a fresh client (`Services.api`: the server
may have restarted in between): stop the schedules, wait for and cancel runs, and collect every
deployment run with its state, attempts, times, error logs and the training run it ran.
"""

from __future__ import annotations

import re
from typing import Any

PAGE = 200  # the most runs the server returns at once
# a train flow's line naming its training run, matched at the start: "not continuing unfinished training run X" is none
TRAINING_LINE = re.compile(r"(starting|continuing unfinished) training run (\w+)")


async def _runs(client, states: list | None = None) -> list:
    """Every flow run (in those states), page by page (bounded: 100 pages)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.sorting import FlowRunSort

    where = (FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states))) if states else None)
    runs: list = []
    for page in range(100):
        batch = await client.read_flow_runs(flow_run_filter=where, sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                                            limit=PAGE, offset=page * PAGE)
        runs += batch
        if len(batch) < PAGE:
            break
    return runs


def is_retry(run) -> bool:
    """A Scheduled run that already ran: a crashed run the retry automation scheduled again
    (`AwaitingRetry`), which is no new run of the schedule and must get its chance to resume.

    >>> from types import SimpleNamespace as R
    >>> is_retry(R(run_count=1, state_name="AwaitingRetry")), is_retry(R(run_count=0, state_name="Scheduled"))
    (True, False)
    """
    return bool(run.run_count) or run.state_name == "AwaitingRetry"


async def stop_scheduling(client, end: float) -> list[str]:
    """Pause every deployment and delete the runs not yet started, retries of crashed runs aside
    (`is_retry`: they run in the drain); returns the names of the deleted runs that were due before
    `end` (they waited for the one queue slot)."""
    from prefect.client.schemas.objects import StateType

    for deployment in await client.read_deployments():
        await client.pause_deployment(deployment.id)
    due = []
    for run in await _runs(client, [StateType.SCHEDULED]):
        if is_retry(run):
            continue
        if run.expected_start_time and run.expected_start_time.timestamp() <= end:
            due.append(run.name)
        await client.delete_flow_run(run.id)
    return due


async def active_runs(client) -> list[str]:
    from prefect.client.schemas.objects import StateType

    active = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING, StateType.SCHEDULED]
    return [str(r.id) for r in await _runs(client, active) if r.deployment_id]


async def cancel(client, ids: list[str]) -> None:
    from prefect.states import Cancelling

    for run_id in ids:
        await client.set_flow_run_state(run_id, Cancelling(message="the soak's drain time is over"), force=True)


async def collect_runs(client) -> list[dict[str, Any]]:
    """Every deployment run: state, reason, times, error logs, how many times it ran (`attempts`: a
    crashed run retried by `tasks.recovery`'s automation runs again as the same flow run), and which training run it ran
    (its train flow's log says `starting` or `continuing unfinished training run <id>`)."""
    deployments = {d.id: d.name for d in await client.read_deployments()}
    flow_runs = await _runs(client)
    parent: dict[Any, Any] = {}
    for run in flow_runs:  # subflows (the pipeline's train and evaluate) belong to their root run
        if run.parent_task_run_id:
            task_run = await client.read_task_run(run.parent_task_run_id)
            parent[run.id] = task_run.flow_run_id

    def root(run_id):
        for _ in range(10):  # pipeline -> train flow: two levels; bounded all the same
            if run_id not in parent:
                break
            run_id = parent[run_id]
        return run_id

    logs: dict[Any, list] = {}
    offset = 0
    while offset < 2500 * PAGE:
        page = await client.read_logs(limit=PAGE, offset=offset)
        for entry in page:
            logs.setdefault(root(entry.flow_run_id), []).append(entry)
        offset += PAGE
        if len(page) < PAGE:
            break
    out = []
    for run in flow_runs:
        if not run.deployment_id:
            continue
        mine = logs.get(run.id, [])
        training = resumed = None
        for entry in mine:
            found = TRAINING_LINE.match(entry.message)
            if found:
                training, resumed = found.group(2), found.group(1) != "starting"
        seconds = (run.end_time - run.start_time).total_seconds() if run.start_time and run.end_time else None
        out.append({"id": str(run.id), "name": run.name, "deployment": deployments.get(run.deployment_id, "?"),
                    "state": run.state.type.value if run.state else "?",
                    "message": run.state.message if run.state else "",
                    "start_time": run.start_time.isoformat() if run.start_time else None,
                    "seconds": seconds, "start_ts": run.start_time.timestamp() if run.start_time else None,
                    "end_ts": run.end_time.timestamp() if run.end_time else None, "error_logs": sum(1 for e in mine if e.level >= 40),
                    "first_error": next((e.message[:300] for e in mine if e.level >= 40), None),
                    "training_run": training, "resumed": resumed, "attempts": int(run.run_count or 0)})
    return out
