#!/usr/bin/env bash
# Registers the Prefect deployments against a real local `prefect server start`, checks that
# all four exist with their schedules, then runs the `pipeline` deployment on the smoke config
# through a real process worker (so the pull step works from a clone). Used by .ci/run; safe to
# run by hand (everything it writes goes to a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
export PREFECT_HOME=$(mktemp -d)
PORT=${PREFECT_PORT:-4299}
export PREFECT_API_URL=http://127.0.0.1:$PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_ENABLED=false
$BIN/prefect server start --host 127.0.0.1 --port "$PORT" > "$PREFECT_HOME/server.log" 2>&1 &
server=$!
stop() {  # SIGTERM, then SIGKILL if still alive after 20 s; never waits forever
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 40); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done
  echo "pid $1 ignored SIGTERM for 20 s; killing it" >&2
  kill -9 "$1" 2>/dev/null || true
}
# The Prefect 3.7 worker turns SIGTERM into SIGINT but did not always exit (seen hanging for
# minutes after a finished run), hence the SIGKILL fallback; it stops before the server it
# reports to, since its shutdown also failed when the API vanished first.
worker=
trap 'stop "$worker"; stop "$server"' EXIT
for _ in $(seq 1 120); do
  curl -fs "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -fs "$PREFECT_API_URL/health" >/dev/null || { cat "$PREFECT_HOME/server.log"; exit 1; }
$BIN/prefect work-pool create prompt-r1 --type process >/dev/null
# Every deployment writes the warehouse: their shared queue runs one at a time (prefect.yaml).
$BIN/prefect work-queue create warehouse --pool prompt-r1 --limit 1 >/dev/null
$BIN/prefect variable set prompt_r1_root "$PWD" --overwrite >/dev/null
$BIN/prefect --no-prompt deploy --all
$BIN/python - <<'PY'
import asyncio
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as client:
        deployments = {d.name: d for d in await client.read_deployments()}
        want = {"pipeline": None, "transfer-eval": "0 2 * * *", "train": "0 3 * * 0"}
        for name, cron in want.items():
            assert name in deployments, f"deployment {name} not registered: {sorted(deployments)}"
            crons = [s.schedule.cron for s in deployments[name].schedules]
            assert (cron in crons) if cron else not crons, f"{name}: schedules {crons}"
            assert deployments[name].work_queue_name == "warehouse", f"{name}: queue {deployments[name].work_queue_name}"
            print(f"deployment {name}: work pool {deployments[name].work_pool_name}, schedules {crons or 'manual'}")
        recover = deployments.get("recover-crashed")  # crash recovery's backstop (tasks/recovery.py)
        assert recover is not None, f"deployment recover-crashed not registered: {sorted(deployments)}"
        intervals = [s.schedule.interval.total_seconds() for s in recover.schedules]
        assert intervals == [180] and recover.work_queue_name == "recovery", (intervals, recover.work_queue_name)
        print(f"deployment recover-crashed: every {intervals[0]:g} s, queue recovery")
        queue = await client.read_work_queue_by_name("warehouse", work_pool_name="prompt-r1")
        assert queue.concurrency_limit == 1, f"queue warehouse: concurrency limit {queue.concurrency_limit}"
        print("work queue warehouse: concurrency limit 1")
asyncio.run(main())
PY
echo "deployments registered: ok"

# One real run through a worker: the worker's flow-run subprocess starts from the pull step's
# working directory with this clone's .venv on PATH, and writes only under a temporary home.
export PROMPT_R1_HOME=$PREFECT_HOME/runs
PATH=$BIN:$PATH $BIN/prefect worker start --pool prompt-r1 > "$PREFECT_HOME/worker.log" 2>&1 &
worker=$!
if ! $BIN/prefect --no-prompt deployment run pipeline/pipeline --param config=configs/smoke.yaml \
      --watch --watch-interval 5 --watch-timeout 1200; then
  tail -n 60 "$PREFECT_HOME/worker.log"
  exit 1
fi
$BIN/python - <<'PY'
import asyncio
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

async def main():
    async with get_client() as client:
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["pipeline"])))
        states = [r.state.type.value for r in runs]
        assert states == ["COMPLETED"], f"pipeline deployment runs: {states}"
        print(f"pipeline deployment run {runs[0].name}: {states[0]}")
asyncio.run(main())
PY
echo "pipeline deployment ran through a process worker: ok"
