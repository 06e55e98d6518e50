"""Environment client for any OpenAI-compatible chat endpoint (hosted API or a vLLM server).

Why our own retry loop instead of the openai client's: every attempt, its latency and its failure
must be recorded per call (`EnvCall.attempts`, `EnvCall.error`), a failed call must end as an
error text instead of an exception (the rollout batch goes on), and garbage responses (invalid
JSON, no `choices`) must be retried like 5xx. So the client runs with `max_retries=0` and this
module retries timeouts, connection errors, 429 and 5xx with exponential backoff plus jitter,
honouring `Retry-After` (capped) on 429/503 but never pausing less than the backoff; other 4xx
fail at once. One call, slot wait and backoffs included, ends by `cfg.call_deadline_s`.

The response body is read in chunks and the call fails once it passes `cfg.max_reply_bytes`:
a runaway server cannot make the client hold, parse and tokenise megabytes of reply.

An `asyncio.Semaphore(cfg.concurrency)` bounds requests in flight (held per attempt, released
while backing off). Successful replies can be cached in the warehouse keyed on everything that
can change them (`reply_cache_key`: endpoint, model, chat template, messages as sent, sampling);
a hit makes no request and has `cached=True`, `attempts=0`.

The API key is read from `os.environ[cfg.api_key_env]` (or "EMPTY" for local servers), handed to
the client and never kept, logged, stored, put in `repr` or in error texts (server error
bodies are scrubbed of it, since some servers echo the key they rejected).

The async client and the semaphore are bound to the event loop they were made in; they are
rebuilt when the environment is used from a new loop (evaluation runs one `asyncio.run` per
environment, Ray actors their own loop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai

from prompt_r1.config import EnvConfig
from prompt_r1.env.base import EnvReply, Environment, check_messages, reply_cache_key, short_reason, with_system

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_S = 60.0
MAX_BACKOFF_S = 60.0
RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx


class _Failure(Exception):
    """One failed attempt: a short reason, whether to retry, a server-requested delay, and whether
    a request went out at all (a call can end while waiting for a free slot)."""

    def __init__(self, reason: str, retryable: bool, retry_after: float | None = None, sent: bool = True):
        super().__init__(reason)
        self.reason, self.retryable, self.retry_after, self.sent = reason, retryable, retry_after, sent


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
        raise ValueError(
            f"environment `{cfg.name}`: the API key variable {cfg.api_key_env} is not set; "
            f"export {cfg.api_key_env}=... before running (the key is never read from the config file)")
    return key


def parse_retry_after(value: str | None, cap: float = RETRY_AFTER_CAP_S) -> float | None:
    """Seconds from a `Retry-After` header (seconds form only), capped; None when absent or unusable.

    >>> parse_retry_after("1"), parse_retry_after("2.5"), parse_retry_after("3600")
    (1.0, 2.5, 60.0)
    >>> parse_retry_after(None), parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), parse_retry_after("-3")
    (None, None, None)
    """
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds < 0 or seconds != seconds:
        return None
    return min(seconds, cap)


def backoff_delay(backoff_s: float, attempt: int, rng: random.Random) -> float:
    """`backoff_s * 2**attempt` (at most MAX_BACKOFF_S) plus up to 25% jitter (attempt 0 = first retry)."""
    base = min(backoff_s * (2 ** min(attempt, 32)), MAX_BACKOFF_S)
    return base + rng.uniform(0.0, 0.25 * base)


def retry_delay(retry_after: float | None, backoff_s: float, attempt: int, rng: random.Random) -> float:
    """Pause before a retry: the server's `Retry-After` when it asks for longer than our backoff,
    else the backoff (so `Retry-After: 0` cannot make a tight retry loop).

    >>> rng = random.Random(0)
    >>> retry_delay(0.0, 0.5, 0, rng) >= 0.5, retry_delay(3.0, 0.5, 0, rng)
    (True, 3.0)
    """
    return max(retry_after or 0.0, backoff_delay(backoff_s, attempt, rng))


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
    """Chat completions from an OpenAI-compatible URL with bounded concurrency, retries and a cache."""

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse | None" = None):
        super().__init__(cfg)
        if not cfg.base_url:
            raise ValueError(f"environment `{cfg.name}`: an OpenAI-compatible environment needs base_url")
        self.base_url = cfg.base_url.rstrip("/")
        self.warehouse = warehouse if cfg.cache else None
        self._has_key = bool(cfg.api_key_env)
        resolve_api_key(cfg)  # fail at construction when the variable is missing
        self._rng = random.Random(cfg.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"OpenAIEnvironment(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    # -- per-loop client -------------------------------------------------------------------
    def _bound(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client from an earlier (closed) loop cannot be closed from here; drop it.
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
    async def reply(self, messages: list[dict[str, str]], turn: int = 0) -> EnvReply:
        started = time.perf_counter()
        problem = check_messages(messages)
        if problem:
            return self.failed(turn, f"{problem} (environment {self.name})", started, attempts=0)
        messages = with_system(self.cfg, messages)
        key = reply_cache_key(self.cfg, messages) if self.warehouse else None
        if key is not None:
            hit = await self._cache_get(key)
            if hit is not None:
                text, prompt_tokens, completion_tokens = hit
                return EnvReply(text, self.new_call(
                    turn, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    latency_s=time.perf_counter() - started, attempts=0, cached=True))
        client, semaphore = self._bound()
        deadline = started + self.cfg.call_deadline_s
        attempts = 0
        while True:
            attempts += 1
            try:
                result = await self._attempt(client, semaphore, messages, deadline)
            except _Failure as failure:
                if not failure.sent:
                    attempts -= 1
                delay = retry_delay(failure.retry_after, self.cfg.backoff_s, attempts - 1, self._rng)
                why = None
                if not failure.retryable:
                    why = failure.reason
                elif attempts > self.cfg.max_retries:
                    why = f"{failure.reason} (gave up after {attempts} attempts)"
                elif time.perf_counter() + delay >= deadline:
                    why = (f"{failure.reason} (gave up after {attempts} attempts: the call deadline of "
                           f"{self.cfg.call_deadline_s:g}s comes before the next retry)")
                if why is not None:
                    log.warning("environment %s (%s at %s) call failed: %s", self.name, self.model,
                                self.base_url, self._scrub(why))
                    return self.failed(turn, self._scrub(why), started, attempts)
                log.warning("environment %s: attempt %d failed (%s); retry %d of %d in %.2fs",
                            self.name, attempts, self._scrub(failure.reason), attempts, self.cfg.max_retries, delay)
                await asyncio.sleep(delay)
                continue
            if key is not None:
                await self._cache_put(key, result)
            return EnvReply(result.text, self.new_call(
                turn, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                latency_s=time.perf_counter() - started, attempts=attempts))

    async def _attempt(self, client: openai.AsyncOpenAI, semaphore: asyncio.Semaphore,
                       messages: list[dict[str, str]], deadline: float) -> _Success:
        """One request inside a free slot, ending by `deadline`; raises `_Failure` saying whether
        it may be retried."""
        cfg = self.cfg
        try:
            await asyncio.wait_for(semaphore.acquire(), timeout=max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            raise _Failure(f"call deadline of {cfg.call_deadline_s:g}s reached waiting for a free slot "
                           f"(concurrency {cfg.concurrency})", retryable=False, sent=False) from None
        try:
            limit = min(cfg.timeout_s, deadline - time.perf_counter())
            try:
                return await asyncio.wait_for(self._request(client, messages), timeout=max(0.0, limit))
            except (TimeoutError, openai.APITimeoutError):
                if limit < cfg.timeout_s:
                    raise _Failure(f"call deadline of {cfg.call_deadline_s:g}s reached waiting for "
                                   f"{self.base_url}", retryable=False) from None
                raise _Failure(f"timeout after {cfg.timeout_s:g}s from {self.base_url}", retryable=True) from None
        finally:
            semaphore.release()

    async def _request(self, client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> _Success:
        """Send one chat completion and read at most `cfg.max_reply_bytes` of its body."""
        cfg = self.cfg
        extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed}
        if cfg.stop:
            extra["stop"] = list(cfg.stop)
        too_large = (f"reply from {self.base_url} is larger than max_reply_bytes={cfg.max_reply_bytes}; "
                     "lower max_tokens or raise max_reply_bytes in the environment config")
        try:
            async with client.chat.completions.with_streaming_response.create(
                    model=self.model, messages=messages,  # type: ignore[arg-type]
                    max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, **extra) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cfg.max_reply_bytes:
                    raise _Failure(f"{too_large} (content-length {declared})", retryable=False)
                body = bytearray()
                async for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > cfg.max_reply_bytes:
                        raise _Failure(too_large, retryable=False)
        except openai.APITimeoutError:
            raise
        except openai.APIConnectionError as err:
            cause = err.__cause__ or err
            raise _Failure(f"cannot connect to {self.base_url} ({type(cause).__name__}); "
                           "is the server running?", retryable=True) from None
        except openai.APIStatusError as err:
            raise self._status_failure(err) from None
        except openai.APIError as err:  # e.g. response validation errors
            raise _Failure(f"bad response from {self.base_url}: {type(err).__name__}: "
                           f"{short_reason(str(err), 120)}", retryable=True) from None
        return self._read(read_json_body(bytes(body), self.base_url))

    def _status_failure(self, err: openai.APIStatusError) -> _Failure:
        status = err.status_code
        body = short_reason(self._scrub(str(getattr(err, "message", "") or err)), 200)
        retryable = status in RETRYABLE_STATUS or status >= 500
        retry_after = None
        if status in (429, 503):
            retry_after = parse_retry_after(err.response.headers.get("retry-after"))
        hint = ""
        if status in (401, 403):
            hint = (f"; check the key in ${self.cfg.api_key_env}" if self._has_key
                    else "; the server wants an API key: set api_key_env in the environment config")
        elif status == 404:
            hint = f"; is `{self.model}` served at {self.base_url}?"
        return _Failure(f"HTTP {status} from {self.base_url} for model {self.model}: {body}{hint}",
                        retryable=retryable, retry_after=retry_after)

    def _read(self, data: Any) -> _Success:
        """Reply text and usage of a parsed chat completion; garbage is a retryable failure."""
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            kind = "no `choices`" if isinstance(data, dict) else "a body that is not a JSON object"
            raise _Failure(f"malformed response from {self.base_url}: {kind}", retryable=True)
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        message = message if isinstance(message, dict) else {}
        content = message.get("content")
        if content is None and message.get("refusal"):
            content = message["refusal"]
        if not isinstance(content, str):
            raise _Failure(f"malformed response from {self.base_url}: no message content", retryable=True)
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return _Success(content, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))

    def _scrub(self, text: str) -> str:
        """`text` with the API key (if any) replaced, for logs and error texts."""
        if not self._has_key:
            return text
        key = os.environ.get(self.cfg.api_key_env or "", "")
        return text.replace(key, "***") if len(key) >= 4 else text

    # -- cache ------------------------------------------------------------------------------
    async def _cache_get(self, key: str) -> tuple[str, int, int] | None:
        assert self.warehouse is not None
        try:
            return await asyncio.to_thread(self.warehouse.cache_get, key)
        except Exception as err:  # a cache problem must not fail the call
            log.warning("environment %s: reply cache read failed: %s", self.name, short_reason(str(err)))
            return None

    async def _cache_put(self, key: str, result: _Success) -> None:
        assert self.warehouse is not None
        try:
            await asyncio.to_thread(self.warehouse.cache_put, key, self.model, result.text,
                                    result.prompt_tokens, result.completion_tokens)
        except Exception as err:
            log.warning("environment %s: reply cache write failed: %s", self.name, short_reason(str(err)))
