"""A config's registered agent (`prompt-r1-smoke` for configs/smoke.yaml) is a real MLflow model:
logged as pyfunc with the agent folder, loaded back from `models:/prompt-r1-smoke@champion`,
answering like the library does; the `champion` alias still marks the best validation score;
`mlflow models serve` serves it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prompt_r1.config.experiment import load_config

CHAMPION = "models:/prompt-r1-smoke@champion"


@pytest.fixture
def registry(home, monkeypatch):
    """An MLflow sqlite store in the test's run home with two registered tiny agents."""
    import mlflow

    from prompt_r1.models import resolver as agent_resolver
    from prompt_r1.models.bundled import resolve_model
    from tasks.tracking.registry import register_agent
    from tasks.tracking.runs import setup_mlflow

    cfg = load_config("configs/smoke.yaml", {})
    setup_mlflow("smoke")
    agent = Path(resolve_model("tiny-protocol"))
    versions = []
    for score in (0.5, 0.2, 0.7):  # the middle one must not take the alias
        with mlflow.start_run() as run:
            versions.append(register_agent(run.info.run_id, agent, score, cfg))
        registered = mlflow.MlflowClient().get_model_version("prompt-r1-smoke", versions[-1][0])
        assert registered.run_id == run.info.run_id  # the version stays linked to its training run
    monkeypatch.setattr(agent_resolver, "_schemes", {})
    return cfg, agent, versions


def _library_answer(cfg, agent: Path, question: str) -> str:
    from prompt_r1.serving.service import answer_question
    from prompt_r1.env import open_environment
    from prompt_r1.evaluation.evaluate import eval_agent
    from prompt_r1.policy import make_policy

    policy = make_policy(eval_agent(cfg), agent, seed=cfg.seed)
    with open_environment(cfg.environment) as env:
        async def run():
            try:
                return await answer_question(policy, env, question, cfg)
            finally:
                await env.aclose()

        return asyncio.run(run()).answer


def test_champion_is_a_pyfunc_model_that_answers(registry):
    import mlflow
    import pandas as pd

    from prompt_r1.models.resolver import register_scheme, resolve_agent
    from tasks.tracking.registry import registry_agent_path
    from tasks.tracking.runs import tracking_uri

    cfg, agent, versions = registry
    assert [v for v, _ in versions] == ["1", "2", "3"]
    assert [became for _, became in versions] == [True, False, True]   # 0.5 first, 0.2 no, 0.7 yes
    mlflow.set_tracking_uri(tracking_uri())
    model = mlflow.pyfunc.load_model(CHAMPION, model_config={"environment": "tiny-env"})
    questions = ["Who painted the Mona Lisa?", "What is 3 times 4?"]
    out = model.predict(pd.DataFrame({"question": questions}))
    assert list(out["question"]) == questions
    for question, answer, episode in zip(questions, out["answer"], out["episode"]):
        assert answer == _library_answer(cfg, agent, question)
        report = json.loads(episode)
        assert report["question"] == question and report["environment"] == "tiny-env"
        assert report["usage"]["prompt_tokens"] == report["usage"]["agent_prompt_tokens"] + sum(
            c["prompt_tokens"] for c in report["env_calls"])
    with pytest.raises(ValueError, match="no environment named 'nope'"):
        model.predict(pd.DataFrame({"question": ["x"]}), params={"environment": "nope"})

    # The resolver reaches the same folder through the registry hook the CLI installs.
    register_scheme("models", registry_agent_path)
    folder = resolve_agent(CHAMPION)
    assert (folder / "config.json").read_bytes() == (agent / "config.json").read_bytes()
    assert (folder / "model.safetensors").read_bytes() == (agent / "model.safetensors").read_bytes()
    # built beside and renamed in: the version folder holds the agent only, its parent no temp folders
    assert [p.name for p in folder.parent.iterdir()] == ["agent"]
    assert [p.name for p in folder.parent.parent.iterdir()] == [folder.parent.name]
    shutil.rmtree(folder)                                                 # a download cut short earlier
    (folder.parent / "partial.bin").write_text("x")
    assert resolve_agent(CHAMPION) == folder and [p.name for p in folder.parent.iterdir()] == ["agent"]
    assert resolve_agent(None, default_model="tiny", cfg=cfg) == folder   # default: the config's champion
    assert resolve_agent("models:/prompt-r1-smoke/2").parent.name == "v2"
    from prompt_r1.models.resolver import AgentSpecError

    with pytest.raises(AgentSpecError, match="not in the registry"):
        resolve_agent("models:/prompt-r1-smoke@nobody")


@pytest.mark.slow
def test_mlflow_models_serve_answers(registry, tmp_path):
    from tasks.tracking.runs import tracking_uri

    from tests.serving.test_ask_serve import free_port

    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri(), "MLFLOW_REGISTRY_URI": tracking_uri(),
           "PATH": f"{mlflow_bin.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # it execs `uvicorn`
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(mlflow_bin), "models", "serve", "-m", CHAMPION, "--env-manager", "local",
                             "-p", str(port), "-h", "127.0.0.1"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow models serve did not come up in 300 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        reply = httpx.post(f"http://127.0.0.1:{port}/invocations", timeout=120, json={
            "dataframe_records": [{"question": "Who painted the Mona Lisa?"}], "params": {"environment": "tiny-env"}})
        assert reply.status_code == 200, reply.text
        row = reply.json()["predictions"][0]
        cfg, agent, _ = registry
        assert row["answer"] == _library_answer(cfg, agent, "Who painted the Mona Lisa?")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
