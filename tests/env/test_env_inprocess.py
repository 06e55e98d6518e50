"""InProcessEnvironment on real (tiny, random) transformers models: batching, usage, determinism."""

from __future__ import annotations

import asyncio

import pytest

from prompt_r1.env import open_environment
from prompt_r1.env.base import with_system
from prompt_r1.env.inprocess import InProcessEnvironment
from prompt_r1.config.env import EnvConfig
from prompt_r1.models.bundled import CHATML_TEMPLATE


def conversation(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question number {i}" + "!" * i}]


@pytest.fixture(scope="module")
def env(_model_cache):
    cfg = EnvConfig(name="tiny-env", kind="inprocess", model="tiny", max_tokens=12, temperature=0.0, cache=False)
    return InProcessEnvironment(cfg)


async def _gather(env, conversations):
    return await asyncio.gather(*(env.reply(m, turn=t) for t, m in enumerate(conversations)))


def test_concurrent_replies_are_batched_with_real_token_counts(env):
    env.batch_sizes.clear()
    conversations = [conversation(i) for i in range(6)]
    replies = asyncio.run(_gather(env, conversations))
    assert env.batch_sizes == [6]  # one left-padded generate for the six calls
    for turn, (messages, reply) in enumerate(zip(conversations, replies)):
        assert reply.call.error is None and isinstance(reply.text, str)
        assert reply.call.turn == turn and reply.call.env_name == "tiny-env" and reply.call.model == "tiny"
        assert reply.call.prompt_tokens == len(env.encode(with_system(env.cfg, messages)))
        assert 1 <= reply.call.completion_tokens <= 12
        assert reply.call.attempts == 1 and not reply.call.cached and reply.call.latency_s > 0
    # the byte tokenizer: prompt length grows with the message
    assert [r.call.prompt_tokens for r in replies] == sorted(r.call.prompt_tokens for r in replies)


def test_batched_greedy_replies_match_one_by_one(env):
    conversations = [conversation(i) for i in range(4)]
    batched = asyncio.run(_gather(env, conversations))

    async def one_by_one():
        return [await env.reply(m) for m in conversations]

    env.batch_sizes.clear()
    single = asyncio.run(one_by_one())
    assert env.batch_sizes == [1, 1, 1, 1]
    assert [r.text for r in batched] == [r.text for r in single]  # left padding does not change the reply
    assert [r.call.completion_tokens for r in batched] == [r.call.completion_tokens for r in single]
    again = asyncio.run(_gather(env, conversations))
    assert [r.text for r in again] == [r.text for r in batched]  # greedy: same input, same output


def test_reply_text_is_the_decoded_new_tokens(env):
    messages = conversation(2)
    (reply,) = asyncio.run(_gather(env, [messages]))
    (ids,) = env.generate_ids([env.encode(messages)])
    assert reply.text == env.tokenizer.decode(ids, skip_special_tokens=True)
    assert reply.call.completion_tokens == len(ids)


def test_calls_arriving_during_a_batch_join_the_next_one(env):
    env.batch_sizes.clear()

    async def staggered():
        first = [asyncio.ensure_future(env.reply(conversation(i))) for i in range(2)]
        await asyncio.sleep(0.05)  # the first batch is generating now
        later = [asyncio.ensure_future(env.reply(conversation(i))) for i in range(2, 5)]
        return await asyncio.gather(*first, *later)

    replies = asyncio.run(staggered())
    assert all(r.call.error is None for r in replies)
    assert sum(env.batch_sizes) == 5 and len(env.batch_sizes) <= 3 and max(env.batch_sizes) >= 2


def test_failures_become_error_replies(env):
    too_long = [{"role": "user", "content": "x" * 5000}]  # > 4096 positions with the byte tokenizer
    replies = asyncio.run(_gather(env, [too_long, [], conversation(1)]))
    assert "exceeds the context of 4096" in replies[0].call.error
    assert replies[0].text.startswith("[environment error: prompt of ")
    assert replies[1].call.error.startswith("no messages to send")
    assert replies[2].call.error is None  # one bad call does not spoil the batch


def test_open_environment_and_chat_template_override(tmp_path, _model_cache):
    template_file = tmp_path / "plain.jinja"
    template_file.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                             "{% if add_generation_prompt %}assistant: {% endif %}")
    cfg = EnvConfig(name="t", kind="inprocess", model="tiny", max_tokens=4, chat_template=str(template_file),
                    system_prompt="Be brief.")
    with open_environment(cfg) as custom:
        assert isinstance(custom, InProcessEnvironment)
        ids = custom.encode([{"role": "user", "content": "hi"}])
        assert custom.tokenizer.decode(ids) == "user: hi\nassistant: "
        reply = asyncio.run(custom.reply([{"role": "user", "content": "hi"}]))
        sent = "system: Be brief.\nuser: hi\nassistant: "  # the configured system message comes first
        assert reply.call.error is None and reply.call.prompt_tokens == len(custom.tokenizer.encode(sent))
    with open_environment(cfg.model_copy(update={"system_prompt": None})) as bare:
        reply = asyncio.run(bare.reply([{"role": "user", "content": "hi"}]))
        assert reply.call.error is None and reply.call.prompt_tokens == len(ids)
    inline = InProcessEnvironment(cfg.model_copy(update={"chat_template": CHATML_TEMPLATE}))
    assert inline.tokenizer.decode(inline.encode([{"role": "user", "content": "hi"}])) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sampling_is_seeded_and_leaves_global_rng_alone(_model_cache):
    import torch

    cfg = EnvConfig(name="s", kind="inprocess", model="tiny", max_tokens=8, temperature=1.0, seed=3)
    texts = []
    for _ in range(2):
        sampler = InProcessEnvironment(cfg)
        torch.manual_seed(123)
        state = torch.random.get_rng_state()
        texts.append(asyncio.run(_gather(sampler, [conversation(i) for i in range(3)])))
        assert torch.equal(torch.random.get_rng_state(), state)
    assert [r.text for r in texts[0]] == [r.text for r in texts[1]]


