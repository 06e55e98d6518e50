"""The backstop of crash recovery: a small flow that the `recover-crashed` deployment of prefect.yaml
runs on an interval on the same worker as the others. It sets every crashed prompt-r1 deployment
run with attempts left to `AwaitingRetry` (`tasks.recovery.retry_crashed`): a crash the retry
automation missed is run again all the same, and continues its training run from its checkpoint.

    prefect deployment run 'recover-crashed/recover-crashed'    # at once, besides its schedule
"""

from __future__ import annotations

from prefect import flow

from tasks.recovery import SWEEP_TAG, retry_crashed


@flow(name="recover-crashed", log_prints=True)
async def recover_crashed_flow(tag: str = SWEEP_TAG) -> list[str]:
    """Retry the crashed deployment runs tagged `tag`; returns the flow run ids set to AwaitingRetry."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        retried = await retry_crashed(client, tag)
    print(f"{len(retried)} crashed run(s) set to AwaitingRetry: {retried}")
    return retried
