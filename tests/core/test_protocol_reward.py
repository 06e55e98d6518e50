"""Protocol parsing and the dual-constrained reward, against hand-computed reference values."""

import pytest

from prompt_r1.core.protocol import (
    build_agent_prompt, env_messages, extract_answer, is_answer_turn, is_interaction_turn,
    parse_turn, split_question, wrap_env_reply,
)
from prompt_r1.core.reward import compute_reward, format_score

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
    assert is_interaction_turn(ASK + "\n")  # `$` matches before one final newline
    assert not is_interaction_turn(ASK + "\n\n")
    assert not is_interaction_turn(" " + ASK)  # nothing may lead the turn
    assert not is_interaction_turn("\n" + ASK)
    assert not is_interaction_turn(ASK + " ")
    assert not is_interaction_turn("<interaction_prompt>x</interaction_prompt>")  # no think
    assert not is_interaction_turn(ASK + ASK)  # two of each
    assert not is_interaction_turn("<think>a<think></think><interaction_prompt>b</interaction_prompt>")  # duplicate
    assert not is_interaction_turn("<think>a</think>hello<interaction_prompt>b</interaction_prompt>")
    assert not is_interaction_turn(ASK + "<answer>x</answer>")


def test_answer_turn_and_extraction():
    assert is_answer_turn(FINAL)
    assert is_answer_turn(FINAL + "\n")
    assert not is_answer_turn(FINAL + "\n\n")
    assert not is_answer_turn(" " + FINAL)
    assert is_answer_turn("<think>a</think>\nFinal answer: <answer>b</answer>")  # text before <answer> is fine
    assert is_answer_turn("<think>a</think><answer>b</answer><answer>c</answer>")  # the reference's regex allows it
    assert not is_answer_turn("<think>a</think><answer>b</answer> done")
    assert extract_answer(FINAL) == "Paris"
    assert extract_answer(ASK) == ""
    assert extract_answer("<think>a</think><answer>Lyon</answer><answer>Paris</answer>") == "Lyon"  # first wins
    assert extract_answer("<answer> </answer><answer>Paris</answer>") == ""
    assert parse_turn("<answer> </answer><answer>Paris</answer>").kind == "answer"


def test_evaluation_reads_the_same_answer_as_the_reward():
    from prompt_r1.evaluation.answers import extract_agent_only_answer

    two = "<think>a</think><answer> Lyon </answer><answer>Paris</answer>"
    assert extract_agent_only_answer(two) == extract_answer(two) == "Lyon"
    assert compute_reward([ASK, two], ["Lyon"]).answer == 1.0


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
        ([ASK, FINAL], 1.0),                     # 0.4 + 0.5 + 0.1
        ([ASK, ASK, ASK, FINAL], 1.0),           # 1.2 + 0.6 capped at 1.0
        ([FINAL], 0.6),                          # never asked: cannot reach the cap
        (["garbage", FINAL], 0.6),               # malformed interaction turn earns nothing
        ([" " + ASK, FINAL], 0.6),               # leading white space: the turn earns nothing
        ([ASK + " ", FINAL], 0.6),               # trailing white space too
        ([ASK + "\n", FINAL + "\n"], 1.0),       # one final newline is allowed
        ([ASK, "<answer>Paris</answer>"], 0.9),  # no think in the final turn: no +0.1
        ([ASK, " " + FINAL], 0.9),               # leading white space on the final turn: no +0.1
        ([ASK, "<think>t</think>\nFinal answer: <answer>Paris</answer>"], 1.0),  # text before <answer>
        ([ASK, "<think>t</think><answer></answer>"], 0.4),  # empty answer earns nothing
        ([ASK, "<think>t</think><answer>  </answer>"], 0.4),  # blank answer earns nothing
        ([ASK, "<think>t</think><answer> </answer><answer>Paris</answer>"], 0.4),  # the first answer counts
        ([ASK, ASK], 0.4),                       # ran out of turns, no answer
        ([], 0.0),
    ],
)
def test_format_score_reference_values(turns, expected_format):
    assert format_score(turns) == pytest.approx(expected_format, abs=1e-12)


def test_worked_values_of_the_spec():
    first = "<think>t</think><interaction_prompt>q</interaction_prompt>"
    final = "<think>t</think>\nFinal answer: <answer>Paris</answer>"
    full = compute_reward([first, final], ["Paris"])
    assert (full.format, full.total) == (1.0, 1.0)
    blank = compute_reward([first, "<think>t</think><answer>  </answer>"], ["Paris"])
    assert blank.format == pytest.approx(0.4, abs=1e-12) and blank.total == pytest.approx(-0.6, abs=1e-12)
    leading = compute_reward([" " + first, final], ["Paris"])
    assert leading.format == pytest.approx(0.6, abs=1e-12)  # the first turn scores 0, the final 0.6
    assert leading.total == pytest.approx(-0.4, abs=1e-12)  # gate shut: the correct answer adds nothing


def test_config_defaults_are_the_reward_defaults():
    import inspect

    from prompt_r1.config.experiment import RewardConfig

    params = inspect.signature(compute_reward).parameters
    defaults = RewardConfig().format_weights()  # the weights compute_reward takes (cost is apart)
    assert defaults == {name: params[name].default for name in params if name not in ("agent_turns", "golds", "answer_score")}
    assert defaults == {"think_prompt_score": 0.4, "nonblank_answer_score": 0.5, "final_format_score": 0.1,
                        "format_cap": 1.0}


def test_total_counts_answer_only_at_cap():
    full = compute_reward([ASK, FINAL], ["Paris"])
    assert (full.format, full.answer, full.total) == (1.0, 1.0, 1.0)
    wrong = compute_reward([ASK, "<think>d</think><answer>Lyon</answer>"], ["Paris"])
    assert wrong.total == pytest.approx(0.0)
    last_right = compute_reward([ASK, "<think>d</think><answer>Lyon</answer><answer>Paris</answer>"], ["Paris"])
    assert (last_right.format, last_right.answer) == (1.0, 0.0)
    partial = compute_reward([ASK, "<think>d</think><answer>Paris France</answer>"], ["Paris"])
    assert partial.answer == pytest.approx(2 / 3) and partial.total == pytest.approx(2 / 3)
    uncapped = compute_reward([FINAL], ["Paris"])
    assert uncapped.answer == 1.0 and uncapped.total == pytest.approx(-0.4)


def test_answer_uses_best_gold_and_configurable_weights():
    r = compute_reward([ASK, "<think>d</think><answer>Shakespeare</answer>"], ["William Shakespeare", "Shakespeare"])
    assert r.answer == 1.0
    lenient = compute_reward([FINAL], ["Paris"], format_cap=0.6)
    assert lenient.format == pytest.approx(0.6) and lenient.total == pytest.approx(0.6)
