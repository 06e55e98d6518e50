"""A team's MLflow server receives everything: `MLFLOW_TRACKING_URI` or a config's `tracking.uri`
decides the tracking and registry URI, and the run home's `mlflow.db` is only the fallback.

A real `mlflow server` is started here on 127.0.0.1 (a free port, its own SQLite store and artifact
folder, up within a deadline). Runs, metrics, traces, artifacts and registered agents must land in
the server's store and artifact folder, and nothing in the run home's local store; the champion is
downloaded back from the server; a password in the URI never reaches the logs.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prompt_r1.config.experiment import load_config
from tests.serving.test_ask_serve import free_port

SERVER_START_S = 180  # imports and migrations on a loaded 2-core machine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(URL, its SQLite database, its artifact folder) of a running `mlflow server`."""
    root = tmp_path_factory.mktemp("mlflow-server")
    db, artifacts = root / "server.db", root / "artifacts"
    port = free_port()
    log = (root / "server.log").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{db}",
                             "--artifacts-destination", str(artifacts)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"mlflow server not up in {SERVER_START_S} s"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.5)
        yield url, db, artifacts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(autouse=True)
def _reset_tracking():
    yield
    import mlflow

    from tasks.tracking import runs

    runs._configured = None
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)


def _rows(db: Path, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute(sql, args).fetchall()


def _nothing_local(home: Path) -> None:
    assert not (home / "mlflow.db").exists() and not (home / "mlartifacts").exists()


def test_the_precedence_config_then_environment_then_the_local_store(home, monkeypatch):
    from tasks.tracking.runs import is_local, tracking_uri

    assert tracking_uri() == f"sqlite:///{home / 'mlflow.db'}" and is_local(tracking_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://team:5000")
    assert tracking_uri() == "http://team:5000" and not is_local(tracking_uri())
    assert tracking_uri("http://config:5000") == "http://config:5000"
    cfg = load_config("configs/smoke.yaml", {})
    assert cfg.registered_model() == "prompt-r1-smoke" and cfg.tracking.uri is None
    # where a run is tracked is not what it computes: the run's identity stays
    tracked = load_config("configs/smoke.yaml", {"tracking.uri": "http://config:5000",
                                                 "tracking.registered_model": "team-qa"})
    assert tracked.hash() == cfg.hash() and tracked.registered_model() == "team-qa"


def test_a_password_in_a_config_is_refused_without_echoing_it():
    from prompt_r1.config.base import ConfigError

    with pytest.raises(ConfigError, match=r"tracking.uri.*MLFLOW_TRACKING_PASSWORD") as err:
        load_config("configs/smoke.yaml", {"tracking.uri": "https://me:s3cret@mlflow.example.com"})
    assert "s3cret" not in str(err.value) and "me:***@mlflow.example.com" in str(err.value)


def test_runs_traces_artifacts_and_models_land_on_the_server(server, home, monkeypatch, caplog):
    """MLFLOW_TRACKING_URI (with a user and password, which the server ignores) sends a training-like
    run, a trace, an artifact and two registered agents to the server; nothing is written locally."""
    import mlflow
    from mlflow import MlflowClient

    from prompt_r1.models.bundled import resolve_model
    from tasks.tracking.registry import register_agent
    from tasks.tracking.runs import setup_mlflow, start_training_run

    url, db, artifacts = server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url.replace("http://", "http://alice:s3cret@"))
    cfg = load_config("configs/smoke.yaml", {})
    agent = Path(resolve_model("tiny-protocol"))
    with caplog.at_level(logging.INFO, logger="tasks.tracking"):
        exp_id = setup_mlflow(cfg.name, cfg.tracking.uri)
        with start_training_run(run_name="train-smoke") as run:
            mlflow.log_metric("reward_mean", 0.25, step=0)
            mlflow.log_text("hello", "notes/hello.txt")
            with mlflow.start_span("rollout") as span:
                span.set_inputs({"question": "q"})
            version, champion = register_agent(run.info.run_id, agent, 0.5, cfg)
        mlflow.flush_trace_async_logging()
    assert (version, champion) == ("1", True)
    assert "s3cret" not in caplog.text and "alice:***@127.0.0.1" in caplog.text

    # in the server's store
    assert _rows(db, "SELECT name FROM experiments WHERE experiment_id = ?", int(exp_id)) == [("smoke",)]
    assert _rows(db, "SELECT run_uuid FROM runs WHERE name = 'train-smoke'") == [(run.info.run_id,)]
    assert _rows(db, "SELECT value FROM metrics WHERE key = 'reward_mean'") == [(0.25,)]
    assert _rows(db, "SELECT name FROM registered_models") == [("prompt-r1-smoke",)]
    assert _rows(db, "SELECT alias, version FROM registered_model_aliases") == [("champion", 1)]
    assert _rows(db, "SELECT COUNT(*) FROM trace_info")[0][0] == 1
    # the artifacts in the server's folder: the text, the agent model's weights
    stored = {p.name for p in artifacts.rglob("*") if p.is_file()}
    assert {"hello.txt", "MLmodel", "model.safetensors"} <= stored, stored
    client = MlflowClient()
    assert client.get_experiment(exp_id).artifact_location.startswith("mlflow-artifacts:")
    _nothing_local(home)


def test_a_configs_tracking_uri_registers_and_serves_its_champion(server, home, monkeypatch):
    """`tracking.uri` alone (no environment variable): training registers into the config's model on
    the server, under the champion rule, and the default agent of `ask`/`serve` is that champion,
    downloaded from the server."""
    import mlflow

    from prompt_r1.models import resolver as agent_resolver
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.models.resolver import resolve_agent
    from tasks.tracking.registry import install_registry_resolver, register_agent
    from tasks.tracking.runs import setup_mlflow

    url, db, _ = server
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config("configs/smoke.yaml", {"name": "served", "tracking.uri": url})
    agent = Path(resolve_model("tiny-protocol"))
    setup_mlflow(cfg.name, cfg.tracking.uri)
    outcomes = []
    for score in (None, 0.3, None, 0.2):  # unscored first; a scored one displaces it; then neither moves it
        with mlflow.start_run():
            outcomes.append(register_agent(mlflow.active_run().info.run_id, agent, score, cfg))
    assert outcomes == [("1", True), ("2", True), ("3", False), ("4", False)]
    assert _rows(db, "SELECT alias, version FROM registered_model_aliases m JOIN registered_models r "
                     "ON m.name = r.name WHERE r.name = 'prompt-r1-served'") == [("champion", 2)]
    _nothing_local(home)

    mlflow.set_tracking_uri(None)  # a fresh `ask` process: only the config says where
    monkeypatch.setattr(agent_resolver, "_schemes", {})
    install_registry_resolver()
    from tasks.tracking import runs

    runs._configured = None
    folder = resolve_agent(None, default_model="tiny", cfg=cfg)
    assert folder.parent.name == "v2" and (folder / "model.safetensors").read_bytes() == \
        (agent / "model.safetensors").read_bytes()
    assert not (home / "mlflow.db").exists()  # the download cache only: no local store


def test_a_home_holding_the_old_shared_model_is_told_how_to_migrate(home, tmp_path, caplog):
    """A registry with `prompt-r1-agent@champion` (every config's model before one model a config) and
    no champion of the config's own: the config's default agent is not the old one, and a warning
    says how to take it."""
    from mlflow import MlflowClient

    from tasks.tracking.registry import LEGACY_MODEL_NAME, registry_agent_path
    from tasks.tracking.runs import setup_mlflow

    setup_mlflow("smoke")
    client = MlflowClient()
    client.create_registered_model(LEGACY_MODEL_NAME)
    version = client.create_model_version(LEGACY_MODEL_NAME, source=str(tmp_path))
    client.set_registered_model_alias(LEGACY_MODEL_NAME, "champion", version.version)
    with caplog.at_level(logging.WARNING, logger="tasks.tracking.registry"):
        assert registry_agent_path("models:/prompt-r1-smoke@champion") is None
    assert "no champion of prompt-r1-smoke" in caplog.text and "models:/prompt-r1-agent@champion" in caplog.text
    assert "Migrating" in caplog.text
