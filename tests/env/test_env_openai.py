"""OpenAIEnvironment against a fault-injecting stand-in server: retries, limits, cache, secrets.

The real openai client talks HTTP to `tests/fault_server.py`, which scripts timeouts, 429s with
Retry-After, 5xx, 4xx and garbage bodies per request. Real replies from real models are tested in
test_env_inprocess.py and test_env_vllm.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from fault_server import FaultServer
from prompt_r1.env import open_environment
from prompt_r1.env.base import reply_cache_key, with_system
from prompt_r1.env.openai_env import OpenAIEnvironment
from prompt_r1.env.vllm_server import free_port
from prompt_r1.config.env import EnvConfig

SECRET = "sk-test-S3CRET-do-not-leak-0123456789"


def make_cfg(base_url: str, **overrides) -> EnvConfig:
    settings = dict(name="fault", kind="openai", model="fault-model", base_url=base_url, timeout_s=1.5,
                    max_retries=3, backoff_s=0.01, concurrency=8, cache=False, max_tokens=16)
    settings.update(overrides)
    return EnvConfig(**settings)


def ask(env, content: str, turn: int = 0):
    return env.reply([{"role": "user", "content": content}], turn=turn)


async def ask_all(env, contents: list[str]):
    try:
        return await asyncio.gather(*(ask(env, c, turn=i) for i, c in enumerate(contents)))
    finally:
        await env.aclose()


@pytest.fixture
def server():
    with FaultServer(hang_s=4.0) as srv:  # timeouts generous enough for a loaded 2-core CI machine
        yield srv


def test_concurrent_batch_with_faults_completes_and_records_every_failure(server):
    env = OpenAIEnvironment(make_cfg(server.base_url))
    scripts = {
        "a script:ok": (True, 1),
        "b script:timeout,ok": (True, 2),
        "c script:500,500,ok": (True, 3),
        "d script:garbage,ok": (True, 2),
        "e script:nochoices,ok": (True, 2),
        "f script:503,ok": (True, 2),
        "g script:500": (False, 4),          # never succeeds: 1 + max_retries attempts
        "h script:timeout": (False, 4),
        "i script:garbage": (False, 4),
        "j script:garbage,500,ok": (True, 3),   # bad bodies and statuses share one attempt budget
        "k script:500,garbage,500": (False, 4),
    }
    replies = asyncio.run(ask_all(env, list(scripts)))
    for (content, (ok, attempts)), reply in zip(scripts.items(), replies):
        assert reply.call.attempts == attempts == server.attempts(content), content
        assert server.attempts(content) <= env.cfg.max_retries + 1
        assert reply.call.env_name == "fault" and reply.call.model == "fault-model"
        assert reply.call.latency_s > 0 and not reply.call.cached
        if ok:
            assert reply.call.error is None and reply.text == f"echo: {content}", content
            assert reply.call.prompt_tokens == len(content.split())  # the server's usage numbers
            assert reply.call.completion_tokens == len(reply.text.split())
        else:
            assert reply.call.error and reply.text == f"[environment error: {reply.call.error}]", content
            assert "gave up after 4 attempts" in reply.call.error
            assert reply.call.prompt_tokens == reply.call.completion_tokens == 0
    assert "HTTP 500" in replies[6].call.error and server.base_url in replies[6].call.error
    assert "timeout after 1.5s" in replies[7].call.error
    assert "malformed response" in replies[8].call.error
    assert "HTTP 500" in replies[10].call.error
    assert [r.call.turn for r in replies] == list(range(len(scripts)))


@pytest.mark.parametrize("status", ["400", "401"])
def test_no_retry_on_client_errors(server, status):
    env = OpenAIEnvironment(make_cfg(server.base_url))
    content = f"x script:{status},ok"
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert server.attempts(content) == 1 and reply.call.attempts == 1
    assert reply.call.error.startswith(f"HTTP {status} from {server.base_url} for model fault-model")
    assert "gave up" not in reply.call.error


@pytest.mark.parametrize("status", ["429", "503"])
def test_retry_after_header_is_respected(server, status):
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.01))
    content = f"y script:{status},ok"
    started = time.monotonic()
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert reply.call.error is None and reply.call.attempts == 2
    times = [r["time"] for r in server.requests if r["content"] == content]
    assert times[1] - times[0] >= 1.0  # Retry-After: 1, although the backoff would be 10 ms
    assert time.monotonic() - started >= 1.0


def test_connection_refused_is_retried_then_recorded():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    env = OpenAIEnvironment(make_cfg(url, max_retries=2))
    (reply,) = asyncio.run(ask_all(env, ["hello"]))
    assert reply.call.attempts == 3
    assert "cannot connect to " + url in reply.call.error
    assert reply.text.startswith("[environment error: cannot connect")


def test_semaphore_bounds_requests_in_flight(server):
    env = OpenAIEnvironment(make_cfg(server.base_url, concurrency=3, timeout_s=5.0))
    replies = asyncio.run(ask_all(env, [f"call {i} script:slow" for i in range(12)]))
    assert all(r.call.error is None for r in replies)
    assert server.max_in_flight == 3


def test_api_key_from_env_var_never_leaks(server, monkeypatch, caplog):
    monkeypatch.setenv("PROMPT_R1_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpcore", "prompt_r1"):
        caplog.set_level(logging.DEBUG, logger=name)
    env = OpenAIEnvironment(make_cfg(server.base_url, api_key_env="PROMPT_R1_TEST_KEY"))
    replies = asyncio.run(ask_all(env, ["k script:401echo", "l script:500,ok", "m script:500", "n script:ok"]))
    assert all(r["authorization"] == f"Bearer {SECRET}" for r in server.requests)  # the key was used
    assert replies[0].call.error and "***" in replies[0].call.error  # the echoed key was scrubbed
    assert "check the key in $PROMPT_R1_TEST_KEY" in replies[0].call.error
    assert replies[1].call.error is None and replies[2].call.error
    assert caplog.records, "expected retry/failure log records"
    assert SECRET not in caplog.text
    for reply in replies:
        assert SECRET not in reply.text and SECRET not in str(reply.call)
    assert SECRET not in repr(env) and SECRET not in str(vars(env).get("cfg"))


def test_missing_key_variable_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("PROMPT_R1_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="PROMPT_R1_UNSET_KEY is not set"):
        OpenAIEnvironment(make_cfg("http://127.0.0.1:9/v1", api_key_env="PROMPT_R1_UNSET_KEY"))


def test_cache_hit_skips_the_server(server, warehouse):
    cfg = make_cfg(server.base_url, cache=True)
    content = "cache me script:ok"

    async def twice():
        with open_environment(cfg, warehouse=warehouse) as env:
            try:
                first = await ask(env, content)
                second = await ask(env, content)
                failed = await ask(env, "z script:400")
                failed_again = await ask(env, "z script:400")
            finally:
                await env.aclose()
        return first, second, failed, failed_again

    first, second, failed, failed_again = asyncio.run(twice())
    assert not first.call.cached and first.call.attempts == 1
    assert second.call.cached and second.call.attempts == 0 and second.text == first.text
    assert (second.call.prompt_tokens, second.call.completion_tokens) == (
        first.call.prompt_tokens, first.call.completion_tokens)
    assert server.attempts(content) == 1
    assert failed.call.error and failed_again.call.error and not failed_again.call.cached
    assert server.attempts("z script:400") == 2  # failures are not cached
    key = reply_cache_key(cfg, with_system(cfg, [{"role": "user", "content": content}]))
    assert warehouse.cache_get(key)[0] == first.text
    # other sampling settings are another key
    hotter = OpenAIEnvironment(cfg.model_copy(update={"temperature": 0.7}), warehouse)
    (third,) = asyncio.run(ask_all(hotter, [content]))
    assert not third.call.cached and server.attempts(content) == 2


def test_environment_survives_a_new_event_loop(server):
    env = OpenAIEnvironment(make_cfg(server.base_url))
    first = asyncio.run(ask(env, "loop one"))
    second = asyncio.run(ask(env, "loop two"))  # the client of the first loop is not reused
    asyncio.run(env.aclose())
    assert first.call.error is None and second.call.error is None


def test_bad_messages_fail_without_a_request(server):
    env = OpenAIEnvironment(make_cfg(server.base_url))
    reply = asyncio.run(env.reply([]))
    assert reply.call.error == "no messages to send (environment fault)" and reply.call.attempts == 0
    assert not server.requests


def test_cache_is_keyed_on_the_endpoint(warehouse):
    """Two servers with the same model name are two environments: neither answers from the other's cache."""
    content = "same question script:ok"
    with FaultServer() as one, FaultServer() as two:
        replies = []
        for srv in (one, two, one, two):
            env = OpenAIEnvironment(make_cfg(srv.base_url, cache=True), warehouse)
            replies += asyncio.run(ask_all(env, [content]))
        assert one.attempts(content) == two.attempts(content) == 1
    assert [r.call.cached for r in replies] == [False, False, True, True]


