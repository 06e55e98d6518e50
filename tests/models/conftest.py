"""Fixtures of the agent-model tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from prompt_r1.models.bundled import bundled_folder, resolve_model

SHARED = ("tiny", "tiny-protocol")


@pytest.fixture
def models_home(_model_cache, tmp_path, monkeypatch) -> Path:
    """A fresh models home whose bundled tiny models are the session's (linked, not rebuilt): the
    merged agents of adapter folders land there."""
    home = tmp_path / "models"
    home.mkdir()
    for name in SHARED:
        (home / bundled_folder(name).name).symlink_to(resolve_model(name))
    monkeypatch.setenv("PROMPT_R1_MODELS", str(home))
    return home
