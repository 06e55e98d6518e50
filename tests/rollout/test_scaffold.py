"""Guided exploration of the first call (`prompt_r1.rollout.scaffold`, `rollout.scaffold`): which
members a scaffold writes, what their trajectories hold, the refusals, and that nothing but a
training rollout is ever scaffolded."""

from __future__ import annotations

import random

import pytest

from prompt_r1.config.experiment import AgentConfig, RewardConfig, RolloutConfig, parse_config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.rollout.episode import run_rollout
from prompt_r1.rollout.scaffold import (ScaffoldError, assert_unscaffolded, check_scaffold, load_scaffold,
                                        scaffold_turn, scaffolded_members)
from tests.rollout.test_rollout import ANSWER, ScriptedEnv, ScriptedPolicy, question

ASK = "<think>a</think><interaction_prompt>Tell me about {q}</interaction_prompt>"
PROPOSED = "<think>I ask the first part first.</think><interaction_prompt>Which part first?</interaction_prompt>"


def proposing(q: QuestionRow) -> str:
    return PROPOSED


def leaking(q: QuestionRow) -> str:
    return f"<think>x</think><interaction_prompt>Is it {q.golds[0]}?</interaction_prompt>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _rollout(tokenizer, group: int, members: int, scaffold, questions):
    policy = ScriptedPolicy(tokenizer, lambda text, turn: ASK.format(q=turn) if turn == 0 else ANSWER)
    rollout_cfg = RolloutConfig(group_size=group, max_turns=3,
                                scaffold={"fn": "tests.rollout.test_scaffold:proposing", "members": members})
    agent = AgentConfig(max_new_tokens=64, max_response_tokens=1024, max_env_reply_tokens=256)
    return run_rollout(policy, ScriptedEnv(), questions, agent, rollout_cfg, RewardConfig(), seed=0,
                       scaffold=scaffold), policy


@pytest.mark.parametrize("group,members", [(2, 1), (4, 1), (5, 3), (8, 4)])
def test_the_last_members_start_from_the_scaffold_and_go_on_sampling(tokenizer, group, members):
    questions = [question(i) for i in range(3)]
    trajs, policy = _rollout(tokenizer, group, members, proposing, questions)
    proposed_ids = tokenizer.encode(PROPOSED, add_special_tokens=False)
    for t in trajs:
        scaffolded = t.group_index in scaffolded_members(group, members)
        assert t.agent_turns[0] == (PROPOSED if scaffolded else ASK.format(q=0))
        assert t.scaffold_turns == ([0] if scaffolded else [])
        if scaffolded:  # written, not sampled: trained (mask 1), with no sampling log-prob
            n = len(proposed_ids)
            assert t.token_ids[:n] == proposed_ids
            assert t.loss_mask[:n] == [1] * n and t.loss_mask[n] == 0
            assert t.logprobs[:n] == [0.0] * n
        assert t.agent_turns[-1] == ANSWER and len(t.env_calls) == 1   # then on-policy against the environment
        assert t.reward is not None
    # the policy generated every first turn but the scaffold's
    first_turns = sum(len(prompts) for prompts, _ in policy.calls[:1])
    assert first_turns == len(questions) * (group - members)
    unscaffolded, _ = _rollout(tokenizer, group, members, None, questions)
    assert not any(t.scaffold_turns for t in unscaffolded)
    assert_unscaffolded(unscaffolded, "validation")
    with pytest.raises(AssertionError, match="scaffolds run in training rollouts only"):
        assert_unscaffolded(trajs, "validation")


def test_a_scaffold_naming_a_gold_is_refused_for_any_gold():
    rng = random.Random(0)
    scaffold = load_scaffold("tests.rollout.test_scaffold:leaking")
    for i in range(50):
        gold = rng.choice(["Paris", "the Nile", "42", "New York City", "Ωmega"]) + rng.choice(["", " river"])
        q = QuestionRow(f"q{i}", "d", "train", "Where?", [gold, "other"], "qa", "f1")
        with pytest.raises(ScaffoldError, match="names a gold answer"):
            scaffold_turn(scaffold, q)
        # a gold that is only part of a word, or a longer word, is no leak
        assert scaffold_turn(lambda _, g=gold: f"<think>x</think><interaction_prompt>Is it {g}s?</interaction_prompt>",
                             QuestionRow(f"q{i}", "d", "train", "Where?", [gold], "qa", "f1")).startswith("<think>")
    assert check_scaffold(load_scaffold("tests.rollout.test_scaffold:proposing"), [question(0), question(1)]) == 2