CHANGES = {"base_url": "http://127.0.0.1:2/v1", "model": "other-model", "chat_template": "{{ messages }}",
           "system_prompt": "Answer in French.", "temperature": 0.5, "top_p": 0.9, "max_tokens": 17,
           "seed": 1, "stop": ["\n\nUser:"]}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_every_setting_that_changes_a_reply_changes_the_key(field):
    base = make_cfg("http://127.0.0.1:1/v1")
    messages = [{"role": "user", "content": "q"}]
    same = make_cfg("http://127.0.0.1:1/v1/", concurrency=2, timeout_s=9.0, max_retries=0, cache=True,
                    name="other-name", price_per_1k_prompt=1.0)  # settings that cannot change a reply
    assert reply_cache_key(same, messages) == reply_cache_key(base, messages)
    changed = base.model_copy(update={field: CHANGES[field]})
    assert reply_cache_key(changed, messages) != reply_cache_key(base, messages)
    assert reply_cache_key(base, messages + [{"role": "user", "content": "r"}]) != reply_cache_key(base, messages)


def test_a_managed_server_keeps_its_cache_across_restarts():
    """A managed vLLM server gets a new port on every start; its replies are the same model's."""
    first = EnvConfig(kind="vllm", model="smollm2-135m-instruct", base_url="http://127.0.0.1:4001/v1")
    restarted = first.model_copy(update={"base_url": "http://127.0.0.1:4002/v1"})
    other = first.model_copy(update={"model": "gemma3-270m"})
    messages = [{"role": "user", "content": "q"}]
    assert reply_cache_key(first, messages) == reply_cache_key(restarted, messages)
    assert reply_cache_key(first, messages) != reply_cache_key(other, messages)
    remote = EnvConfig(kind="openai", model=first.model, base_url=first.base_url)
    assert reply_cache_key(remote, messages) != reply_cache_key(first, messages)


