"""Protocol parsing and the dual-constrained reward, against hand-computed reference values."""

import pytest

from prompt_r1.protocol import (
    build_agent_prompt, env_messages, extract_answer, is_answer_turn, is_interaction_turn,
    parse_turn, split_question, wrap_env_reply,
)
from prompt_r1.reward import compute_reward, format_score

ASK = "<think>explain</think>\n<interaction_prompt>What is X?</interaction_prompt>"
FINAL = "<think>done</think>\n<answer>Paris</answer>"


def test_prompt_roundtrip_matches_reference_text(shared_data):
    import duckdb

    content = duckdb.connect().execute(
        f"SELECT prompt[1].content FROM read_parquet('{shared_data}/eval/hotpot.parquet') LIMIT 1"
    ).fetchall()[0][0]
    question = split_question(content)
    assert build_agent_prompt(question) == content


def test_parse_turn_parts():
    turn = parse_turn(ASK)
    assert (turn.think, turn.interaction_prompt, turn.answer) == ("explain", "What is X?", None)
    assert parse_turn(FINAL).kind == "answer"


def test_interaction_turn_must_be_exact():
    assert is_interaction_turn(ASK)
    assert not is_interaction_turn("<interaction_prompt>x</interaction_prompt>")  # no think
    assert not is_interaction_turn(ASK + ASK)  # two of each
    assert not is_interaction_turn("<think>a</think>hello<interaction_prompt>b</interaction_prompt>")
    assert not is_interaction_turn(ASK + "<answer>x</answer>")


def test_answer_turn_and_extraction():
    assert is_answer_turn(FINAL)
    assert not is_answer_turn("<think>a</think><answer>b</answer><answer>c</answer>")
    assert extract_answer(FINAL) == "Paris"
    assert extract_answer(ASK) == ""


def test_env_history_and_wrapping():
    assert env_messages(["p1"], []) == [{"role": "user", "content": "p1"}]
    msgs = env_messages(["p1", "p2", "p3"], ["r1", "r2"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    with pytest.raises(ValueError):
        env_messages(["p1"], ["r1"])
    assert wrap_env_reply("hi").strip() == "<interaction_response>hi</interaction_response>"


@pytest.mark.parametrize(
    "turns, expected_format",
    [
        ([ASK, FINAL], 1.0),                     # 0.4 + 0.25 + 0.25 + 0.1, capped
        ([ASK, ASK, ASK, FINAL], 1.0),           # 1.2 + 0.6 capped at 1.0
        ([FINAL], 0.6),                          # never asked: cannot reach the cap
        (["garbage", FINAL], 0.6),               # malformed interaction turn earns nothing
        ([ASK, "<answer>Paris</answer>"], 0.9),  # no think in the final turn: no +0.1
        ([ASK, "<think>t</think><answer></answer>"], 0.4),  # empty answer earns nothing
        ([ASK, "<think>t</think><answer>  </answer>"], 0.75),  # present but blank after strip
        ([ASK, ASK], 0.4),                       # ran out of turns, no answer
        ([], 0.0),
    ],
)
def test_format_score_reference_values(turns, expected_format):
    assert format_score(turns) == pytest.approx(expected_format)


def test_total_counts_answer_only_at_cap():
    full = compute_reward([ASK, FINAL], ["Paris"])
    assert (full.format, full.answer, full.total) == (1.0, 1.0, 1.0)
    wrong = compute_reward([ASK, "<think>d</think><answer>Lyon</answer>"], ["Paris"])
    assert wrong.total == pytest.approx(0.0)
    partial = compute_reward([ASK, "<think>d</think><answer>Paris France</answer>"], ["Paris"])
    assert partial.answer == pytest.approx(2 / 3) and partial.total == pytest.approx(2 / 3)
    uncapped = compute_reward([FINAL], ["Paris"])
    assert uncapped.answer == 1.0 and uncapped.total == pytest.approx(-0.4)


def test_answer_uses_best_gold_and_configurable_weights():
    r = compute_reward([ASK, "<think>d</think><answer>Shakespeare</answer>"], ["William Shakespeare", "Shakespeare"])
    assert r.answer == 1.0
    lenient = compute_reward([FINAL], ["Paris"], format_cap=0.6)
    assert lenient.format == pytest.approx(0.6) and lenient.total == pytest.approx(0.6)
