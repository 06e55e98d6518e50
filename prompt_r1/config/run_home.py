"""The run home: the one folder everything a run writes lives under, and the names inside it.

`PROMPT_R1_HOME` (else `./runs`) holds the warehouse (`warehouse.duckdb`), the local MLflow
store, logs of work that belongs to no run (`logs/`) and one folder per run
(`<config name>/<run id>/`: checkpoints, evaluation outputs, server logs). It lives beside the
config, not in it: a config says what a run computes, the run home says where its files go, and
every layer from the warehouse up to the CLI asks it without needing the config's models.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from prompt_r1.config.base import SAFE_NAME, ConfigError

__all__ = ["default_db_path", "logs_dir", "new_run_id", "run_dir", "runs_home"]


def runs_home() -> Path:
    """Root of everything a run writes (warehouse, MLflow, checkpoints); `PROMPT_R1_HOME` moves it."""
    return Path(os.environ.get("PROMPT_R1_HOME", Path.cwd() / "runs")).resolve()


def default_db_path() -> Path:
    return runs_home() / "warehouse.duckdb"


def new_run_id() -> str:
    """Id of a run started outside MLflow: 32 hex digits, the shape of MLflow's run ids (which the
    flows use), so `runs/<config>/<run_id>` holds one kind of id and a run id names its folder
    whoever started the run. Runs are ordered by the start time in their `run.json`, not by id.

    >>> import re; bool(re.fullmatch(r"[0-9a-f]{32}", new_run_id())) and new_run_id() != new_run_id()
    True
    """
    return uuid.uuid4().hex


def logs_dir() -> Path:
    """Logs of work that belongs to no run (managed servers started by `ask`, `serve`, `serve-env`)."""
    return runs_home() / "logs"


def run_dir(config_name: str, run_id: str) -> Path:
    """Where one run keeps checkpoints, evaluation outputs and server logs."""
    for part in (config_name, run_id):  # a `/` or `..` would put the run outside the run home
        if not SAFE_NAME.match(part):
            raise ConfigError(f"{part!r} cannot name a run folder (a config name or --run-id): use 1-64 "
                              "letters, digits, `.`, `_`, `-`, starting with a letter or digit")
    return runs_home() / config_name / run_id
