"""Environment client for any OpenAI-compatible chat endpoint (hosted API or a vLLM server).

Retries are this module's, not the `openai` client's (the client runs with `max_retries=0`): the
client's own backoff starts at 0.5 s whatever `backoff_s` says, and it gives up at once on a
`Retry-After` longer than its built-in limit. One call is at most `1 + cfg.max_retries` attempts;
a timeout, a connection error, HTTP 408/409/429/5xx (or any status whose `x-should-retry` header is
`true`; `false` stops retrying) and a malformed 200 body are retried, other 4xx fail at once.

The pause before retry `n` (0-based) is `backoff_s * 2**n` (at most MAX_BACKOFF_S) plus up to 25%
jitter, upward only, so no pause is shorter than `backoff_s`. A server's `Retry-After-Ms` or
`Retry-After` (seconds or an HTTP date) lengthens that pause to what it asks, up to
`cfg.max_retry_after_s`; a server that asks for longer is not retried and the call fails at once
with a message naming the cap (waiting less than asked would only draw another refusal).

Beside that the module adds:

- a failed call ends as an `EnvReply` with an error text and `call.error`, never an exception
  (the rollout batch goes on and every failure is recorded, with its attempts);
- one deadline per attempt (`cfg.timeout_s`): connecting, the headers and the whole body, so a
  server that drips bytes is cut off like one that says nothing (the client's own timeout only
  bounds each read);
- one overall deadline per call (`cfg.call_deadline_s`): slot wait, attempts and pauses;
- the response body is read in chunks and the call fails once it passes `cfg.max_reply_bytes`
  (a runaway server cannot make the client hold, parse and tokenise megabytes of reply).

An `asyncio.Semaphore(cfg.concurrency)` bounds calls in flight; a call keeps its slot while it
backs off, so fewer requests reach a server that is already refusing them. The reply cache is
`Environment.reply`'s, as for every kind (`env.base.ReplyCache`): a hit makes no request.

The API key is read from `os.environ[cfg.api_key_env]` (or "EMPTY" for local servers), handed to
the client and never kept, logged, stored, put in `repr` or in error texts (server error
bodies are scrubbed of it, since some servers echo the key they rejected).

The async client and the semaphore are bound to the event loop they were made in; they are
rebuilt when the environment is used from a new loop (evaluation runs one `asyncio.run` per
environment, Ray actors their own loop).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import openai

from prompt_r1.env.base import EnvReply, Environment, short_reason
from prompt_r1.config.base import ConfigError
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.urls import redact_url, scrub_secrets, url_secrets
from prompt_r1.core.seeding import derive_seed

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx


class _Failure(Exception):
    """A failed call or attempt: a short reason, whether its kind is retried (so a final one means
    the budget ran out) and how long the server asked to wait (`Retry-After`), if it did."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retryable, self.retry_after = reason, retryable, retry_after


@dataclass
class _Success:
    text: str
    prompt_tokens: int
    completion_tokens: int


def resolve_api_key(cfg: EnvConfig) -> str:
    """The key from the named environment variable; "EMPTY" when none is configured (local servers)."""
    if not cfg.api_key_env:
        return "EMPTY"
    key = os.environ.get(cfg.api_key_env)
    if not key:
        raise ConfigError(
            f"environment `{cfg.name}`: the API key variable {cfg.api_key_env} is not set; "
            f"export {cfg.api_key_env}=... before running (the key is never read from the config file)")
    return key


def backoff_delay(backoff_s: float, attempt: int, rng: random.Random) -> float:
    """Pause before a retry: `backoff_s * 2**attempt` (at most MAX_BACKOFF_S) plus up to 25%
    jitter, upward only, so never less than `backoff_s` (attempt 0 = first retry).

    >>> rng = random.Random(0)
    >>> 0.5 <= backoff_delay(0.5, 0, rng) <= 0.625, 2.0 <= backoff_delay(0.5, 2, rng) <= 2.5
    (True, True)
    >>> backoff_delay(1.0, 99, rng) <= 1.25 * MAX_BACKOFF_S
    True
    """
    base = min(backoff_s * (2 ** min(attempt, 32)), MAX_BACKOFF_S)
    return base + rng.uniform(0.0, 0.25 * base)


