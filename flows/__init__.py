"""Prefect flows: ingest -> train -> evaluate, and the end-to-end pipeline (the main job).

Modules: `ingest`, `train`, `evaluate` (one flow each), `pipeline` (the three in one run, one
environment server kept up across them), `recover` (the recover-crashed deployment's flow:
crashed scheduled runs run again, `tasks.recovery`), `prefect_home` (a missing `PREFECT_HOME` made before Prefect starts, its telemetry off) and `cli` (the `prompt-r1` entry point: the library's
commands plus `pipeline`, `run-flow` and `rerun`, with the MLflow hooks the library's commands
rely on).
"""

import os

from flows.prefect_home import prepare_prefect_home

# Prefect reads its settings once, on import. Its 20 s default for starting the ephemeral API
# server is too short on a loaded 2-core machine (the flow dies before its first task); a user's
# own setting still wins.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# A missing PREFECT_HOME (any depth) is created, and server telemetry is off unless set.
prepare_prefect_home()
