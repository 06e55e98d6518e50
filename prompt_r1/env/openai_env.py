"""Environment client for any OpenAI-compatible chat endpoint (hosted API or a vLLM server).

Why our own retry loop instead of the openai client's: every attempt, its latency and its failure
must be recorded per call (`EnvCall.attempts`, `EnvCall.error`), a failed call must end as an
error text instead of an exception (the rollout batch goes on), and garbage responses (invalid
JSON, no `choices`) must be retried like 5xx. So the client runs with `max_retries=0` and this
module retries timeouts, connection errors, 429 and 5xx with exponential backoff plus jitter,
honouring `Retry-After` (capped) on 429/503; other 4xx fail at once.

An `asyncio.Semaphore(cfg.concurrency)` bounds requests in flight (held per attempt, released
while backing off). Successful replies can be cached in the warehouse keyed on model, messages
and sampling settings; a hit makes no request and has `cached=True`, `attempts=0`.

The API key is read from `os.environ[cfg.api_key_env]` (or "EMPTY" for local servers), handed to
the client and never kept, logged, stored, put in `repr` or in error texts (server error
bodies are scrubbed of it, since some servers echo the key they rejected).

The async client and the semaphore are bound to the event loop they were made in; they are
rebuilt when the environment is used from a new loop (evaluation runs one `asyncio.run` per
environment, Ray actors their own loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai

from prompt_r1.config import EnvConfig
from prompt_r1.env.base import EnvReply, Environment, cache_key, check_messages, sampling_settings, short_reason

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_S = 60.0
RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx


class _Failure(Exception):
    """One failed attempt: a short reason, whether to retry, and a server-requested delay."""

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
    """`backoff_s * 2**attempt` plus up to 25% jitter (attempt 0 = first retry)."""
    base = backoff_s * (2 ** attempt)
    return base + rng.uniform(0.0, 0.25 * base)


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
        key = cache_key(self.model, messages, sampling_settings(self.cfg)) if self.warehouse else None
        if key is not None:
            hit = await self._cache_get(key)
            if hit is not None:
                text, prompt_tokens, completion_tokens = hit
                return EnvReply(text, self.new_call(
                    turn, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    latency_s=time.perf_counter() - started, attempts=0, cached=True))
        client, semaphore = self._bound()
        attempts = 0
        while True:
            attempts += 1
            try:
                async with semaphore:
                    result = await self._attempt(client, messages)
            except _Failure as failure:
                retries_left = self.cfg.max_retries - (attempts - 1)
                if not failure.retryable or retries_left <= 0:
                    why = failure.reason if not failure.retryable else \
                        f"{failure.reason} (gave up after {attempts} attempts)"
                    log.warning("environment %s (%s at %s) call failed: %s", self.name, self.model,
                                self.base_url, self._scrub(why))
                    return self.failed(turn, self._scrub(why), started, attempts)
                delay = failure.retry_after if failure.retry_after is not None else \
                    backoff_delay(self.cfg.backoff_s, attempts - 1, self._rng)
                log.warning("environment %s: attempt %d failed (%s); retry %d of %d in %.2fs",
                            self.name, attempts, self._scrub(failure.reason), attempts, self.cfg.max_retries, delay)
                await asyncio.sleep(delay)
                continue
            if key is not None:
                await self._cache_put(key, result)
            return EnvReply(result.text, self.new_call(
                turn, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                latency_s=time.perf_counter() - started, attempts=attempts))

    async def _attempt(self, client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> _Success:
        """One request; raises `_Failure` saying whether it may be retried."""
        cfg = self.cfg
        extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed}
        if cfg.stop:
            extra["stop"] = list(cfg.stop)
        try:
            response = await asyncio.wait_for(
                client.chat.completions.create(
                    model=self.model, messages=messages,  # type: ignore[arg-type]
                    max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, **extra),
                timeout=cfg.timeout_s)
        except (asyncio.TimeoutError, openai.APITimeoutError):
            raise _Failure(f"timeout after {cfg.timeout_s:g}s from {self.base_url}", retryable=True) from None
        except openai.APIConnectionError as err:
            cause = err.__cause__ or err
            raise _Failure(f"cannot connect to {self.base_url} ({type(cause).__name__}); "
                           "is the server running?", retryable=True) from None
        except openai.APIStatusError as err:
            raise self._status_failure(err) from None
        except ValueError as err:  # invalid JSON in the body
            raise _Failure(f"malformed response from {self.base_url}: {type(err).__name__}: "
                           f"{short_reason(str(err), 120)}", retryable=True) from None
        except openai.APIError as err:  # e.g. response validation errors
            raise _Failure(f"bad response from {self.base_url}: {type(err).__name__}: "
                           f"{short_reason(str(err), 120)}", retryable=True) from None
        return self._read(response)

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

    def _read(self, response: Any) -> _Success:
        """Reply text and usage of a chat completion; garbage is a retryable failure."""
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:
            kind = "a non-JSON body" if isinstance(response, str) else "no `choices`"
            raise _Failure(f"malformed response from {self.base_url}: {kind}", retryable=True)
        message = getattr(choices[0], "message", None)
        content = getattr(message, "content", None)
        if content is None and getattr(message, "refusal", None):
            content = message.refusal  # type: ignore[union-attr]
        if not isinstance(content, str):
            raise _Failure(f"malformed response from {self.base_url}: no message content", retryable=True)
        usage = getattr(response, "usage", None)
        prompt_tokens = getattr(usage, "prompt_tokens", 0) or 0
        completion_tokens = getattr(usage, "completion_tokens", 0) or 0
        return _Success(content, int(prompt_tokens), int(completion_tokens))

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
