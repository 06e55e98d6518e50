"""The compositional (two-hop) task: its questions agree with the fact table, its split keeps each
country on one side, it is determined by its seed, and the follow-up measure says what it claims.

Each rule is checked against an independent statement of it: the hops are re-derived from the
fact table by looking the bridge country up by name, and the split is checked over many seeds
and sizes (a hand-rolled property test: no hypothesis here).
"""

from __future__ import annotations

import random

import pytest

from prompt_r1.core.metrics import normalize_answer
from prompt_r1.data.compositional import (
    CHAINS, COUNTRIES, TwoHopQuestion, follow_up, generate, reply_names, split_by_entity,
)

QUESTIONS = generate(0)
BY_NAME = {name: c for c in COUNTRIES for name in c.names}


def test_hops_agree_with_the_fact_table():
    assert len(QUESTIONS) >= 300 and {q.chain for q in QUESTIONS} == {f"{a}>{b}" for a, b in CHAINS}
    for q in QUESTIONS:
        hop1, hop2 = q.hops
        country = BY_NAME[hop1.answers[0]]          # the bridge: what the first hop answers
        assert country.name == q.country and hop1.answers == country.names
        first, relation = q.chain.split(">")
        sources = {"capital": country.capital, "city": country.cities, "landmark": country.landmarks,
                   "person": country.people}[first]
        assert q.source in sources and q.source in hop1.question and q.source in q.question
        gold = country.capital if relation == "capital" else getattr(country, relation)
        assert q.answers == hop2.answers == gold     # the composed answer is the second hop's
        assert country.name in hop2.question and country.name not in q.question


def test_no_question_states_its_own_answer():
    for q in QUESTIONS:
        for text, answers in ((q.question, q.answers), *((h.question, h.answers) for h in q.hops)):
            words = f" {normalize_answer(text)} "
            assert not any(f" {normalize_answer(a)} " in words for a in answers), text


def test_determined_by_the_seed():
    assert generate(0) == QUESTIONS
    other = generate(1)
    assert other != QUESTIONS and sorted(other, key=lambda q: q.question) == sorted(QUESTIONS, key=lambda q: q.question)
    assert split_by_entity(QUESTIONS, 60, 3) == split_by_entity(generate(0), 60, 3)


def test_split_keeps_every_country_on_one_side():
    rng = random.Random(0)
    for trial in range(40):
        pool = rng.sample(QUESTIONS, rng.randint(40, len(QUESTIONS)))
        probe_min = rng.randint(1, len(pool) // 2)
        probe, train = split_by_entity(pool, probe_min, seed=trial)
        assert not {q.country for q in probe} & {q.country for q in train}
        assert len(probe) >= probe_min and train
        assert sorted(map(id, probe + train)) == sorted(map(id, pool))   # nothing lost or doubled
        # whole countries: dropping the last country added would leave the probe short
        assert len(probe) - max(sum(q.country == c for q in probe) for c in {q.country for q in probe}) < probe_min \
            or len({q.country for q in probe}) == 1


def test_split_names_what_is_missing():
    with pytest.raises(ValueError, match="probe set of 500"):
        split_by_entity(QUESTIONS[:100], 500)


def test_rows_are_ingestible(tmp_path):
    """A written row reads back through the pipeline's JSONL reader (as data/compositional does)."""
    import json

    from prompt_r1.data.files import read_jsonl

    path = tmp_path / "compositional_probe.jsonl"
    path.write_text("".join(json.dumps(q.row("compositional_probe")) + "\n" for q in QUESTIONS[:5]))
    table = read_jsonl(path).to_pylist()
    assert [r["question"] for r in table] == [q.question for q in QUESTIONS[:5]]
    assert {r["task_family"] for r in table} == {"multihop_qa"}


TOKYO = next(q for q in QUESTIONS if q.chain == "capital>continent" and q.source == "Tokyo")


@pytest.mark.parametrize("prompts, replies, expected", [
    (["Please answer: " + TOKYO.question], ["The capital of Japan is Tokyo."], (1, False, False, False)),
    ([TOKYO.question, "On which continent is Japan?"], ["The capital of Japan is Tokyo.", "Asia."],
     (2, True, True, True)),
    # a second call that repeats the question uses nothing the reply said
    ([TOKYO.question, "Please answer: " + TOKYO.question], ["The capital of Japan is Tokyo.", "?"],
     (2, True, False, False)),
    # it uses the reply's words, but the reply named the wrong country: uses, not the bridge
    ([TOKYO.question, "Where is China?"], ["Tokyo is in China.", "Asia"], (2, True, True, False)),
])
def test_follow_up(prompts, replies, expected):
    got = follow_up(TOKYO, prompts, replies)
    assert (got.calls, got.second_call, got.uses_reply, got.names_bridge) == expected


def test_reply_names_skip_the_question_and_filler():
    assert reply_names("The answer is Japan. It is in Asia.", "Where is Tokyo?") == {"japan", "asia"}
    assert reply_names("Tokyo.", "Where is Tokyo?") == set()


def test_warm_start_examples_avoid_the_fact_table():
    """The follow-up warm start teaches the shape on entities no generated question uses."""
    from prompt_r1.models.warm_start import TWO_HOP_EXAMPLES

    table = " ".join(q.question + " " + " ".join(h.question + " " + " ".join(h.answers) for h in q.hops)
                     for q in QUESTIONS).lower()
    for question, reply1, bridge, hop2, reply2, answer in TWO_HOP_EXAMPLES:
        assert bridge.lower() not in table, bridge
        assert question not in {q.question for q in QUESTIONS}
        assert bridge in reply1 and bridge in hop2 and answer.lower() in reply2.lower()


def test_follow_up_warm_start_turn_shapes():
    from prompt_r1.core.protocol import is_answer_turn, is_interaction_turn
    from prompt_r1.models.bundled import byte_tokenizer
    from prompt_r1.models.warm_start import TWO_HOP_EXAMPLES, _examples

    tokenizer = byte_tokenizer()
    plain = _examples(tokenizer, random.Random(0), copy_question=True)
    pairs = _examples(tokenizer, random.Random(0), copy_question=True, follow_up=True)
    assert len(pairs) == len(plain) + 3 * len(TWO_HOP_EXAMPLES)
    targets = [tokenizer.decode(t) for _, t in pairs[: 3 * len(TWO_HOP_EXAMPLES)]]
    for i in range(0, len(targets), 3):
        ask, follow, answer = targets[i: i + 3]
        assert is_interaction_turn(ask) and is_interaction_turn(follow) and is_answer_turn(answer)
    prompt, last_context = tokenizer.decode(pairs[0][0]), tokenizer.decode(pairs[2][0])
    assert last_context.startswith(prompt) and last_context[len(prompt):].count("<interaction_response>") == 2


def test_question_type():
    assert isinstance(TOKYO, TwoHopQuestion) and TOKYO.answers == ("Asia",)


def test_mentions_needs_whole_words():
    """The screen's pass test: a gold named as words, not as letters inside another word."""
    from prompt_r1.data.compositional import mentions

    assert mentions("The currency of South Korea is the won.", ["won"])
    assert not mentions("I won't say; it is wonderful.", ["won"])
    assert not mentions("Because of Ukraine", ["US", "UK"])
    assert mentions("It is the U.S. dollar", ["dollar"]) and mentions("The Eiffel Tower", ["eiffel tower"])
