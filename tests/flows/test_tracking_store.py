"""A new run home's MLflow database, copied from a template, is the database MLflow itself makes.

`tasks.tracking.runs.create_store` copies an empty database made once per MLflow version instead of
running MLflow's migrations for every new home. Checked against MLflow making one itself: the same
tables, indexes and schema version, the same `Default` experiment once opened, and a store that
takes runs, metrics and registered models.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from tasks.tracking import runs as tracking


def schema(db: Path) -> tuple[list, list]:
    """Every table and index with its columns and constraints (in any order: MLflow's own
    migrations write the `runs` table's two CHECK constraints in either order), and the version."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        ddl = sorted((kind, name, table, tuple(sorted((sql or "").split(", \n"))))
                     for kind, name, table, sql in con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        return ddl, con.execute("SELECT version_num FROM alembic_version").fetchall()


def default_experiment(db: Path) -> tuple:
    (exp,) = MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return exp.experiment_id, exp.name, exp.artifact_location, exp.lifecycle_stage


def test_the_copy_is_the_database_mlflow_makes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts the Default experiment's artifacts under the maker's cwd
    made = tmp_path / "made" / "mlflow.db"
    made.parent.mkdir()
    copied = tmp_path / "copied" / "mlflow.db"
    tracking.create_store(copied)
    assert schema(copied) == schema(made_by_mlflow(made))
    assert default_experiment(copied) == default_experiment(made)
    assert [p.name for p in copied.parent.iterdir()] == ["mlflow.db"]  # no temporary file left beside it


def made_by_mlflow(db: Path) -> Path:
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def test_setup_on_a_fresh_home_gives_a_working_store(home):
    exp_id = tracking.setup_mlflow("smoke")
    assert (home / "mlflow.db").is_file()
    with mlflow.start_run() as run:
        mlflow.log_metric("score", 0.5, step=1)
        mlflow.log_param("env_model", "smollm2")
    client = MlflowClient()
    assert client.get_run(run.info.run_id).data.metrics == {"score": 0.5}
    assert client.get_experiment(exp_id).name == "smoke"
    assert {e.name for e in client.search_experiments()} == {"Default", "smoke"}
    client.create_registered_model("prompt-r1-agent")
    assert client.get_registered_model("prompt-r1-agent").name == "prompt-r1-agent"
    assert tracking.setup_mlflow("smoke") == exp_id  # an existing database is opened, never replaced


@pytest.fixture(autouse=True)
def _reset_tracking_uri():
    yield
    mlflow.set_tracking_uri(None)