@pytest.mark.parametrize("system_prompt", [EnvConfig().system_prompt, "Be brief.", None])
def test_system_message_is_sent_first(server, system_prompt):
    env = OpenAIEnvironment(make_cfg(server.base_url, system_prompt=system_prompt))
    (reply,) = asyncio.run(ask_all(env, ["s script:ok"]))
    assert reply.call.error is None
    (sent,) = [r["messages"] for r in server.requests]
    expected = [{"role": "system", "content": system_prompt}] if system_prompt else []
    assert sent == expected + [{"role": "user", "content": "s script:ok"}]
    assert "previous conversations" in EnvConfig().system_prompt  # the default asks it to read the history


@pytest.mark.parametrize("action", ["huge", "hugechunked"])
def test_oversized_reply_fails_without_being_read(action):
    with FaultServer(huge_bytes=300_000) as srv:
        small = OpenAIEnvironment(make_cfg(srv.base_url, max_reply_bytes=100_000))
        (too_big,) = asyncio.run(ask_all(small, [f"big script:{action}"]))
        large = OpenAIEnvironment(make_cfg(srv.base_url, max_reply_bytes=400_000))
        (fits,) = asyncio.run(ask_all(large, [f"fits script:{action}"]))
    assert too_big.call.error and "larger than max_reply_bytes=100000" in too_big.call.error
    assert too_big.call.attempts == 1 and srv.attempts(f"big script:{action}") == 1  # not retried
    assert too_big.text.startswith("[environment error: ") and len(too_big.text) < 400
    assert fits.call.error is None and fits.text == "x" * 300_000


