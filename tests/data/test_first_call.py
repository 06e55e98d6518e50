"""The two-hop task's first call (`prompt_r1.data.first_call`): the scaffold never leaks, and the
turn rewards and indicators agree with a restatement over generated trajectories."""

from __future__ import annotations

import random

import pytest

from prompt_r1.core.metrics import normalize_answer
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.data.compositional import follow_up_turn_rewards, generate, known_questions
from prompt_r1.data.first_call import (asks_first_hop, first_hop_scaffold, two_hop_grounded_turn_rewards,
                                      two_hop_indicators, two_hop_turn_rewards)
from prompt_r1.rollout.scaffold import scaffold_turn


def row(q) -> QuestionRow:
    return QuestionRow("q", "compositional_train", "train", q.question, list(q.answers), "multihop_qa", "f1")


def said(text: str, names) -> bool:
    """Restated: a name occurs in the text as whole words, compared lower-case without punctuation or articles."""
    words = " " + " ".join(normalize_answer(text).split()) + " "
    return any(f" {normalize_answer(n)} " in words for n in names if normalize_answer(n))


def said_in_some_form(text: str, names) -> bool:
    """Restated: a name occurs as whole words, its last word perhaps with an adjective's or people's
    ending, once hyphens are word breaks."""
    import re

    flat = " " + " ".join(normalize_answer(text.replace("-", " ")).split()) + " "
    for n in names:
        words = normalize_answer(n.replace("-", " ")).split()
        if words and re.search(" " + " ".join(map(re.escape, words)) + "(|n|an|ean|ian|ese|ish|ic|i) ", flat):
            return True
    return False


def test_the_scaffold_asks_the_first_hop_and_names_neither_bridge_nor_answer_on_every_question():
    questions = generate(0)
    assert len(questions) > 100
    for q in questions:
        turn = first_hop_scaffold(row(q))
        assert q.hops[0].question in turn and q.source in turn
        assert not said(turn, q.hops[0].answers) and not said(turn, q.answers)
        assert scaffold_turn(first_hop_scaffold, row(q)) == turn   # the generic check passes it too
        assert asks_first_hop(q, q.hops[0].question)
        assert not asks_first_hop(q, "Please answer this question briefly: " + q.question)


def bridge_naming(question) -> str:
    q = known_questions()[question.question]
    return f"<think>t</think><interaction_prompt>Tell me about {q.hops[0].answers[-1]}.</interaction_prompt>"


def test_a_scaffold_naming_the_bridge_is_refused_on_every_question():
    from prompt_r1.rollout.scaffold import ScaffoldError, check_scaffold, load_scaffold

    refusing = load_scaffold("tests.data.test_first_call:bridge_naming", "prompt_r1.data.first_call:two_hop_privileged")
    for q in generate(0):
        with pytest.raises(ScaffoldError, match="rollout.scaffold.privileged"):
            check_scaffold(refusing, [row(q)])
    plain = load_scaffold("prompt_r1.data.first_call:first_hop_scaffold", "prompt_r1.data.first_call:two_hop_privileged")
    assert check_scaffold(plain, [row(q) for q in generate(0)]) == len(generate(0))


def test_questions_from_elsewhere_are_refused():
    with pytest.raises(ValueError, match="not a generated two-hop question"):
        first_hop_scaffold(QuestionRow("q", "nq", "train", "Who wrote Hamlet?", ["Shakespeare"], "qa", "f1"))


def _trajectory(rng: random.Random, q) -> Trajectory:
    """A random two-hop trajectory: first call whole or decomposed, replies that may name the bridge."""
    bridge, gold = q.hops[0].answers[0], q.answers[0]
    first = rng.choice([q.question, q.hops[0].question, f"Is it {bridge}?", "Hello"])
    turns = [f"<think>t</think><interaction_prompt>{first}</interaction_prompt>"]
    replies = []
    for _ in range(rng.randint(0, 2)):
        replies.append(rng.choice([f"It is {bridge}.", "I do not know.", f"Maybe {gold}.", "Nothing.",
                                   f"It is {gold}ian.", f"The {gold}-Pacific.", f"It is {gold}ly so.", f"{gold}s"]))
        if len(turns) < 2 and rng.random() < 0.6:
            turns.append(f"<think>t</think><interaction_prompt>{q.hops[1].question}</interaction_prompt>")
    replies = replies[: len(turns)]
    answered = rng.random() < 0.8
    answer = rng.choice([gold, "Atlantis"])
    if answered:
        turns.append(f"<think>t</think><answer>{answer}</answer>")
    if rng.random() < 0.1:
        turns = [f"<think>t</think><answer>{answer}</answer>"]
        replies = []
    return Trajectory("q", 0, [], agent_turns=turns, env_replies=replies, answer=answer if answered else "")


