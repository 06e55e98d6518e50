"""Shared fixtures: an isolated run home per test, one model cache per session, the shared data.

`make test` runs the suite in two pytest-xdist workers (`--dist loadgroup`). Each test file is one
unit of work (its module fixtures, such as a started server, are set up once), files that start
a simulated multi-node Ray cluster share one unit (never two clusters at once), and files with a
`slow` test are handed out first so the workers finish together. The model cache is shared by
the workers; `resolve_model` builds each model once under a lock.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Before any test module imports huggingface_hub, which reads it once: a hub id fails at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before any test module imports ray, which reads it once: a Ray call left over from an earlier test
# (a thread, a finaliser) raises instead of starting a local Ray that the tests after it would find.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
# Tests track into their own run home's store: a team's MLflow server named in the shell that runs
# them (tasks.tracking.runs reads these) never receives a test's runs or models.
for _name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _no_mlflow_uri_between_tests():
    """After each test, MLflow points nowhere and neither URI variable is set: `mlflow.set_tracking_uri`
    (in a test's own code, or MLflow's) writes `MLFLOW_TRACKING_URI`, which the next test's flows would
    read as a team's server and track into the previous test's home."""
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        os.environ.pop(name, None)


SHARED_DATA = Path(os.environ.get("PROMPT_R1_SHARED_DATA", ROOT.parent / "shared" / "data" / "prompt-r1"))


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """One model cache for the session: tiny models and SmolLM2 are built once."""
    shared_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own base; their parent is the run's
        shared_root = shared_root.parent
    cache = os.environ.get("PROMPT_R1_MODELS") or str(shared_root / "models")
    os.environ["PROMPT_R1_MODELS"] = cache
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Path(cache)


# Files whose tests start a `ray.cluster_utils.Cluster`: one worker runs them, one after the other.
SAME_WORKER = {"test_rollout_two_nodes.py": "ray-cluster", "test_ray_cluster_env.py": "ray-cluster"}


def pytest_collection_modifyitems(config, items):
    """Slow files first, each file (or SAME_WORKER group) one xdist unit; every worker sorts alike."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: file order otherwise kept
    for item in items:
        item.add_marker(pytest.mark.xdist_group(SAME_WORKER.get(item.path.name, str(item.path))))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh PROMPT_R1_HOME (warehouse, MLflow, checkpoints) for one test."""
    monkeypatch.setenv("PROMPT_R1_HOME", str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    runs = sys.modules.get("tasks.tracking.runs")  # a config's tracking.uri set up by an earlier test
    if runs is not None:
        monkeypatch.setattr(runs, "_configured", None)
    return tmp_path / "runs"


@pytest.fixture
def warehouse(home):
    from warehouse.store import Warehouse

    with Warehouse(home / "warehouse.duckdb") as wh:
        yield wh


@pytest.fixture(scope="session")
def tiny_model_path(_model_cache):
    from prompt_r1.models.bundled import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def smollm2_path(_model_cache):
    from prompt_r1.models.bundled import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA
