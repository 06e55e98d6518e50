"""The environment LLM contract shared by every backend (OpenAI-compatible URL, managed vLLM, in-process).

The rollout loop and the evaluation only ever talk to an `Environment`: they hand it the
conversation so far and get back an `EnvReply`, the reply text plus an `EnvCall` record (token
usage, latency, attempts, cache hit, error). A call that fails after its retries does not
raise: it returns an error text the agent sees (`[environment error: ...]`) and the reason in
`call.error`, so one bad call never kills a rollout batch and every failure is recorded.

`Environment.reply` is the one entry of every backend: it checks the messages, puts the configured
system message first (`with_system`), answers from the reply cache when the environment has one,
else calls the backend's `generate` and stores a successful reply.

The reply cache (`ReplyCache`) is the one place an environment's replies are read from and written
to the warehouse (`Warehouse.cache_get/put`, table `env_cache`), for every kind: an environment has
one when it was opened with a warehouse and its config has `cache: true`; a hit makes no call and
has `cached=True`, `attempts=0`; a failed call is never stored; a cache that cannot be read or
written is logged and skipped. Who opens an environment with a warehouse decides what is cached:
evaluation and the prompt-optimisation baselines do (reruns exact and free), as do the LLM judges
(`env.judge`, which also read it before opening their environment, so a rerun the cache answers
never loads the judge model); training rollouts, validation and serving do not (a sampled rollout
must be a fresh draw).

Also here: the reply-cache key (`sent_key`: sha256 of canonical JSON of everything that can change a reply:
the endpoint, model, chat template, messages and sampling settings) and the cost of a call from
the config's prices.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.core.cost_reward import call_cost
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.trajectory import EnvCall

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

ERROR_PREFIX = "[environment error: "
MAX_ERROR_CHARS = 300


@dataclass
class EnvReply:
    """What one environment call produced."""

    text: str  # the reply text the agent sees (an error text when the call failed)
    call: EnvCall  # usage, latency, attempts, cached, error (None on success)


def error_text(reason: str) -> str:
    """The text the agent sees for a failed call.

    >>> error_text("timeout after 2s")
    '[environment error: timeout after 2s]'
    """
    return f"{ERROR_PREFIX}{reason}]"


def short_reason(reason: str, limit: int = MAX_ERROR_CHARS) -> str:
    """One line, at most `limit` characters (server error bodies can be long HTML pages).

    >>> short_reason("line one\\n  line two")
    'line one line two'
    >>> len(short_reason("x" * 1000, limit=20))
    20
    """
    text = " ".join(str(reason).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_system(cfg: EnvConfig, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """`messages` after the configured system message (unchanged when none is set or one is there).

    >>> with_system(EnvConfig(system_prompt="Be brief."), [{"role": "user", "content": "hi"}])
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
    >>> with_system(EnvConfig(system_prompt=None), [{"role": "user", "content": "hi"}])
    [{'role': 'user', 'content': 'hi'}]
    """
    if not cfg.system_prompt or (messages and messages[0].get("role") == "system"):
        return list(messages)
    return [{"role": "system", "content": cfg.system_prompt}, *messages]


def sampling_settings(cfg: EnvConfig) -> dict[str, Any]:
    """The request settings that change a reply, hence part of the cache key."""
    return {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "seed": cfg.seed, "stop": list(cfg.stop), "system_prompt": cfg.system_prompt or None}


def endpoint_identity(cfg: EnvConfig) -> dict[str, Any]:
    """What answers a request: the server (its base URL, or for a managed vLLM server, whose URL
    changes every start, the model it serves), the model name and the chat template.

    >>> endpoint_identity(EnvConfig(kind="openai", base_url="http://a:1/v1/", model="m"))["endpoint"]
    'http://a:1/v1'
    >>> endpoint_identity(EnvConfig(kind="vllm", base_url="http://127.0.0.1:5/v1", model="m"))["endpoint"]
    'managed-vllm:m'
    """
    if cfg.kind == "openai":
        endpoint = (cfg.base_url or "").rstrip("/")
    else:
        path = Path(cfg.model).expanduser()
        served = str(path.resolve()) if path.exists() else cfg.model  # a folder: the same one from any cwd
        endpoint = f"managed-{cfg.kind}:{served}"
    return {"endpoint": endpoint, "model": cfg.model, "chat_template": cfg.chat_template}


def reply_cache_key(cfg: EnvConfig, messages: list[dict[str, str]]) -> str:
    """The reply-cache key of sending `messages` (as sent, system message included) under `cfg`."""
    return cache_key(endpoint_identity(cfg), messages, sampling_settings(cfg))


def cache_key(identity: dict[str, Any], messages: list[dict[str, str]], sampling: dict[str, Any]) -> str:
    """sha256 of canonical JSON (sorted keys, no spaces) of endpoint identity, messages and sampling.

    Key order inside dicts does not matter; message order does.

    >>> who = {"endpoint": "http://a/v1", "model": "m", "chat_template": None}
    >>> a = cache_key(who, [{"role": "user", "content": "hi"}], {"temperature": 0, "top_p": 1})
    >>> b = cache_key(dict(reversed(who.items())), [{"content": "hi", "role": "user"}], {"top_p": 1, "temperature": 0})
    >>> a == b, len(a)
    (True, 64)
    >>> a == cache_key({**who, "endpoint": "http://b/v1"}, [{"role": "user", "content": "hi"}], {"temperature": 0, "top_p": 1})
    False
    """
    payload = {"identity": identity, "messages": messages, "sampling": sampling}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def cost_usd(cfg: EnvConfig, prompt_tokens: int, completion_tokens: int) -> float:
    """Price of the given usage under the config's per-1k-token prices.

    >>> cfg = EnvConfig(price_per_1k_prompt=0.15, price_per_1k_completion=0.6)
    >>> round(cost_usd(cfg, 2000, 500), 6)
    0.6
    """
    return call_cost(prompt_tokens, completion_tokens, cfg.price_per_1k_prompt, cfg.price_per_1k_completion)


def sent_key(cfg: EnvConfig, messages: list[dict[str, str]]) -> str:
    """The cache key of sending `messages` under `cfg` (the system message is added as the environment
    sends it, so a list that already has it gets the same key)."""
    return reply_cache_key(cfg, with_system(cfg, messages))


class ReplyCache:
    """One environment's replies in the warehouse, keyed on what can change them."""

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse"):
        self.cfg, self.warehouse = cfg, warehouse

    @classmethod
    def of(cls, cfg: EnvConfig, warehouse: "Warehouse | None") -> "ReplyCache | None":
        """The cache of `cfg`'s replies in `warehouse`; None without a warehouse or with `cache: false`."""
        return cls(cfg, warehouse) if warehouse is not None and cfg.cache else None

    def key(self, messages: list[dict[str, str]]) -> str:
        return sent_key(self.cfg, messages)

    def get(self, messages: list[dict[str, str]]) -> tuple[str, int, int] | None:
        """(reply text, prompt tokens, completion tokens) stored for `messages`, or None."""
        try:
            return self.warehouse.cache_get(self.key(messages))
        except Exception as err:  # a cache problem must not fail the call
            log.warning("environment %s: reply cache read failed: %s", self.cfg.name, short_reason(str(err)))
            return None

    def put(self, messages: list[dict[str, str]], text: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Store a successful reply to `messages`."""
        try:
            self.warehouse.cache_put(self.key(messages), self.cfg.model, text, prompt_tokens, completion_tokens)
        except Exception as err:
            log.warning("environment %s: reply cache write failed: %s", self.cfg.name, short_reason(str(err)))


class Environment(abc.ABC):
    """An environment LLM: `reply()` never raises for call failures (see module docstring)."""

    name: str
    model: str

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse | None" = None):
        self.cfg = cfg
        self.name = cfg.name
        self.model = cfg.model
        self.cache = ReplyCache.of(cfg, warehouse)  # None: every call is made

    async def reply(self, messages: list[dict[str, str]], turn: int = 0) -> EnvReply:
        """The environment's reply to `messages` (OpenAI chat format: role + content): from the
        reply cache when it holds one, else the backend's (`generate`), stored when it succeeded."""
        started = time.perf_counter()
        problem = check_messages(messages)
        if problem:
            return self.failed(turn, f"{problem} (environment {self.name})", started, attempts=0)
        messages = with_system(self.cfg, messages)
        # the cache is read and written on the event loop (a point query): calls made together still
        # reach the backend together (the in-process batcher gathers them into one generate)
        cache = self.cache
        if cache is not None and (hit := cache.get(messages)) is not None:
            text, prompt_tokens, completion_tokens = hit
            return EnvReply(text, self.new_call(turn, prompt_tokens=int(prompt_tokens),
                                                completion_tokens=int(completion_tokens),
                                                latency_s=time.perf_counter() - started, attempts=0, cached=True))
        reply = await self.generate(messages, turn, started)
        if cache is not None and reply.call.error is None:
            cache.put(messages, reply.text, reply.call.prompt_tokens, reply.call.completion_tokens)
        return reply

    @abc.abstractmethod
    async def generate(self, messages: list[dict[str, str]], turn: int, started: float) -> EnvReply:
        """The backend's reply to `messages` as sent (checked, the system message first); `started`
        is the call's `time.perf_counter()` start, for its latency. Never raises for call failures."""

    async def aclose(self) -> None:
        """Release clients and threads; the environment must not be used afterwards."""

    def new_call(self, turn: int, **fields: Any) -> EnvCall:
        """An `EnvCall` stamped with this environment's name and model."""
        return EnvCall(turn=turn, env_name=self.name, model=self.model, **fields)

    def failed(self, turn: int, reason: str, started: float, attempts: int) -> EnvReply:
        """The reply of a call that failed: error text for the agent, reason in `call.error`."""
        reason = short_reason(reason)
        call = self.new_call(turn, latency_s=time.perf_counter() - started, attempts=attempts, error=reason)
        return EnvReply(text=error_text(reason), call=call)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r})"


def check_messages(messages: list[dict[str, str]]) -> str | None:
    """Why `messages` cannot be sent (None when fine): a list of role/content string dicts.

    >>> check_messages([{"role": "user", "content": "hi"}]) is None
    True
    >>> check_messages([])
    'no messages to send'
    >>> check_messages([{"role": "user"}])
    'message 0 needs string `role` and `content`'
    """
    if not messages:
        return "no messages to send"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            return f"message {i} needs string `role` and `content`"
    return None