def request_gaps(server, content: str) -> list[float]:
    times = [r["time"] for r in server.requests if r["content"] == content]
    return [b - a for a, b in zip(times, times[1:])]


def test_retry_after_zero_still_waits_the_backoff(server):
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.3))
    content = "r script:429now,429now,ok"
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert reply.call.error is None and reply.call.attempts == 3
    gaps = request_gaps(server, content)
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # backoff_s doubling; Retry-After: 0 does not shorten it


def test_backoff_s_is_the_shortest_pause_of_every_retry(server):
    """backoff_s=0.6: the first pause is at least 0.6 s and the second at least 1.2 s, for statuses
    and timeouts alike (the openai client's own backoff would start at 0.375-0.5 s whatever the
    setting); jitter only lengthens a pause, by at most 25%."""
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.6, timeout_s=0.5, max_retries=3))
    statuses, timeouts = "p script:500,429now,ok", "q script:timeout,timeout,ok"
    ok, slow = asyncio.run(ask_all(env, [statuses, timeouts]))
    assert ok.call.error is None and ok.call.attempts == 3 == server.attempts(statuses)
    first, second = request_gaps(server, statuses)
    assert 0.6 <= first < 0.75 + 1.0 and 1.2 <= second < 1.5 + 1.0  # upper bounds: a loaded machine
    assert slow.call.error is None and slow.call.attempts == 3 == server.attempts(timeouts)
    first, second = request_gaps(server, timeouts)
    assert first >= 0.5 + 0.6 and second >= 0.5 + 1.2  # the timed-out attempt, then the pause


def test_retry_after_up_to_max_retry_after_s_is_waited_for(server):
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.01, max_retry_after_s=5))
    content = "ra script:429wait2,ok"
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert reply.call.error is None and reply.call.attempts == 2 == server.attempts(content)
    (gap,) = request_gaps(server, content)
    assert 1.95 <= gap < 4.5


@pytest.mark.parametrize("asked", ["7", "1e999"])
def test_retry_after_above_max_retry_after_s_fails_at_once_naming_the_setting(server, asked):
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.01, max_retry_after_s=5))
    content = f"rb script:429wait{asked},ok"
    started = time.monotonic()
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert time.monotonic() - started < 2.0  # not waited for, and no shorter retry either
    assert reply.call.attempts == 1 == server.attempts(content)
    error = reply.call.error
    assert error.startswith(f"HTTP 429 from {server.base_url}")
    assert f"asks to retry after {float(asked):g}s, longer than max_retry_after_s=5" in error
    assert "raise max_retry_after_s" in error and "gave up" not in error


def test_x_should_retry_header_wins_over_the_status(server):
    env = OpenAIEnvironment(make_cfg(server.base_url))
    retried, stopped = "xa script:400retry,ok", "xb script:500noretry,ok"
    ok, failed = asyncio.run(ask_all(env, [retried, stopped]))
    assert ok.call.error is None and ok.call.attempts == 2 == server.attempts(retried)
    assert failed.call.error.startswith("HTTP 500") and failed.call.attempts == 1 == server.attempts(stopped)


@pytest.mark.parametrize("action,at_least", [("429ms", 1.45), ("429date", 1.5)])
def test_retry_after_ms_and_http_date_are_honoured(server, action, at_least):
    """`Retry-After-Ms: 1500` wins over `Retry-After: 0`; an HTTP date 3 s ahead (1 s resolution)
    means 2 to 3 s; the client's own first backoff would be at most 0.5 s."""
    env = OpenAIEnvironment(make_cfg(server.base_url))
    content = f"w script:{action},ok"
    (reply,) = asyncio.run(ask_all(env, [content]))
    assert reply.call.error is None and reply.call.attempts == 2 == server.attempts(content)
    (gap,) = request_gaps(server, content)
    assert at_least <= gap < 3.5


def test_malformed_bodies_are_retried_after_the_configured_backoff(server):
    env = OpenAIEnvironment(make_cfg(server.base_url, backoff_s=0.3, max_retries=2))
    good, bad = "m script:garbage,nochoices,ok", "n script:garbage,garbage,garbage,ok"
    ok, failed = asyncio.run(ask_all(env, [good, bad]))
    assert ok.call.error is None and ok.call.attempts == 3 == server.attempts(good)
    gaps = request_gaps(server, good)
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # backoff_s doubling
    assert failed.call.attempts == 3 == server.attempts(bad)  # 1 + max_retries, not one more
    assert "malformed response" in failed.call.error and "gave up after 3 attempts" in failed.call.error


