"""A fault-injecting stand-in for an OpenAI-compatible chat server, for the env client's fault tests.

Only for faults: real replies come from real models elsewhere. It is an `http.server` in a thread
on 127.0.0.1 (random port) that answers `POST /v1/chat/completions` from a script carried in the
last message: `"<anything> script:timeout,429,500,ok"` makes the 1st request with that exact
content time out, the 2nd get a 429 (Retry-After: 1), the 3rd a 500 and the 4th a valid
completion; the last action repeats. A request counter per content string lets tests check how
many attempts each call made, and the server records the peak number of requests in flight.

Actions: ok, slow (0.3 s then ok), timeout (sleep `hang_s` then ok), 429, 503 (both with
Retry-After: 1), 429now (Retry-After: 0), 429ms (Retry-After-Ms: 1500 beside Retry-After: 0, as
OpenAI sends them), 429date (Retry-After as an HTTP date 3 s ahead), 429wait<N> (Retry-After: N seconds,
e.g. 429wait2.5), 500, 400, 401, 400retry (400 with `x-should-retry: true`), 500noretry (500 with
`x-should-retry: false`), 401echo (401 whose body echoes the
Authorization header, like servers that quote the rejected key), garbage (200 with invalid JSON),
nochoices (200 JSON with no `choices`), huge (a valid completion whose reply is `huge_bytes` long,
with its content-length), hugechunked (the same, chunked, with no content-length), drip (200
headers at once, then one byte of JSON whitespace every 0.2 s for `hang_s`, then a valid completion:
every read is quick, the whole request slow).
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_REQUESTS = 2000  # bounded: refuse to run away if a client loops


class FaultServer:
    def __init__(self, hang_s: float = 3.0, huge_bytes: int = 300_000):
        self.hang_s, self.huge_bytes = hang_s, huge_bytes
        self.counts: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                server._handle(self, body)

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None,
                      raw: bytes | None = None, chunked: bool = False) -> None:
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                if chunked:
                    self.send_header("transfer-encoding", "chunked")
                else:
                    self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    if not chunked:
                        self.wfile.write(data)
                        return
                    for start in range(0, len(data), 16384):
                        piece = data[start:start + 16384]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FaultServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def attempts(self, content: str) -> int:
        """How many requests carried this exact last-message content."""
        with self._lock:
            return self.counts[content]

    def _handle(self, handler: Any, body: dict[str, Any]) -> None:
        messages = body.get("messages") or [{"content": ""}]
        content = str(messages[-1].get("content", ""))
        script = content.split("script:", 1)[1].split() if "script:" in content else ["ok"]
        actions = script[0].split(",") if script else ["ok"]
        with self._lock:
            if len(self.requests) >= MAX_REQUESTS:
                handler._send(503, {"error": {"message": "fault server request limit"}})
                return
            index = self.counts[content]
            self.counts[content] += 1
            self.requests.append({"content": content, "time": time.monotonic(), "messages": messages,
                                  "authorization": handler.headers.get("authorization", "")})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._act(handler, actions[min(index, len(actions) - 1)], body, content)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _act(self, handler: Any, action: str, body: dict[str, Any], content: str) -> None:
        error = lambda msg: {"error": {"message": msg, "type": "test", "code": None}}  # noqa: E731
        if action == "slow":
            time.sleep(0.3)
            action = "ok"
        if action == "timeout":
            self._stop.wait(self.hang_s)
            action = "ok"
        if action == "drip":
            self._drip(handler, body, content)
            return
        if action in ("huge", "hugechunked"):
            reply = "x" * self.huge_bytes
            handler._send(200, {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()),
                                "model": body.get("model", ""),
                                "choices": [{"index": 0, "finish_reason": "length",
                                             "message": {"role": "assistant", "content": reply}}]},
                          chunked=action == "hugechunked")
        elif action == "ok":
            reply = f"echo: {content}"
            handler._send(200, {
                "id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}],
                "usage": {"prompt_tokens": len(content.split()), "completion_tokens": len(reply.split()),
                          "total_tokens": len(content.split()) + len(reply.split())},
            })
        elif action in ("429", "503"):
            handler._send(int(action), error("slow down"), headers={"retry-after": "1"})
        elif action == "429now":
            handler._send(429, error("slow down"), headers={"retry-after": "0"})
        elif action == "429ms":
            handler._send(429, error("slow down"), headers={"retry-after-ms": "1500", "retry-after": "0"})
        elif action == "429date":
            when = email.utils.formatdate(time.time() + 3, usegmt=True)
            handler._send(429, error("slow down"), headers={"retry-after": when})
        elif action.startswith("429wait"):
            handler._send(429, error("slow down"), headers={"retry-after": action[len("429wait"):]})
        elif action in ("400retry", "500noretry"):
            handler._send(int(action[:3]), error(f"scripted {action}"),
                          headers={"x-should-retry": "true" if action == "400retry" else "false"})
        elif action in ("500", "400", "401"):
            handler._send(int(action), error(f"scripted {action}"))
        elif action == "401echo":
            handler._send(401, error(f"Incorrect API key provided: {handler.headers.get('authorization', '')}"))
        elif action == "garbage":
            handler._send(200, None, raw=b'{"choices": [ this is not json')
        elif action == "nochoices":
            handler._send(200, {"id": "x", "object": "chat.completion", "model": body.get("model", "")})
        else:
            handler._send(500, error(f"unknown scripted action {action!r}"))

    def _drip(self, handler: Any, body: dict[str, Any], content: str) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        reply = json.dumps({"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()),
                            "model": body.get("model", ""),
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": f"echo: {content}"}}]}).encode()
        deadline = time.monotonic() + self.hang_s
        try:
            while time.monotonic() < deadline and not self._stop.wait(0.2):
                handler.wfile.write(b"1\r\n \r\n")  # one chunk of one space: valid leading JSON whitespace
                handler.wfile.flush()
            handler.wfile.write(f"{len(reply):x}\r\n".encode() + reply + b"\r\n0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
