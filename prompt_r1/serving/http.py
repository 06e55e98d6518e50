"""An OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of a trained agent.

Each environment of the config is one served model, `prompt-r1:<environment name>`. A chat
completion's last user message is the question; the assistant message is the agent's final
answer; `usage` counts the agent's and the environment's tokens; the top-level `prompt_r1`
field carries the episode (turns, environment calls, cost). `stream: true` sends the role
chunk at once, then the answer and a last chunk with `usage` and `prompt_r1`.

All requests share one agent (`BatchingPolicy`: their generation steps join common batches)
and one client per environment, on one event loop; there is no per-request lock. Limits: body
size, question length, concurrent episodes (others wait up to `queue_timeout_s`, then 503),
turns and environment reply tokens (can only tighten the config's), and a deadline per episode.
Bad requests get a 4xx naming the problem (the fields the server reads are strictly typed, so a
string `stream` or a negative `max_tokens` is a 400 naming the field, not a guess); a failing environment gives 502 (504 on a timeout)
naming it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import time
import uuid
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prompt_r1.config.experiment import Config, DataConfig
from prompt_r1.policy.base import Policy

log = logging.getLogger(__name__)
MODEL_PREFIX = "prompt-r1:"
_UNION_TAG = re.compile(r"str|int|float|bool|none|list\[.*\]")  # pydantic's names of union branches


class ServeConfig(BaseModel):
    """Limits and batching of `prompt-r1 serve`."""

    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest request body accepted (413 above).")
    max_question_chars: int = Field(DataConfig.model_fields["max_question_chars"].default, ge=1,
                                    description="Longest question (last user message) accepted, in characters; "
                                    "HTTP 400 above. `prompt-r1 serve` and `create_app` without limits use the "
                                    "config's data.max_question_chars (default 20,000).")
    max_concurrent: int = Field(64, ge=1, description="Episodes running at once; later requests wait.")
    queue_timeout_s: float = Field(60.0, gt=0, description="How long a request waits for a slot before a 503.")
    request_timeout_s: float = Field(300.0, gt=0, description="Deadline of one episode (504 after it).")
    max_turns: int | None = Field(None, ge=1, description="Cap on agent generations per episode "
                                  "(the config's eval max_turns when lower or unset).")
    max_env_reply_tokens: int | None = Field(None, ge=1, description="Cap on the environment reply tokens "
                                             "the agent reads (the config's when lower or unset).")
    batch_window_s: float = Field(0.01, ge=0, description="How long the agent waits to batch generation "
                                  "steps of concurrent episodes.")
    trace: bool = Field(False, description="Hand each episode, failed ones included, to the registered episode "
                        "observers (`prompt-r1 serve --trace`: one MLflow trace per request).")
    max_batch_rows: int = Field(64, ge=1, description="Most episodes in one agent generation batch.")


class HTTPFailure(Exception):
    """A request that ends with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}


class _ContentPart(BaseModel):
    """One part of a message's content list; only `text` parts are read, other kinds pass."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[_ContentPart] | None = None


class _ChatRequest(BaseModel):
    """The chat-completion fields the server reads or must refuse when malformed: strict types,
    so `"stream": "false"` is an error rather than a truthy string, and `max_tokens: -1` or
    `"10"` is an error rather than ignored. Other OpenAI fields pass unread."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    messages: list[_Message]
    stream: bool = False
    n: int = 1
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)


def _field_error(err: ValidationError) -> HTTPFailure:
    """400 naming the bad field by its path (`messages.0.content.1.text`) and what it got: of a
    union's errors the deepest one (a content list with a bad part beats "not a string"), with
    pydantic's union branch names (`str`, `list[_ContentPart]`) left out of the path."""
    errors = err.errors(include_url=False)
    first = max(errors, key=lambda e: len(e["loc"]))
    where = ".".join(str(p) for p in first["loc"] if not _UNION_TAG.fullmatch(str(p))) or "body"
    got = first.get("input")
    shown = f" (got {json.dumps(got)[:60]})" if isinstance(got, str | int | float | bool) else ""
    return HTTPFailure(400, f"`{where}`: {first['msg']}{shown}")


def _surrogate_field(body: Any) -> str | None:
    """Dotted path (`messages.0.content`; `body` for a key at the top) of the first string, key or
    value, in a parsed JSON body that holds a lone surrogate, or None. Walked without recursion: a
    body may nest as deep as the parser allowed.

    >>> _surrogate_field({"messages": [{"role": "user", "content": "a" + chr(0xD800)}]})
    'messages.0.content'
    >>> _surrogate_field({"model": "m", "n": 1, "x": [[{"y": "ok"}]]}) is None
    True
    """
    from prompt_r1.serving.service import first_surrogate

    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str) and first_surrogate(value) is not None:
            return path or "body"
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in reversed(list(items)):
            if isinstance(key, str) and first_surrogate(key) is not None:
                return path or "body"
            todo.append((f"{path}.{key}" if path else str(key), item))
    return None


