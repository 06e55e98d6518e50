"""Shared fixtures: an isolated run home per test, one model cache per session, the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Before any test module imports huggingface_hub, which reads it once: a hub id fails at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
SHARED_DATA = Path(os.environ.get("PROMPT_R1_SHARED_DATA", ROOT.parent / "shared" / "data" / "prompt-r1"))


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """One model cache for the session: tiny models and SmolLM2 are built once."""
    cache = os.environ.get("PROMPT_R1_MODELS") or str(tmp_path_factory.mktemp("models"))
    os.environ["PROMPT_R1_MODELS"] = cache
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Path(cache)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh PROMPT_R1_HOME (warehouse, MLflow, checkpoints) for one test."""
    monkeypatch.setenv("PROMPT_R1_HOME", str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
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