def test_an_in_process_environment_opened_with_a_warehouse_caches_its_replies(_model_cache, tmp_path):
    """The reply cache is every kind's (`Environment.reply`): opened with a warehouse, an in-process
    environment answers a repeated call from it (no generate), still batches the calls it makes, and
    stores no failed call; with `cache: false` or no warehouse every call is made."""
    from prompt_r1.api import open_warehouse

    cfg = EnvConfig(name="tiny-env", kind="inprocess", model="tiny", max_tokens=8, temperature=0.0)
    conversations = [conversation(i) for i in range(3)]
    with open_warehouse(tmp_path / "wh.duckdb") as wh:
        with open_environment(cfg, warehouse=wh) as cached:
            first = asyncio.run(_gather(cached, conversations))
            assert cached.batch_sizes == [3] and not any(r.call.cached for r in first)
            again = asyncio.run(_gather(cached, [*conversations, conversation(7)]))
            assert cached.batch_sizes == [3, 1]  # only the new conversation reached the model
            assert [r.call.cached for r in again] == [True, True, True, False]
            assert [r.text for r in again[:3]] == [r.text for r in first]
            assert [r.call.prompt_tokens for r in again[:3]] == [r.call.prompt_tokens for r in first]
            assert all(r.call.attempts == 0 for r in again[:3])
            failed = asyncio.run(cached.reply([{"role": "user", "content": "x" * 5000}]))  # past the context
            assert failed.call.error and wh.query("SELECT count(*) FROM env_cache")[0][0] == 4
        for off in (cfg.model_copy(update={"cache": False}), cfg):
            with open_environment(off, warehouse=wh if not off.cache else None) as uncached:
                replies = asyncio.run(_gather(uncached, conversations))
                assert uncached.batch_sizes == [3] and not any(r.call.cached for r in replies)