def parse_request(raw: bytes, served: dict[str, Any], limits: ServeConfig) -> tuple[str, str, bool]:
    """(environment name, question, stream) of a chat-completion body, or HTTPFailure (4xx)."""
    try:
        body = json.loads(raw)
    except RecursionError:  # Python's parser recurses per level: a 256 KiB body can nest deeper
        raise HTTPFailure(400, "request body is nested too deeply") from None
    except ValueError as err:
        raise HTTPFailure(400, f"request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise HTTPFailure(400, "request body must be a JSON object")
    where = _surrogate_field(body)
    if where is not None:  # `\ud800` parses, but is no text: it cannot be encoded, echoed or tokenised
        raise HTTPFailure(400, f"`{where}`: holds a lone UTF-16 surrogate (a `\\ud800`-`\\udfff` escape "
                          "without its pair), which is not text; send valid Unicode")
    model = body.get("model")
    if isinstance(model, str) and model not in served:
        raise HTTPFailure(404, f"unknown model {model!r}; served models: {', '.join(served)}", code="model_not_found")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise HTTPFailure(400, "`messages` must be a non-empty list of {role, content}")
    try:
        request = _ChatRequest.model_validate(body)
    except ValidationError as err:
        raise _field_error(err) from None
    users = [m for m in request.messages if m.role == "user"]
    if not users:
        raise HTTPFailure(400, "`messages` holds no user message: the last user message is the question")
    content = users[-1].content
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(p.text or "" for p in content if p.type == "text")
    if not isinstance(content, str) or not content.strip():
        raise HTTPFailure(400, "the last user message has no text")
    if len(content) > limits.max_question_chars:
        raise HTTPFailure(400, f"question has {len(content)} characters; the limit is {limits.max_question_chars}")
    if request.n != 1:
        raise HTTPFailure(400, "only n=1 is supported (the agent answers greedily)")
    return request.model[len(MODEL_PREFIX):], content, request.stream


def env_http_failure(env_name: str, reason: str) -> HTTPFailure:
    """502, or 504 for a timeout, naming the environment."""
    timeout = "timeout" in reason.lower() or "timed out" in reason.lower()
    return HTTPFailure(504 if timeout else 502, f"environment {env_name!r} failed: {reason}",
                       kind="environment_error", code="environment_timeout" if timeout else "environment_error")


class AgentServer:
    """The served agent: policy, open environments, limits; `episode()` answers one question."""

    def __init__(self, cfg: Config, policy: Policy, agent_name: str, limits: ServeConfig,
                 envs: dict[str, Any] | None = None):
        from prompt_r1.serving.service import config_environments

        self.cfg, self.policy, self.agent_name, self.limits = cfg, policy, agent_name, limits
        self.env_cfgs = config_environments(cfg)
        self.envs: dict[str, Any] = dict(envs or {})
        self.slots = asyncio.Semaphore(limits.max_concurrent)
        self.created = int(time.time())

    @property
    def served(self) -> dict[str, Any]:
        return {MODEL_PREFIX + name: cfg for name, cfg in self.env_cfgs.items()}

    async def episode(self, env_name: str, question: str) -> dict[str, Any]:
        """The episode report of `question` against `env_name`, or HTTPFailure."""
        from prompt_r1.serving.service import answer_question, env_failure, episode_report

        try:
            await asyncio.wait_for(self.slots.acquire(), self.limits.queue_timeout_s)
        except TimeoutError:
            raise HTTPFailure(503, f"server busy: {self.limits.max_concurrent} episodes running for longer "
                              f"than {self.limits.queue_timeout_s}s; retry later", kind="server_busy") from None
        started = time.perf_counter()
        try:
            traj = await asyncio.wait_for(
                answer_question(self.policy, self.envs[env_name], question, self.cfg, self.limits.max_turns,
                                self.limits.max_env_reply_tokens), self.limits.request_timeout_s)
        except TimeoutError:
            raise HTTPFailure(504, f"episode against environment {env_name!r} took longer than "
                              f"{self.limits.request_timeout_s}s", kind="environment_error",
                              code="environment_timeout") from None
        finally:
            self.slots.release()
        if self.limits.trace:
            from prompt_r1.serving.observers import report_episode

            await asyncio.to_thread(report_episode, "serve", self.cfg, self.env_cfgs[env_name], question, traj)
        failure = env_failure(traj)
        if failure:
            raise env_http_failure(env_name, failure)
        return episode_report(question, traj, self.env_cfgs[env_name], self.agent_name,
                              time.perf_counter() - started)


def _completion(report: dict[str, Any], model: str, completion_id: str, created: int) -> dict[str, Any]:
    usage = report["usage"]
    return {
        "id": completion_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": report["answer"]},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                  "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
        "prompt_r1": report,
    }


def _chunk(completion_id: str, created: int, model: str, delta: dict, finish: str | None = None,
           **extra: Any) -> str:
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
    return f"data: {json.dumps(body)}\n\n"


def build_app(server: AgentServer, lifespan: Any = None):
    """The FastAPI app over `server` (its environments opened by `lifespan`, when given)."""
    app = FastAPI(title="prompt-r1 agent", lifespan=lifespan)

    @app.exception_handler(HTTPFailure)
    async def _failure(_: Request, err: HTTPFailure) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": mid, "object": "model", "created": server.created, "owned_by": "prompt-r1",
             "agent": server.agent_name, "env_model": cfg.model} for mid, cfg in server.served.items()]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, and how the agent's generation batches were shared so far."""
        policy = server.policy
        return {"status": "ok", "agent_batches": getattr(policy, "calls", None),
                "agent_batch_rows": getattr(policy, "rows", None),
                "most_episodes_in_one_batch": getattr(policy, "max_jobs", None)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > server.limits.max_body_bytes:
            raise HTTPFailure(413, f"request body of {length} bytes exceeds {server.limits.max_body_bytes}")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > server.limits.max_body_bytes:
                raise HTTPFailure(413, f"request body exceeds {server.limits.max_body_bytes} bytes")
        env_name, question, stream = parse_request(bytes(raw), server.served, server.limits)
        model = MODEL_PREFIX + env_name
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not stream:
            return _completion(await server.episode(env_name, question), model, completion_id, created)
        task = asyncio.create_task(server.episode(env_name, question))

        async def events():
            try:
                yield _chunk(completion_id, created, model, {"role": "assistant", "content": ""})
                try:
                    report = await task
                except HTTPFailure as err:
                    yield f"data: {json.dumps(err.body())}\n\n"
                    return
                yield _chunk(completion_id, created, model, {"content": report["answer"]})
                full = _completion(report, model, completion_id, created)
                yield _chunk(completion_id, created, model, {}, "stop", usage=full["usage"], prompt_r1=report)
                yield "data: [DONE]\n\n"
            finally:
                task.cancel()  # a client that hangs up stops its episode

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def create_app(cfg: Config, agent_path: Path, limits: ServeConfig | None = None, log_dir: Path | None = None):
    """(FastAPI app, AgentServer) for the agent at `agent_path`; the app's lifespan opens every
    environment of `cfg` (managed vLLM servers start there) and closes them at shutdown. Call
    `server.policy.close()` after the app stops."""
    from prompt_r1.serving.service import BatchingPolicy
    from prompt_r1.env import open_environment
    from prompt_r1.evaluation.evaluate import eval_agent
    from prompt_r1.policy import make_policy

    limits = limits or ServeConfig(max_question_chars=cfg.data.max_question_chars)
    policy = BatchingPolicy(make_policy(eval_agent(cfg), agent_path, seed=cfg.seed),
                            limits.batch_window_s, limits.max_batch_rows)
    server = AgentServer(cfg, policy, str(agent_path), limits)

    @asynccontextmanager
    async def lifespan(_app):
        # Each episode holds one worker thread while the agent generates: room for all of them.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(limits.max_concurrent + 8, thread_name_prefix="episode"))
        with ExitStack() as stack:
            for name, env_cfg in server.env_cfgs.items():
                server.envs[name] = stack.enter_context(open_environment(env_cfg, log_dir=log_dir))
            try:
                yield
            finally:
                for env in server.envs.values():
                    await env.aclose()

    return build_app(server, lifespan), server


def serve_agent(cfg: Config, agent_path: Path, host: str = "127.0.0.1", port: int = 8000,
                limits: ServeConfig | None = None, log_dir: Path | None = None) -> None:
    """Load the agent, open every environment of `cfg`, and serve until interrupted."""
    import uvicorn

    limits = limits or ServeConfig(max_question_chars=cfg.data.max_question_chars)
    app, server = create_app(cfg, agent_path, limits, log_dir)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info",
                    limit_concurrency=limits.max_concurrent * 4, timeout_graceful_shutdown=10)
    finally:
        server.policy.close()