def test_call_deadline_bounds_retries(server):
    # attempts at 0 s and about 1.3 s, each timing out after 1 s; the deadline falls in the second
    # pause (0.6 to 0.75 s), never just as a third request is on its way to the server
    env = OpenAIEnvironment(make_cfg(server.base_url, timeout_s=1.0, max_retries=20, backoff_s=0.3,
                                     call_deadline_s=2.5))
    started = time.monotonic()
    (reply,) = asyncio.run(ask_all(env, ["d script:timeout"]))
    elapsed = time.monotonic() - started
    assert reply.call.error and "call deadline of 2.5s" in reply.call.error
    assert 2.4 <= elapsed < 3.5 and reply.call.latency_s < 3.5
    assert reply.call.attempts == server.attempts("d script:timeout") == 2


def test_timeout_s_bounds_each_attempt_not_each_read(server):
    """A server that drips a byte every 0.2 s for 4 s never leaves a read waiting 1 s, yet each
    attempt must end at timeout_s=1 (the client's own timeout alone lets the drip finish and succeed)."""
    env = OpenAIEnvironment(make_cfg(server.base_url, timeout_s=1.0, max_retries=1, call_deadline_s=60.0))
    (reply,) = asyncio.run(ask_all(env, ["drip script:drip"]))
    assert reply.call.error == f"timeout after 1s from {server.base_url} (gave up after 2 attempts)"
    assert reply.call.attempts == server.attempts("drip script:drip") == 2
    # the same drip within timeout_s is an ordinary reply (the drip itself is well-formed)
    patient = OpenAIEnvironment(make_cfg(server.base_url, timeout_s=30.0, max_retries=0))
    (ok,) = asyncio.run(ask_all(patient, ["drip2 script:drip"]))
    assert ok.call.error is None and ok.text == "echo: drip2 script:drip"


def test_call_deadline_covers_waiting_for_a_slot(server):
    env = OpenAIEnvironment(make_cfg(server.base_url, concurrency=1, call_deadline_s=0.5))

    async def while_the_slot_is_taken():
        _, semaphore = env._bound()
        await semaphore.acquire()  # another call holds the only slot for longer than the deadline
        try:
            return await ask(env, "wait script:ok")
        finally:
            semaphore.release()
            await env.aclose()

    started = time.monotonic()
    reply = asyncio.run(while_the_slot_is_taken())
    assert 0.5 <= time.monotonic() - started < 1.5
    assert reply.call.error == "call deadline of 0.5s reached waiting for a free slot (concurrency 1)"
    assert reply.call.attempts == 0 and server.attempts("wait script:ok") == 0


@pytest.mark.parametrize("field,value", [("max_retries", 21), ("max_retries", -1), ("timeout_s", 3601.0),
                                         ("timeout_s", 0.0), ("backoff_s", 0.0), ("call_deadline_s", 0.0),
                                         ("max_reply_bytes", 10), ("concurrency", 0)])
def test_retry_and_timeout_settings_are_bounded(field, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field):
        make_cfg("http://127.0.0.1:1/v1", **{field: value})


def test_backoff_jitter_is_reproducible_and_apart_for_environments_sharing_a_seed():
    """The malformed-body retry pauses follow the project's seed rule: the same environment and
    seed give the same pauses in every process; two environments with one seed do not retry in
    lockstep."""
    from prompt_r1.env.openai_env import backoff_delay

    def pauses(name: str, seed: int | None) -> list[float]:
        env = OpenAIEnvironment(make_cfg("http://127.0.0.1:9/v1", name=name, seed=seed))
        return [backoff_delay(1.0, 0, env._rng) for _ in range(8)]

    assert pauses("a", 0) == pauses("a", 0)
    assert pauses("a", None) == pauses("a", None)
    assert len({tuple(pauses(n, s)) for n in ("a", "b") for s in (0, 1, None)}) == 6
