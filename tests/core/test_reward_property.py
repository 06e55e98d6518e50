"""`compute_reward` against a second, independent statement of the reward rules.

The oracle below is written from the rule text alone and shares no code with
`prompt_r1.core.protocol`, `prompt_r1.core.reward` or `prompt_r1.core.metrics`: it decides the turn grammar
with plain string search instead of regular expressions, and does its own SQuAD F1. A second
test checks that string-search reading against the rule's regular expressions (copied here
verbatim), so the oracle is itself pinned to the spec. Trajectories come from a seeded
generator that mutates well-formed turns (white space around turns, blank answers, several
`<answer>`s, text between `</think>` and `<answer>`, duplicated, missing and swapped tags,
trailing newlines), and the test asserts that every one of those branches was exercised.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter

import pytest

from prompt_r1.core.reward import compute_reward

N_TRAJECTORIES = 4000
SEED = 20251101

# The rule's regular expressions, verbatim (Python `re`, DOTALL, `re.search`).
SPEC_MID = r"^<think>(.*?)</think>(\s*)<interaction_prompt>(.*?)</interaction_prompt>$"
SPEC_FIN = r"^<think>(.*?)</think>(.*?)<answer>(.*?)</answer>$"
SPEC_ANS = r"<answer>(.*?)</answer>"


# ---------------------------------------------------------------- oracle (string search only)

def _anchored_bodies(text: str) -> list[str]:
    """What `^...$` may span: the whole text, or all but one final newline."""
    return [text, text[:-1]] if text.endswith("\n") else [text]


def oracle_mid(text: str) -> bool:
    """<think> .. </think> white space <interaction_prompt> .. </interaction_prompt>, start to end."""
    for body in _anchored_bodies(text):
        if not (body.startswith("<think>") and body.endswith("</interaction_prompt>")):
            continue
        end = len(body) - len("</interaction_prompt>")
        close = body.find("</think>", len("<think>"))
        while close != -1:
            rest = close + len("</think>")
            gap = len(rest_text := body[rest:]) - len(rest_text.lstrip())
            opening = rest + gap
            if body.startswith("<interaction_prompt>", opening) and opening + len("<interaction_prompt>") <= end:
                return True
            close = body.find("</think>", close + 1)
    return False


def oracle_fin(text: str) -> bool:
    """<think> .. </think> anything <answer> .. </answer>, start to end."""
    for body in _anchored_bodies(text):
        if not (body.startswith("<think>") and body.endswith("</answer>")):
            continue
        close = body.find("</think>", len("<think>"))
        if close == -1:
            continue
        opening = body.find("<answer>", close + len("</think>"))
        if opening != -1 and opening + len("<answer>") <= len(body) - len("</answer>"):
            return True
    return False


def oracle_first_answer(text: str) -> str | None:
    opening = text.find("<answer>")
    if opening == -1:
        return None
    close = text.find("</answer>", opening + len("<answer>"))
    return None if close == -1 else text[opening + len("<answer>") : close]


def oracle_normalize(text: str) -> list[str]:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def oracle_f1(prediction: str, golds: list[str]) -> float:
    best = 0.0
    pred = oracle_normalize(prediction)
    for gold in golds:
        ref = oracle_normalize(gold)
        same = sum(min(pred.count(w), ref.count(w)) for w in set(pred) & set(ref))
        if same:
            p, r = same / len(pred), same / len(ref)
            best = max(best, 2 * p * r / (p + r))
    return best


def oracle_reward(turns: list[str], golds: list[str]) -> tuple[float, float, float]:
    """(format, answer, total) by the rule text."""
    fmt = 0.0
    for turn in turns[:-1]:
        counts_ok = all(
            turn.count(tag) == 1 for tag in ("<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>")
        )
        if counts_ok and oracle_mid(turn):
            fmt += 0.4
    answer_text = ""
    if turns:
        found = oracle_first_answer(turns[-1])
        answer_text = found.strip() if found is not None else ""
        if answer_text:
            fmt += 0.5
            if oracle_fin(turns[-1]):
                fmt += 0.1
    fmt = min(fmt, 1.0)
    answer = oracle_f1(answer_text, golds) if answer_text else 0.0
    total = -1.0 + fmt + answer if abs(fmt - 1.0) <= 1e-9 else -1.0 + fmt
    return fmt, answer, total


# ---------------------------------------------------------------- trajectory generator

WORDS = ["Paris", "paris", "the", "The", "a", "an", "Eiffel", "Tower", "France", "1889", "Lyon",
         "William", "Shakespeare", "é", "x", "42", "yes", "no"]
PUNCT = ["", "", ".", ",", "!", "'s", "?"]
SPACES = [" ", "\n", "\t", "  ", "\n\n", "\r\n"]
TAGS = ["<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>", "<answer>", "</answer>"]
GOLDS = [["Paris"], ["the Eiffel Tower"], ["William Shakespeare", "Shakespeare"], ["1889"], ["France", "Paris"]]


def _phrase(rng: random.Random) -> str:
    n = rng.choice([0, 1, 1, 2, 3])
    return rng.choice(["", " ", "\n"]) * (rng.random() < 0.2) + " ".join(
        rng.choice(WORDS) + rng.choice(PUNCT) for _ in range(n)
    )


def _answer_text(rng: random.Random, golds: list[str]) -> str:
    roll = rng.random()
    if roll < 0.15:
        return ""
    if roll < 0.3:
        return rng.choice(SPACES)
    if roll < 0.55:
        return rng.choice(["", " ", "\n"]) + rng.choice(golds) + rng.choice(["", " ", ".", "\n"])
    return _phrase(rng)


def _between(rng: random.Random) -> str:
    return rng.choice(["", "", "\n", " \n ", "Final answer: ", "\nSo the answer is", "x\n"])


def _mutate(rng: random.Random, parts: list[str]) -> list[str]:
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3])):
        kind = rng.randrange(5)
        i = rng.randrange(len(parts) + 1)
        if kind == 0 and parts:  # drop a piece (missing tag or content)
            parts.pop(min(i, len(parts) - 1))
        elif kind == 1 and parts:  # duplicate a piece (duplicate tag)
            j = rng.randrange(len(parts))
            parts.insert(i, parts[j])
        elif kind == 2:  # stray tag anywhere
            parts.insert(i, rng.choice(TAGS))
        elif kind == 3:  # stray text anywhere
            parts.insert(i, rng.choice(["junk", " ", "\n", "<answer>", "</ans"]))
        elif len(parts) >= 2:  # swap two pieces
            a, b = rng.sample(range(len(parts)), 2)
            parts[a], parts[b] = parts[b], parts[a]
    return parts


def _wrap(rng: random.Random, text: str) -> str:
    lead = rng.choice(SPACES) if rng.random() < 0.12 else ""
    trail = rng.choice(SPACES + ["\n", "\n", " done"]) if rng.random() < 0.25 else ""
    return lead + text + trail


def _ask_turn(rng: random.Random) -> str:
    gap = rng.choice(["", "", "\n", " ", "\n\n", " x ", "\t"])
    parts = ["<think>", _phrase(rng), "</think>", gap, "<interaction_prompt>", _phrase(rng), "</interaction_prompt>"]
    return _wrap(rng, "".join(_mutate(rng, parts)))


def _final_turn(rng: random.Random, golds: list[str]) -> str:
    parts = ["<think>", _phrase(rng), "</think>", _between(rng), "<answer>", _answer_text(rng, golds), "</answer>"]
    if rng.random() < 0.2:  # a second answer, which must never be the one read
        parts += [rng.choice(["", "\n", " "]), "<answer>", _answer_text(rng, golds), "</answer>"]
    return _wrap(rng, "".join(_mutate(rng, parts)))


def generate(seed: int, n: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        golds = rng.choice(GOLDS)
        asks = [_ask_turn(rng) for _ in range(rng.choice([0, 1, 1, 1, 2, 3]))]
        roll = rng.random()
        if roll < 0.05:
            turns = asks  # ran out of turns (possibly no turns at all)
        elif roll < 0.1:
            turns = asks + [_final_turn(rng, golds), _final_turn(rng, golds)]  # answered too early
        else:
            turns = asks + [_final_turn(rng, golds)]
        cases.append((turns, golds))
    return cases


CASES = generate(SEED, N_TRAJECTORIES)


# ---------------------------------------------------------------- tests

def test_oracle_grammar_equals_the_rule_regexes():
    turns = {turn for case_turns, _ in CASES for turn in case_turns}
    turns |= {"<think></think><interaction_prompt></interaction_prompt>\n", "<think>a</think> \n<answer>b</answer>\n\n"}
    for turn in turns:
        assert oracle_mid(turn) == bool(re.search(SPEC_MID, turn, re.DOTALL)), turn
        assert oracle_fin(turn) == bool(re.search(SPEC_FIN, turn, re.DOTALL)), turn
        found = re.search(SPEC_ANS, turn, re.DOTALL)
        assert oracle_first_answer(turn) == (found.group(1) if found else None), turn


def test_compute_reward_equals_oracle_on_generated_trajectories():
    mismatches = []
    for turns, golds in CASES:
        got = compute_reward(turns, golds)
        want = oracle_reward(turns, golds)
        if any(abs(a - b) > 1e-9 for a, b in zip((got.format, got.answer, got.total), want)):
            mismatches.append((turns, golds, got, want))
    assert not mismatches, f"{len(mismatches)} of {len(CASES)} differ; first: {mismatches[0]}"


def _branches(turns: list[str], golds: list[str]) -> set[str]:
    """Which parts of the rules this trajectory exercises (for the coverage check)."""
    hits: set[str] = set()
    tags = ("<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>")
    for turn in turns[:-1]:
        counts = [turn.count(t) for t in tags]
        if turn[:1].isspace():
            hits.add("leading white space on a non-final turn")
        if turn.endswith("\n") and oracle_mid(turn) and counts == [1, 1, 1, 1]:
            hits.add("non-final turn accepted with one trailing newline")
        if turn[-1:].isspace() and not oracle_mid(turn) and oracle_mid(turn.rstrip()):
            hits.add("trailing white space rejected")
        if oracle_mid(turn) and counts != [1, 1, 1, 1]:
            hits.add("MID matches but a tag is duplicated")
        if counts == [1, 1, 1, 1] and not oracle_mid(turn):
            hits.add("one of each tag but MID fails")
        if 0 in counts:
            hits.add("missing tag in a non-final turn")
    if not turns:
        hits.add("no turns")
        return hits
    final = turns[-1]
    first = oracle_first_answer(final)
    if first is None:
        hits.add("final turn without an answer")
    elif not first.strip():
        hits.add("blank answer")
        if oracle_fin(final):
            hits.add("blank answer in full format")
    every = re.findall(SPEC_ANS, final, re.DOTALL)
    if len(every) >= 2 and every[0].strip() != every[-1].strip():
        hits.add("first and last answers differ")
    if oracle_fin(final) and not re.search(r"</think>\s*<answer>", final):
        hits.add("text between </think> and <answer>")
    if final[:1].isspace() and first:
        hits.add("leading white space on the final turn")
    if final.endswith("\n") and oracle_fin(final):
        hits.add("final turn accepted with one trailing newline")
    fmt, answer, _ = oracle_reward(turns, golds)
    if abs(fmt - 1.0) <= 1e-9:
        hits.add("gate open, exact answer" if answer == 1.0 else "gate open, partial answer" if answer else "gate open, wrong answer")
    elif answer > 0:
        hits.add("gate shut despite a correct answer")
    if fmt > 0 and fmt < 1.0 and first and first.strip() and not oracle_fin(final):
        hits.add("non-blank answer without full final format")
    return hits


def test_generator_exercises_every_branch():
    seen = Counter(b for turns, golds in CASES for b in _branches(turns, golds))
    expected = {
        "leading white space on a non-final turn", "non-final turn accepted with one trailing newline",
        "trailing white space rejected", "MID matches but a tag is duplicated", "one of each tag but MID fails",
        "missing tag in a non-final turn", "no turns", "final turn without an answer", "blank answer",
        "blank answer in full format", "first and last answers differ", "text between </think> and <answer>",
        "leading white space on the final turn", "final turn accepted with one trailing newline",
        "gate open, exact answer", "gate open, partial answer", "gate open, wrong answer",
        "gate shut despite a correct answer", "non-blank answer without full final format",
    }
    rare = {name: seen[name] for name in expected if seen[name] < 10}
    assert not rare, f"generator too rarely hits: {rare}"


@pytest.mark.parametrize("weights", [
    dict(think_prompt_score=0.5, nonblank_answer_score=0.3, final_format_score=0.2, format_cap=1.0),
    dict(think_prompt_score=0.3, nonblank_answer_score=0.5, final_format_score=0.1, format_cap=0.9),
])
def test_configured_weights_follow_the_same_rules(weights):
    """Other weights change only the numbers: format is a weighted count of the same events."""
    for turns, golds in CASES[:1000]:
        base = compute_reward(turns, golds)
        got = compute_reward(turns, golds, **weights)
        n_ask = sum(
            all(t.count(tag) == 1 for tag in ("<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>"))
            and oracle_mid(t) for t in turns[:-1]
        )
        first = oracle_first_answer(turns[-1]) if turns else None
        nonblank = bool(first and first.strip())
        raw = n_ask * weights["think_prompt_score"]
        if nonblank:
            raw += weights["nonblank_answer_score"] + weights["final_format_score"] * oracle_fin(turns[-1])
        fmt = min(raw, weights["format_cap"])
        assert got.format == pytest.approx(fmt, abs=1e-9)
        assert got.answer == base.answer
        gate = abs(fmt - weights["format_cap"]) <= 1e-9
        assert got.total == pytest.approx(-1 + fmt + (got.answer if gate else 0.0), abs=1e-9)
