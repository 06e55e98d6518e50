"""An environment URL's password and query credentials never reach an error text, a log record or a
repr (issue 62 item 13), whichever way the call fails."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fault_server import FaultServer

from prompt_r1.config.env import EnvConfig
from prompt_r1.env.openai_env import OpenAIEnvironment
from prompt_r1.env.vllm_server import free_port

PASSWORD, QUERY_KEY = "pw-CANARY-0123456789", "qk-CANARY-9876543210"


def _with_secrets(url: str, where: str) -> str:
    scheme, rest = url.split("://", 1)
    if where in ("userinfo", "both"):
        rest = f"probeuser:{PASSWORD}@{rest}"
    if where in ("query", "both"):
        rest += f"?api_key={QUERY_KEY}&api-version=2024-06"
    return f"{scheme}://{rest}"


@pytest.mark.parametrize("where", ["userinfo", "query", "both"])
@pytest.mark.parametrize("failure", ["refused", "script:500", "script:401echo"])
def test_url_secrets_are_scrubbed_from_errors_and_logs(caplog, where, failure) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpcore", "prompt_r1"):
        caplog.set_level(logging.DEBUG, logger=name)

    def run(base: str) -> list:
        env = OpenAIEnvironment(EnvConfig(name="leak", kind="openai", model="m", base_url=_with_secrets(base, where),
                                          timeout_s=1.5, max_retries=1, backoff_s=0.01, cache=False, max_tokens=8))
        assert PASSWORD not in repr(env) and QUERY_KEY not in repr(env)

        async def go():
            try:
                return await env.reply([{"role": "user", "content": f"x {failure}"}])
            finally:
                await env.aclose()
        return [asyncio.run(go())]

    if failure == "refused":
        replies = run(f"http://127.0.0.1:{free_port()}/v1")
    else:
        with FaultServer(hang_s=4.0) as server:
            replies = run(server.base_url)
    (reply,) = replies
    assert reply.call.error
    # the project's own records at any level, and every logger's at WARNING and above (the CLI keeps the
    # HTTP libraries, which log each request's URL at INFO, at WARNING: cli.logging_setup)
    shown = [r.getMessage() for r in caplog.records if r.name.startswith("prompt_r1") or r.levelno >= logging.WARNING]
    for text in (reply.call.error, reply.text, *shown):
        assert PASSWORD not in text and QUERY_KEY not in text
    if where != "query":
        assert "probeuser:***@" in reply.call.error or "HTTP" in reply.call.error