def test_a_scaffold_that_writes_no_interaction_turn_or_fails_is_refused():
    q = question(0)
    with pytest.raises(ScaffoldError, match="whole agent turn"):
        scaffold_turn(lambda _: "just text", q)
    with pytest.raises(ScaffoldError, match="raised ZeroDivisionError"):
        scaffold_turn(lambda _: 1 / 0, q)
    with pytest.raises(ScaffoldError, match="rollout.scaffold.fn"):
        load_scaffold("no_such_module_for_scaffolds:f")


@pytest.mark.parametrize("rollout,match", [
    ({"max_staleness": 1, "scaffold": {"fn": "m:f", "members": 1}}, "max_staleness"),
    ({"group_size": 4, "scaffold": {"fn": "m:f", "members": 4}}, "leave at least 1"),
    ({"group_size": 4, "scaffold": {"fn": "m:f", "members": 0}}, "at least 1"),
    ({"scaffold": {"members": 2}}, "fn is not"),
    ({"scaffold": {"follow_up": "m:f"}}, "fn is not"),
])
def test_settings_a_scaffold_cannot_work_with_are_refused(rollout, match):
    with pytest.raises(Exception, match=match):
        parse_config({"rollout": rollout})


@pytest.mark.parametrize("mode", ["metrics", "token-tis", "geo-mask", "both"])
def test_a_scaffold_with_a_rollout_correction_is_refused(mode):
    with pytest.raises(Exception, match="no sampling log-prob"):
        parse_config({"rollout": {"group_size": 4, "scaffold": {"fn": "m:f", "members": 1}},
                      "train": {"rollout_correction": {"mode": mode}}})


def test_an_unset_scaffold_keeps_the_run_hash():
    plain = parse_config({})
    assert plain.hash() == parse_config({"rollout": {"scaffold": {}}}).hash()
    assert plain.hash() != parse_config({"rollout": {"group_size": 4, "scaffold": {"fn": "m:f", "members": 1}}}).hash()
    assert Trajectory("q", 0, []).to_record().keys() == Trajectory("q", 0, [], scaffold_turns=[]).to_record().keys()
    assert "scaffold_turns" not in Trajectory("q", 0, []).to_record()


def test_unsaid_against_a_restatement():
    """A name a turn says counts against it unless some reply said it (whole words, normalised)."""
    from prompt_r1.core.metrics import normalize_answer
    from prompt_r1.rollout.scaffold import unsaid

    def says(text, name):
        return f" {normalize_answer(name)} " in f" {normalize_answer(text)} " and bool(normalize_answer(name))

    rng = random.Random(1)
    words = ["Paris", "the Nile", "Rome", "New York", "42", "Nile"]
    for _ in range(400):
        names = rng.sample(words, rng.randint(1, 3))
        text = " ".join(rng.choice(words + ["is", "it", "where"]) for _ in range(rng.randint(0, 5)))
        replies = [" ".join(rng.choice(words + ["yes"]) for _ in range(rng.randint(0, 3)))
                   for _ in range(rng.randint(0, 2))]
        expected = [n for n in names if says(text, n) and not any(says(r, n) for r in replies)]
        assert unsaid(names, text, replies) == expected


FOLLOWED = "<think>b</think><interaction_prompt>Then what of {reply}?</interaction_prompt>"


def following(q: QuestionRow, replies):
    return FOLLOWED.format(reply=replies[0].split()[0]) if len(replies) == 1 else None


def test_a_follow_up_scaffold_writes_the_scaffolded_members_next_turn_and_only_theirs(tokenizer):
    questions = [question(i) for i in range(2)]
    policy = ScriptedPolicy(tokenizer, lambda text, turn: ASK.format(q=turn) if turn < 2 else ANSWER)
    rollout_cfg = RolloutConfig(group_size=4, max_turns=4, scaffold={
        "fn": "tests.rollout.test_scaffold:proposing", "follow_up": "tests.rollout.test_scaffold:following",
        "members": 2})
    agent = AgentConfig(max_new_tokens=64, max_response_tokens=1024, max_env_reply_tokens=256)
    trajs = run_rollout(policy, ScriptedEnv(), questions, agent, rollout_cfg, RewardConfig(), seed=0,
                        scaffold=proposing, follow_up=following)
    for t in trajs:
        if t.group_index >= 2:   # first and second turns written, the rest sampled
            assert t.scaffold_turns == [0, 1]
            assert t.agent_turns[1] == FOLLOWED.format(reply=t.env_replies[0].split()[0])
            written = [tokenizer.encode(text, add_special_tokens=False) for text in t.agent_turns[:2]]
            from prompt_r1.core.turn_credit import turn_spans
            spans = turn_spans(t.loss_mask)
            for (start, end), ids in zip(spans, written):
                assert t.token_ids[start:end] == ids and t.logprobs[start:end] == [0.0] * len(ids)
        else:
            assert t.scaffold_turns == [] and t.agent_turns[1] == ASK.format(q=1)
        assert t.agent_turns[-1] == ANSWER
