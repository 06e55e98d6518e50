"""A hub id that cannot load is refused in seconds, naming the setting, instead of after the hub
client's minute of retries; one that may load (cached, reachable, behind a proxy) is let through."""

from __future__ import annotations

import socket
import time

import pytest

from prompt_r1.models.bundled import ModelLoadError, hub_refusal, model_load_errors

REPO = "no-such-org/no-such-model"


@pytest.fixture
def online(monkeypatch, tmp_path):
    """No offline setting, no proxy, an empty hub cache."""
    import huggingface_hub.constants

    for key in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _cache(hub, repo_id: str) -> None:
    """The layout the hub client writes: refs/main naming a snapshot that holds config.json."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_offline_and_not_cached_is_refused(online, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in hub_refusal(REPO)


def test_a_cached_model_may_load_even_offline(online, monkeypatch):
    _cache(online, REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_refusal(REPO) is None


def test_an_unreachable_endpoint_is_refused_at_once(online, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    reason = hub_refusal(REPO)
    assert reason is not None and f"127.0.0.1:{port}" in reason and "cannot be reached" in reason
    assert time.monotonic() - started < 3  # a refused connect, not the client's retries


def test_a_reachable_endpoint_or_a_proxy_lets_it_through(online, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_refusal(REPO) is None
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub_refusal(REPO) is None  # a direct connect says nothing about the proxied one


def test_not_a_repository_name_is_left_to_the_loader(online):
    assert hub_refusal("a/b/c") is None


def test_model_load_errors_refuses_before_loading_and_names_the_role(online, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = []
    with pytest.raises(ModelLoadError) as err:
        with model_load_errors(REPO, "agent.model"):
            loaded.append(True)
    assert not loaded
    assert str(err.value).startswith(f"agent.model: cannot load model {REPO!r}")
    assert "hub id" in str(err.value) and "bundled model" in str(err.value)


def test_bundled_names_and_folders_are_never_probed(online, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("tiny", tmp_path):
        with model_load_errors(name, "agent.model"):
            pass
