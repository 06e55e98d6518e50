"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real OpenAI-compatible server.

The chaos tests point an `openai` environment at this proxy instead of the server. Each request
is forwarded unchanged, except that a seeded share of them (`rate`) gets a fault instead:
- `429`: status 429 with `Retry-After: 1`;
- `500`: status 500;
- `hang`: no answer for `hang_s` seconds (set it past the client's `timeout_s`), then a 504;
- `malformed`: status 200 with a truncated JSON body.
Every fault body contains `MARKER`, so a test can look for any trace of a fault in what the agent
saw or what was scored. `latency_s=(low, high)` delays every chat request by a seeded uniform
draw from that range before it is answered (a hosted API's latency, for benchmarks/speed/staleness.py).

Which requests fail is a pure function of (seed, request body, how many times that body was seen),
not of arrival order, so concurrent clients get the same faults on every run. Every request is
logged (`log`: one dict per request with its fault or None), so a test can compare the faults
injected with the failures and attempts the client recorded.

An aiohttp server and client on their own event loop in a daemon thread; `close()` stops both.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from collections import Counter
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

FAULTS = ("429", "500", "hang", "malformed")
MARKER = "CHAOS-PROXY-FAULT"


def fault_for(seed: int, body: bytes, occurrence: int, rate: float, faults: tuple[str, ...] = FAULTS) -> str | None:
    """The fault for the `occurrence`-th request with this body, or None to forward it.

    >>> [fault_for(0, b"x", i, 0.0) for i in range(3)], fault_for(0, b"x", 0, 1.0) in FAULTS
    ([None, None, None], True)
    >>> fault_for(1, b"q", 4, 0.3) == fault_for(1, b"q", 4, 0.3)
    True
    """
    digest = hashlib.sha256(f"{seed}:{occurrence}:".encode() + body).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u >= rate:
        return None
    return faults[digest[8] % len(faults)]


class ChaosProxy:
    """`with ChaosProxy(upstream, rate) as proxy:` serves at `proxy.base_url` (…/v1)."""

    def __init__(self, upstream: str, rate: float, seed: int = 0, hang_s: float = 10.0,
                 faults: tuple[str, ...] = FAULTS, latency_s: tuple[float, float] = (0.0, 0.0)):
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.rate, self.seed, self.hang_s, self.faults = rate, seed, hang_s, faults
        self.latency_s = latency_s
        self._latency = random.Random(seed)
        self.log: list[dict[str, Any]] = []
        self._seen: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="chaos-proxy")
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set_rate(self, rate: float, seed: int | None = None) -> None:
        """Change the fault rate (and seed) between runs; the log is kept."""
        self.rate = rate
        if seed is not None:
            self.seed = seed
        self._seen.clear()

    def faults_injected(self, since: int = 0) -> Counter[str]:
        return Counter(r["fault"] for r in self.log[since:] if r["fault"])

    # -- server -------------------------------------------------------------------------------
    def __enter__(self) -> "ChaosProxy":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("chaos proxy did not start within 30 s")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._client = ClientSession(timeout=ClientTimeout(total=600))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        await self._client.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key = hashlib.sha256(body).hexdigest()
        occurrence = self._seen[key]
        self._seen[key] += 1
        is_chat = request.path.endswith("/chat/completions")
        fault = fault_for(self.seed, body, occurrence, self.rate, self.faults) if is_chat else None
        self.log.append({"path": request.path, "body_sha": key, "occurrence": occurrence, "fault": fault})
        if is_chat and self.latency_s[1] > 0:
            await asyncio.sleep(self._latency.uniform(*self.latency_s))
        error = {"error": {"message": f"{MARKER}: injected {fault}", "type": "chaos"}}
        if fault == "429":
            return web.json_response(error, status=429, headers={"Retry-After": "1"})
        if fault == "500":
            return web.json_response(error, status=500)
        if fault == "hang":
            await asyncio.sleep(self.hang_s)
            return web.json_response(error, status=504)
        if fault == "malformed":
            return web.Response(status=200, content_type="application/json",
                                text='{"id": "' + MARKER + '", "choices": [{"message": {"content": "')
        async with self._client.request(request.method, self.upstream + request.path_qs, data=body,
                                        headers={"Content-Type": request.headers.get("Content-Type",
                                                                                     "application/json")}) as up:
            payload = await up.read()
            return web.Response(status=up.status, body=payload,
                                content_type=up.content_type or "application/json")
