"""Using a trained agent: the one agent resolver, `prompt-r1 ask`, and the OpenAI-compatible
server tested with the official `openai` client against a live uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from prompt_r1.models import resolver as agent_resolver
from prompt_r1.models.resolver import AgentSpecError, resolve_agent
from prompt_r1.serving.service import BatchingPolicy
from prompt_r1.config.experiment import load_config
from prompt_r1.policy.base import Policy, Sample
from prompt_r1.core.protocol import extract_answer


# -- the resolver ------------------------------------------------------------------------------
def _hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def no_schemes(monkeypatch):
    monkeypatch.setattr(agent_resolver, "_schemes", {})


def test_resolver_accepts_every_form_and_names_what_it_tried(home, no_schemes, tmp_path):
    plain = _hf_folder(tmp_path / "plain")
    assert resolve_agent(str(plain)) == plain.resolve()
    exported = _hf_folder(home / "smoke" / "run-1" / "agent")
    assert resolve_agent(str(home / "smoke" / "run-1")) == exported.resolve()       # run folder
    assert resolve_agent("run-1") == exported.resolve()                              # run id, any config
    assert resolve_agent("run-1", config_name="smoke") == exported.resolve()
    (home / "smoke" / "run-2" / "checkpoints").mkdir(parents=True)
    with pytest.raises(AgentSpecError, match="no exported agent.*prompt-r1 export"):
        resolve_agent("run-2")
    with pytest.raises(AgentSpecError, match="not a bundled model.*models:/"):
        resolve_agent("no-such-thing")
    with pytest.raises(AgentSpecError, match="no resolver for `models:/`"):
        resolve_agent("models:/prompt-r1-agent@champion")
    from prompt_r1.models.bundled import resolve_model

    assert resolve_agent("tiny") == Path(resolve_model("tiny"))


def test_resolver_default_is_the_champion_when_the_registry_has_one(home, no_schemes, tmp_path):
    champion = _hf_folder(tmp_path / "champion")
    base = _hf_folder(tmp_path / "base")
    registry: dict[str, Path] = {}
    agent_resolver.register_scheme("models", lambda uri: registry.get(uri))
    assert resolve_agent(None, default_model=str(base), config_name="smoke") == base.resolve()  # empty registry
    registry["models:/prompt-r1-smoke@champion"] = champion                                      # the config's own
    assert resolve_agent(None, default_model=str(base), config_name="smoke") == champion
    assert resolve_agent(None, default_model=str(base), config_name="demo") == base.resolve()  # another task's: not
    assert resolve_agent("models:/prompt-r1-smoke@champion") == champion
    with pytest.raises(AgentSpecError, match="not in the registry"):
        resolve_agent("models:/prompt-r1-smoke/7")


# -- shared generation batches -----------------------------------------------------------------
class EchoPolicy(Policy):
    """Each sample is a pure function of its own prompt, so a mixed-up batch is visible."""

    tokenizer = None

    def __init__(self):
        self.batches: list[int] = []

    @staticmethod
    def expected(prompt: list[int], seed: int | None) -> str:
        return f"<answer>{sum(prompt)}-{len(prompt)}-{seed}</answer>"

    def generate(self, prompts, max_new_tokens, seeds=None):
        self.batches.append(len(prompts))
        time.sleep(0.002)
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        return [Sample([1], [0.0], self.expected(p, s), "stop") for p, s in zip(prompts, seeds, strict=True)]

    def load_weights(self, state_dict):
        pass


def test_batching_policy_returns_each_caller_its_own_rows_and_shares_batches():
    inner = EchoPolicy()
    policy = BatchingPolicy(inner, window_s=0.02, max_rows=16)
    rng = random.Random(0)
    calls = [[[rng.randrange(100) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(1, 5))]
             for _ in range(200)]
    seeds = [[rng.randrange(10**9) for _ in prompts] for prompts in calls]
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: policy.generate(calls[i], 4, seeds[i]), range(len(calls))))
    policy.close()
    for prompts, row_seeds, samples in zip(calls, seeds, results, strict=True):
        assert [s.text for s in samples] == [EchoPolicy.expected(p, s) for p, s in zip(prompts, row_seeds)]
    assert sum(inner.batches) == sum(len(c) for c in calls)
    assert len(inner.batches) < len(calls) / 2       # concurrent callers really shared batches
    assert max(inner.batches) <= 16 + 5               # a single caller may exceed max_rows alone
    assert policy.max_jobs > 1


def test_batching_policy_hands_a_failure_to_every_waiting_caller():
    class Broken(EchoPolicy):
        def generate(self, prompts, max_new_tokens, seeds=None):
            raise RuntimeError("out of memory")

    policy = BatchingPolicy(Broken(), window_s=0.02)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(policy.generate, [[1, 2]], 4) for _ in range(8)]
        for f in futures:
            with pytest.raises(RuntimeError, match="out of memory"):
                f.result(timeout=30)
    policy.close()


# -- ask ---------------------------------------------------------------------------------------
def _check_report(report: dict, question: str) -> None:
    calls = report["env_calls"]
    usage = report["usage"]
    assert report["question"] == question
    assert usage["env_prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
    assert usage["env_completion_tokens"] == sum(c["completion_tokens"] for c in calls)
    assert usage["prompt_tokens"] == usage["agent_prompt_tokens"] + usage["env_prompt_tokens"]
    assert usage["completion_tokens"] == usage["agent_completion_tokens"] + usage["env_completion_tokens"]
    agent_turns = [t["text"] for t in report["turns"] if t["role"] == "agent"]
    assert report["answer"] == extract_answer(agent_turns[-1])
    assert usage["agent_prompt_tokens"] > 0 and usage["agent_completion_tokens"] > 0


def test_ask_prints_json_episode_and_turns(home):
    from typer.testing import CliRunner

    from prompt_r1.cli import app

    question = "Which river flows through Paris?"
    result = CliRunner().invoke(app, ["ask", question, "-c", "configs/smoke.yaml", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout is the JSON alone: logs go to stderr
    _check_report(report, question)
    traj = report["trajectory"]
    assert sum(traj["loss_mask"]) == report["usage"]["agent_completion_tokens"]
    assert len(traj["prompt_ids"]) == report["usage"]["agent_prompt_tokens"]

    shown = CliRunner().invoke(app, ["ask", question, "-c", "configs/smoke.yaml", "--agent", "tiny-protocol"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert f"answer: {report['answer']}" in text
    for turn in report["turns"][:-1]:  # each interaction prompt as it was sent
        if turn["role"] == "agent":
            prompt = turn["text"].split("<interaction_prompt>")[1].split("</interaction_prompt>")[0].strip()
            assert f"agent -> {prompt}" in text
    bad = CliRunner().invoke(app, ["ask", question, "-c", "configs/smoke.yaml", "--env", "nope"])
    assert bad.exit_code == 2 and "no environment named 'nope'" in " ".join(bad.stdout.split())


# -- the server --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 in a thread, up within a deadline."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.1)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture(scope="module")
def live():
    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.serving.http import ServeConfig, create_app

    cfg = load_config("configs/smoke.yaml", {})
    app, server = create_app(cfg, resolve_agent("tiny-protocol"), ServeConfig(max_body_bytes=4096))
    with LiveServer(app) as running:
        yield running, server
    server.policy.close()


def test_openai_client_lists_models_and_gets_the_agent_answer(live):
    running, server = live
    client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list()] == ["prompt-r1:tiny-env"]
    question = "Who wrote Hamlet?"
    reply = client.chat.completions.create(model="prompt-r1:tiny-env", messages=[
        {"role": "system", "content": "ignored"}, {"role": "user", "content": question}])
    report = reply.model_extra["prompt_r1"]
    _check_report(report, question)
    assert reply.choices[0].message.content == report["answer"]
    assert reply.usage.prompt_tokens == report["usage"]["prompt_tokens"]
    assert reply.usage.completion_tokens == report["usage"]["completion_tokens"]
    assert report["environment"] == "tiny-env" and report["error"] is None

    chunks = list(client.chat.completions.create(model="prompt-r1:tiny-env", stream=True,
                                                 messages=[{"role": "user", "content": question}]))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == report["answer"]                         # greedy: the same episode again
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.model_extra["prompt_r1"]["turns"] == report["turns"]
    assert last.usage.total_tokens == reply.usage.total_tokens


def test_bad_requests_get_a_4xx_that_says_why(live):
    running, _ = live
    client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-4'.*prompt-r1:tiny-env"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="non-empty list"):
        client.chat.completions.create(model="prompt-r1:tiny-env", messages=[])
    with pytest.raises(openai.BadRequestError, match="no user message"):
        client.chat.completions.create(model="prompt-r1:tiny-env", messages=[{"role": "system", "content": "x"}])
    too_big = httpx.post(f"{running.url}/chat/completions", timeout=30, json={
        "model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert too_big.status_code == 413 and "exceeds 4096" in too_big.json()["error"]["message"]
    not_json = httpx.post(f"{running.url}/chat/completions", content=b"{", timeout=30)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]


@pytest.fixture(scope="module")
def refusing():
    """The real app through FastAPI's TestClient, over an agent that must never be asked: a
    malformed request is refused before any episode starts."""
    from fastapi.testclient import TestClient

    from prompt_r1.serving.http import AgentServer, ServeConfig, build_app

    class NeverAsked(Policy):
        def generate(self, *args, **kwargs):
            raise AssertionError("a malformed request reached the agent")

        def load_weights(self, state_dict):
            raise AssertionError("not used")

    cfg = load_config("configs/smoke.yaml", {})
    server = AgentServer(cfg, NeverAsked(), "never-asked", ServeConfig(max_body_bytes=4096))
    with TestClient(build_app(server), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("change,field,says", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages.0.content.0.text", "valid string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": {"nested": ["x"]}}]}]},
     "messages.0.content.0.text", "valid string"),
    ({"stream": "false"}, "stream", "valid boolean"),
    ({"stream": 0}, "stream", "valid boolean"),
    ({"max_tokens": -5}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": "ten"}, "max_tokens", "valid integer"),
    ({"max_tokens": 1.5}, "max_tokens", "valid integer"),
    ({"n": "1"}, "n", "valid integer"),
])
def test_malformed_fields_get_a_400_naming_the_field(refusing, change, field, says):
    """Each is a 400 naming the field before any episode runs: no 500 from a TypeError, no
    stream because "false" is a truthy string, no bad max_tokens silently ignored."""
    body = {"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "hi"}], **change}
    reply = refusing.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"  # an error body, not an event stream
    message = reply.json()["error"]["message"]
    assert message.startswith(f"`{field}`: ") and says in message


@pytest.mark.parametrize("raw, field", [
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "hi \ud800"}]}', "messages.0.content"),
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "\udfff"}]}', "messages.0.content"),
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": [{"type": "text", '
     rb'"text": "a\udc80b"}]}]}', "messages.0.content.0.text"),
    (rb'{"model": "prompt-r1:tiny-env\ud83d", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "us\udbff", "content": "hi"}]}', "messages.0.role"),
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "hi"}], "user": "\ud800"}', "user"),
    (rb'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "hi"}], "x\ud800": 1}', "body"),
])
def test_a_lone_surrogate_in_any_string_is_a_400_naming_the_field(refusing, raw, field):
    """`\\ud800` is valid JSON but no text: it cannot be tokenised or echoed in UTF-8 (it was a 500)."""
    reply = refusing.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith(f"`{field}`: ") and "surrogate" in message
    from prompt_r1.serving.http import _surrogate_field

    paired = json.loads(raw.replace(b"\\ud800", b"\\ud83d\\ude00").replace(b"\\udfff", b"\\ud83d\\ude00"))
    if b"\\ud800" in raw or b"\\udfff" in raw:  # the same escape with its pair is an emoji, and text
        assert _surrogate_field(paired) is None


def test_deeply_nested_json_is_a_400_not_a_recursion_error(refusing):
    depth = 1900  # past Python's recursion limit, within the 4096-byte body limit
    raw = b'{"model": "prompt-r1:tiny-env", "messages": [{"role": "user", "content": "hi"}], "x": '
    raw += b"[" * depth + b"]" * depth + b"}"
    reply = refusing.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["message"] == "request body is nested too deeply"


def test_concurrent_requests_share_batches_and_never_mix_answers(live):
    """Each concurrent answer equals that question's answer asked alone (greedy), and the
    episodes' generation steps were batched together."""
    running, server = live
    questions = [f"Question {i}: what is {i} plus {i * 7}?" for i in range(12)]
    client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=300)

    def ask(q: str) -> dict:
        reply = client.chat.completions.create(model="prompt-r1:tiny-env", messages=[{"role": "user", "content": q}])
        return reply.model_extra["prompt_r1"]

    alone = [ask(q) for q in questions[:4]]
    before = server.policy.max_jobs
    with ThreadPoolExecutor(len(questions)) as pool:
        together = list(pool.map(ask, questions))
    for q, report in zip(questions, together, strict=True):
        assert report["question"] == q
    for a, b in zip(alone, together[:4], strict=True):
        assert a["turns"] == b["turns"] and a["answer"] == b["answer"]
    assert server.policy.max_jobs > max(before, 1)


def test_a_failing_environment_gives_502_naming_it(home):
    from prompt_r1.serving.http import ServeConfig, create_app

    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = load_config("configs/smoke.yaml", {
        "environment": {"name": "dead-env", "kind": "openai", "model": "m", "base_url": dead,
                        "max_retries": 0, "timeout_s": 2}})
    app, server = create_app(cfg, resolve_agent("tiny-protocol"))
    question = "What is the capital of France?"  # the tiny agent's greedy first turn asks the environment
    with LiveServer(app) as running:
        client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.APIStatusError, match="environment 'dead-env' failed") as err:
            client.chat.completions.create(model="prompt-r1:dead-env", messages=[{"role": "user", "content": question}])
        assert err.value.status_code in (502, 504)
        with pytest.raises(openai.APIError, match="environment 'dead-env' failed"):
            list(client.chat.completions.create(model="prompt-r1:dead-env", stream=True,
                                                messages=[{"role": "user", "content": question}]))
    server.policy.close()
