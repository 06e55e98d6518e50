#!/usr/bin/env bash
# Registers the Prefect deployments against a real local `prefect server start` and checks
# that all three exist with their schedules. Used by .ci/run; safe to run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
export PREFECT_HOME=$(mktemp -d)
PORT=${PREFECT_PORT:-4299}
export PREFECT_API_URL=http://127.0.0.1:$PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_ENABLED=false
$BIN/prefect server start --host 127.0.0.1 --port "$PORT" > "$PREFECT_HOME/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fs "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -fs "$PREFECT_API_URL/health" >/dev/null || { cat "$PREFECT_HOME/server.log"; exit 1; }
$BIN/prefect work-pool create prompt-r1 --type process >/dev/null
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
            print(f"deployment {name}: work pool {deployments[name].work_pool_name}, schedules {crons or 'manual'}")
asyncio.run(main())
PY
echo "deployments registered: ok"