def test_turn_rewards_and_indicators_against_a_restatement():
    rng = random.Random(0)
    questions = list(known_questions().values())
    seen_only_in_a_derived_form = 0
    for _ in range(400):
        q = rng.choice(questions)
        t = _trajectory(rng, q)
        rewards = two_hop_turn_rewards(row(q), t)
        assert len(rewards) == len(t.agent_turns)
        first_is_call = "<interaction_prompt>" in t.agent_turns[0]
        expected_r1 = 1.0 if t.env_replies and said(t.env_replies[0], q.hops[0].answers) else 0.0
        assert rewards[0] == expected_r1
        assert rewards[1:] == follow_up_turn_rewards(row(q), t)[1:]
        ind = two_hop_indicators(row(q), t)
        prompt = t.agent_turns[0].split("<interaction_prompt>")[1].split("</")[0] if first_is_call else None
        relation = q.chain.split(">")[1]
        assert ind["first_hop"] == (None if prompt is None else said(prompt, [q.source]) and not said(prompt, [relation]))
        assert ind["bridge_before_reply"] == (None if prompt is None else said(prompt, q.hops[0].answers))
        answered = "<answer>" in t.agent_turns[-1]
        unseen = any(said(t.answer, [g]) and not any(said_in_some_form(r, [g]) for r in t.env_replies)
                     for g in q.answers)
        assert ind["answer_unseen"] == (unseen if answered else None)
        whole_words_only = any(said(t.answer, [g]) and not any(said(r, [g]) for r in t.env_replies) for g in q.answers)
        seen_only_in_a_derived_form += answered and whole_words_only and not unseen
    assert seen_only_in_a_derived_form >= 10   # the cases where the two rules differ were generated


def test_the_grounded_answer_reward_against_a_restatement():
    """The third turn, an answer after two calls, earns 1 exactly when a reply named (in any form)
    a gold the answer names; every other turn is `two_hop_turn_rewards`'."""
    rng = random.Random(1)
    questions = list(known_questions().values())
    by_value = {1.0: 0, 0.0: 0, "memory": 0}
    for _ in range(600):
        q = rng.choice(questions)
        t = _trajectory(rng, q)
        grounded, plain = two_hop_grounded_turn_rewards(row(q), t), two_hop_turn_rewards(row(q), t)
        third_answers = len(t.agent_turns) == 3 and "<answer>" in t.agent_turns[2]
        assert grounded[:2] == plain[:2] and len(grounded) == len(plain)
        if not third_answers:
            assert grounded == plain
            continue
        named = [g for g in q.answers if said(t.answer, [g])]
        expected = 1.0 if any(said_in_some_form(r, [g]) for g in named for r in t.env_replies) else 0.0
        assert grounded[2] == expected
        by_value[expected] += 1
        by_value["memory"] += bool(named) and expected == 0.0   # right, but no reply said it
    assert min(by_value.values()) >= 10, by_value   # each case was generated


def test_the_follow_up_asks_the_second_hop_about_the_country_the_first_reply_named_on_every_question():
    from prompt_r1.data.compositional import COUNTRIES
    from prompt_r1.data.first_call import second_hop_scaffold
    from prompt_r1.rollout.scaffold import follow_up_turn, load_scaffold

    guarded = load_scaffold("prompt_r1.data.first_call:second_hop_scaffold",
                            "prompt_r1.data.first_call:two_hop_privileged", "rollout.scaffold.follow_up")
    rng = random.Random(0)
    for q in generate(0):
        other = rng.choice([c for c in COUNTRIES if c.name != q.country])
        named = rng.choice([q.country, other.name])
        reply = rng.choice(["{} it is.", "It is in {}.", "The answer: {}, of course."]).format(named)
        turn = follow_up_turn(guarded, row(q), (reply,))
        assert turn is not None and named in turn
        prompt = turn.split("<interaction_prompt>")[1]
        if named == q.country:   # the right country: the second hop exactly as the generator asks it
            assert q.hops[1].question in prompt
        assert not said(prompt, q.answers) or said(reply, q.answers)   # a gold only where the reply said it
        # nothing to go on, or a second reply: the policy writes the turn
        assert second_hop_scaffold(row(q), ("I do not know.",)) is None
        assert second_hop_scaffold(row(q), (reply, "More text.")) is None


def test_a_follow_up_may_say_the_bridge_only_after_a_reply_did():
    from prompt_r1.rollout.scaffold import ScaffoldError, follow_up_turn, load_scaffold

    guarded = load_scaffold("prompt_r1.data.first_call:second_hop_scaffold",
                            "prompt_r1.data.first_call:two_hop_privileged", "rollout.scaffold.follow_up")
    naming = load_scaffold("tests.data.test_first_call:bridge_naming_follow_up",
                           "prompt_r1.data.first_call:two_hop_privileged", "rollout.scaffold.follow_up")
    for q in generate(0)[:60]:
        bridge = q.hops[0].answers[0]
        assert follow_up_turn(guarded, row(q), (f"That is {bridge}.",)) is not None
        with pytest.raises(ScaffoldError, match="rollout.scaffold.privileged"):
            follow_up_turn(naming, row(q), ("I do not know.",))
        assert follow_up_turn(naming, row(q), (f"Yes, {q.hops[0].answers[-1]}.",)) is not None


def bridge_naming_follow_up(question, replies) -> str:
    return bridge_naming(question)