def retry_after_s(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds a server asks a client to wait before retrying: `Retry-After-Ms` if readable, else
    `Retry-After` as seconds or as an HTTP date; None when neither is there or readable. A time in
    the past is 0. (`headers` are looked up by lower-case name, as httpx headers are.)

    >>> retry_after_s({"retry-after": "2"}), retry_after_s({"retry-after-ms": "1500", "retry-after": "0"})
    (2.0, 1.5)
    >>> retry_after_s({"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, now=40.0)
    60.0
    >>> retry_after_s({"retry-after": "soon"}), retry_after_s({"retry-after": "nan"}), retry_after_s(None)
    (None, None, None)
    >>> retry_after_s({"retry-after": "-5"}), retry_after_s({"retry-after": "1e999"})
    (0.0, inf)
    """
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if not math.isnan(seconds):
            return max(seconds, 0.0)
    value = headers.get("retry-after")
    try:
        parsed = email.utils.parsedate_tz(value) if value else None
        when = email.utils.mktime_tz(parsed) if parsed else None
    except (TypeError, ValueError, OverflowError):
        return None
    if when is None:
        return None
    return max(float(when) - (time.time() if now is None else now), 0.0)


def read_json_body(data: bytes, where: str) -> Any:
    """A response body parsed as JSON; garbage is a retryable failure."""
    try:
        return json.loads(data)
    except ValueError as err:
        raise _Failure(f"malformed response from {where}: {type(err).__name__}: "
                       f"{short_reason(str(err), 120)}", retryable=True) from None


def _count(value: Any) -> int:
    """A token count from a usage field; anything but a non-negative number counts 0."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0


class OpenAIEnvironment(Environment):
    """Chat completions from an OpenAI-compatible URL with bounded concurrency and retries."""

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse | None" = None):
        super().__init__(cfg, warehouse)
        if not cfg.base_url:
            raise ConfigError(f"environment `{cfg.name}`: an OpenAI-compatible environment needs base_url")
        self.base_url = cfg.base_url.rstrip("/")
        # what messages, logs and stored errors show: the URL without its password or query credentials
        self.shown_url = redact_url(self.base_url)
        self._url_secrets = url_secrets(self.base_url)
        self._has_key = bool(cfg.api_key_env)
        resolve_api_key(cfg)  # fail at construction when the variable is missing
        # jitter of retry pauses: reproducible, and apart for environments sharing a seed
        self._rng = random.Random(derive_seed("env_backoff", cfg.name, "none" if cfg.seed is None else cfg.seed))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"OpenAIEnvironment(name={self.name!r}, model={self.model!r}, base_url={self.shown_url!r})"

    # -- per-loop client -------------------------------------------------------------------
    def _bound(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client from an earlier (closed) loop cannot be closed from here; drop it.
            # max_retries=0: every attempt and pause is `_call`'s (see the module docstring).
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=resolve_api_key(self.cfg),
                max_retries=0, timeout=self.cfg.timeout_s)
            self._semaphore = asyncio.Semaphore(self.cfg.concurrency)
            self._loop = loop
        assert self._semaphore is not None
        return self._client, self._semaphore

    async def aclose(self) -> None:
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            try:
                await client.close()
            except Exception as err:  # closing a client of a finished loop
                log.debug("closing the client of %s failed: %s", self.name, type(err).__name__)

    # -- the call ---------------------------------------------------------------------------
    async def generate(self, messages: list[dict[str, str]], turn: int, started: float) -> EnvReply:
        sent = [0]  # attempts made so far, read even when the deadline cuts `_call` short
        try:
            async with asyncio.timeout(self.cfg.call_deadline_s):
                result = await self._call(messages, sent)
        except TimeoutError:
            where = (f"after {sent[0]} attempts to {self.shown_url}" if sent[0]
                     else f"waiting for a free slot (concurrency {self.cfg.concurrency})")
            return self._give_up(turn, started, sent[0],
                                 f"call deadline of {self.cfg.call_deadline_s:g}s reached {where}")
        except _Failure as failure:
            why = failure.reason
            if failure.retryable:
                why += f" (gave up after {sent[0]} attempts)"
            return self._give_up(turn, started, sent[0], why)
        return EnvReply(result.text, self.new_call(
            turn, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            latency_s=time.perf_counter() - started, attempts=sent[0]))

    def _give_up(self, turn: int, started: float, attempts: int, why: str) -> EnvReply:
        why = self._scrub(why)
        log.warning("environment %s (%s at %s) call failed: %s", self.name, self.model, self.shown_url, why)
        return self.failed(turn, why, started, attempts)

    async def _call(self, messages: list[dict[str, str]], sent: list[int]) -> _Success:
        """The reply inside a free slot, after at most `1 + max_retries` attempts (counted in
        `sent`) with the pauses of the module docstring. Raises `_Failure`."""
        cfg = self.cfg
        client, semaphore = self._bound()
        async with semaphore:
            while True:
                sent[0] += 1
                try:
                    return await self._request(client, messages)
                except _Failure as failure:
                    if not failure.retryable or sent[0] > cfg.max_retries:
                        raise
                    delay = backoff_delay(cfg.backoff_s, sent[0] - 1, self._rng)
                    if failure.retry_after is not None:
                        if failure.retry_after > cfg.max_retry_after_s:
                            raise _Failure(
                                f"{failure.reason}; the server asks to retry after {failure.retry_after:g}s, "
                                f"longer than max_retry_after_s={cfg.max_retry_after_s:g}, so it was not retried "
                                "(raise max_retry_after_s in this environment's config to wait that long)",
                                retryable=False) from None
                        delay = max(delay, failure.retry_after)
                    log.info("environment %s: attempt %d failed (%s); retry in %.2fs",
                             self.name, sent[0], self._scrub(failure.reason), delay)
                    await asyncio.sleep(delay)

    async def _request(self, client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> _Success:
        """One chat completion (the client's retries included); reads at most `cfg.max_reply_bytes`."""
        cfg = self.cfg
        extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed}
        if cfg.stop:
            extra["stop"] = list(cfg.stop)
        too_large = (f"reply from {self.shown_url} is larger than max_reply_bytes={cfg.max_reply_bytes}; "
                     "lower max_tokens or raise max_reply_bytes in the environment config")
        try:
            # the client's timeout bounds each read (a server dripping bytes never trips it);
            # this one bounds the whole attempt: connect, headers and body
            async with asyncio.timeout(cfg.timeout_s), client.chat.completions.with_streaming_response.create(
                    model=self.model, messages=messages,  # type: ignore[arg-type]
                    max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, **extra) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cfg.max_reply_bytes:
                    raise _Failure(f"{too_large} (content-length {declared})", retryable=False)
                body = bytearray()
                try:
                    async for chunk in response.iter_bytes():
                        body += chunk
                        if len(body) > cfg.max_reply_bytes:
                            raise _Failure(too_large, retryable=False)
                except _Failure:
                    raise
                except Exception as err:  # the transport's own errors: the body broke off
                    raise _Failure(f"malformed response from {self.shown_url}: the body broke off "
                                   f"({type(err).__name__})", retryable=True) from None
        except (openai.APITimeoutError, TimeoutError):
            raise _Failure(f"timeout after {cfg.timeout_s:g}s from {self.shown_url}", retryable=True) from None
        except openai.APIConnectionError as err:
            cause = err.__cause__ or err
            raise _Failure(f"cannot connect to {self.shown_url} ({type(cause).__name__}); "
                           "is the server running?", retryable=True) from None
        except openai.APIStatusError as err:
            raise self._status_failure(err) from None
        except openai.APIError as err:
            raise _Failure(f"bad response from {self.shown_url}: {type(err).__name__}: "
                           f"{short_reason(str(err), 120)}", retryable=True) from None
        return self._read(read_json_body(bytes(body), self.shown_url))

    def _status_failure(self, err: openai.APIStatusError) -> _Failure:
        status = err.status_code
        body = short_reason(self._scrub(str(getattr(err, "message", "") or err)), 200)
        hint = ""
        if status in (401, 403):
            hint = (f"; check the key in ${self.cfg.api_key_env}" if self._has_key
                    else "; the server wants an API key: set api_key_env in the environment config")
        elif status == 404:
            hint = f"; is `{self.model}` served at {self.shown_url}?"
        retryable = status in RETRYABLE_STATUS or status >= 500
        should_retry = err.response.headers.get("x-should-retry")  # a server's own word wins
        if should_retry in ("true", "false"):
            retryable = should_retry == "true"
        return _Failure(f"HTTP {status} from {self.shown_url} for model {self.model}: {body}{hint}",
                        retryable=retryable, retry_after=retry_after_s(err.response.headers))

    def _read(self, data: Any) -> _Success:
        """Reply text and usage of a parsed chat completion; garbage is a retryable failure."""
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            kind = "no `choices`" if isinstance(data, dict) else "a body that is not a JSON object"
            raise _Failure(f"malformed response from {self.shown_url}: {kind}", retryable=True)
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        message = message if isinstance(message, dict) else {}
        content = message.get("content")
        if content is None and message.get("refusal"):
            content = message["refusal"]
        if not isinstance(content, str):
            raise _Failure(f"malformed response from {self.shown_url}: no message content",
                           retryable=True)
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return _Success(content, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))

    def _scrub(self, text: str) -> str:
        """`text` with the API key (if any) and the base URL's password and query credentials
        replaced, for logs and error texts (an HTTP library's message may quote the URL)."""
        text = scrub_secrets(text, self._url_secrets)
        if not self._has_key:
            return text
        key = os.environ.get(self.cfg.api_key_env or "", "")
        return text.replace(key, "***") if len(key) >= 4 else text
