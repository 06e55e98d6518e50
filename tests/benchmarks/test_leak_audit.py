"""benchmarks/experiments/leak_audit.py: which flagged answers a reply named in a derived form.

`derived_in_reply` is checked against a restatement over generated replies (a gold's stem followed
by a suffix, joined by a hyphen, or absent), and `audit` against counts built by hand.
"""

from __future__ import annotations

import random

import pytest

from benchmarks.experiments.leak_audit import audit, derived_in_reply, kind

GOLDS = ["Europe", "Asia", "Africa", "South America", "yen"]
SUFFIXES = ["an", "-Pacific", "n", "ese", "s", "ly"]   # "s" and "ly" make no derived form
FILLER = ["the", "country", "is", "a", "member", "of", "region", "continent", "located", "in"]


def _expected(gold: str, reply_words: list[str]) -> bool:
    """Restatement: after splitting at hyphens and dropping edge punctuation, the gold's words
    appear in a row, the last one bare or with an adjective's or people's ending."""
    words = [p.strip(".,").lower() for w in reply_words for p in w.split("-")]
    g = gold.lower().split()
    return any(words[i:i + len(g) - 1] == g[:-1] and words[i + len(g) - 1] in
               {g[-1] + e for e in ("", "n", "an", "ean", "ian", "ese", "ish", "ic", "i")}
               for i in range(len(words) - len(g) + 1))


@pytest.mark.parametrize("seed", range(200))
def test_derived_form_matches_a_restatement(seed):
    rng = random.Random(seed)
    gold = rng.choice(GOLDS)
    words = rng.sample(FILLER, 5)
    form = rng.choice(["none", "suffix", "other"])
    suffix = rng.choice(SUFFIXES)
    if form == "suffix":
        words.insert(rng.randrange(len(words) + 1), gold + suffix)
    elif form == "other":
        words.insert(rng.randrange(len(words) + 1), rng.choice([g for g in GOLDS if g != gold]).replace(" ", ""))
    reply = " ".join(words) + "."
    assert derived_in_reply(gold, [reply]) == _expected(gold, reply.split())
    if form == "suffix":
        assert derived_in_reply(gold, [reply]) == (suffix not in ("s", "ly"))


def _row(qid: str, answer: str, golds: list[str], replies: list[str], unseen: bool) -> dict:
    return {"question_id": qid, "answer": answer, "golds": golds, "replies": replies, "prompts": ["q"] * len(replies),
            "relation": "continent", "answer_unseen": unseen, "bridge_before_reply": False}


def test_audit_counts_derived_and_unsupported_before_and_after():
    derived = _row("a", "Europe", ["Europe"], ["Finland is on the European continent."], True)
    guess = _row("b", "Asia", ["Asia"], ["It is in the Indo-Pacific region."], True)
    seen = _row("c", "Africa", ["Africa"], ["Ethiopia is in Africa."], False)
    saved = {"results": {"trained": {"probe_before": [derived, {**guess, "answer_unseen": False}, seen],
                                     "probe_after": [derived, guess, seen]}}}
    figures = audit(saved)["trained"]
    assert figures["answer_unseen"]["before"] == ["a"] and figures["answer_unseen"]["after"] == ["a", "b"]
    assert figures["answer_unseen"]["kinds"] == {"before": {"derived": 1, "unsupported": 0},
                                                "after": {"derived": 1, "unsupported": 1}}
    assert figures["bridge_before_reply"] == {"before": [], "after": []}
    assert (kind(derived), kind(guess)) == ("derived", "unsupported")
