"""Metrics: SQuAD-normalised EM / F1 / substring, and the MiniLM semantic similarity."""

import pytest

import random
import re

from prompt_r1.core.metrics import (
    exact_match, f1_score, mentions, mentions_in_some_form, normalize_answer, score_all, semantic_similarities,
    semantic_similarity, substring_match,
)


def test_normalisation():
    assert normalize_answer("  An Apple, a Day!  ") == "apple day"


def test_lexical_metrics_max_over_golds():
    golds = ["New York City", "NYC"]
    assert exact_match("nyc", golds) == 1.0
    assert f1_score("New York", golds) == pytest.approx(0.8)
    assert substring_match("I think it is New York City.", golds) == 1.0
    assert exact_match("", golds) == f1_score("", golds) == substring_match("", golds) == 0.0


def test_ssim_real_model():
    same = semantic_similarity("The cat sat on the mat.", ["The cat sat on the mat."])
    close = semantic_similarity("A kitten is sitting on a rug.", ["The cat sat on the mat."])
    far = semantic_similarity("Quarterly revenue rose by four percent.", ["The cat sat on the mat."])
    assert same == pytest.approx(1.0, abs=1e-4)
    assert close > far
    assert semantic_similarity("   ", ["anything"]) == 0.0


def test_ssim_batched_equals_single_and_maxes_over_golds():
    preds = ["Paris is the capital of France.", "Water boils at 100 degrees."]
    golds = [["The capital of France is Paris.", "Bananas are yellow."], ["Boiling point of water is 100 C."]]
    batched = semantic_similarities(preds, golds)
    single = [semantic_similarity(p, g) for p, g in zip(preds, golds)]
    assert batched == pytest.approx(single, abs=1e-5)
    assert batched[0] == pytest.approx(semantic_similarity(preds[0], [golds[0][0]]), abs=1e-5)


def test_score_all_keys():
    scores = score_all(["Paris"], [["Paris"]])
    assert set(scores) == {"em", "f1", "substring", "ssim"}
    assert scores["em"] == [1.0]


NAMES = ["Europe", "Asia", "South America", "yen", "real", "Japan", "Finland"]
ENDINGS = ["", "an", "n", "ese", "ish", "ian", "s", "ly", "ern", "-Pacific", "-born", "."]


def _in_some_form(text: str, name: str) -> bool:
    """Restated with a regular expression over the lower-cased text, hyphens read as spaces: the
    name's words in a row, the last one bare or with an adjective's or people's ending."""
    flat = " " + re.sub(r"[^a-z0-9 ]", "", text.lower().replace("-", " ")) + " "
    flat = re.sub(r" (a|an|the) ", " ", flat)
    words = [re.escape(w) for w in name.lower().split()]
    return re.search(" " + " +".join(words) + "(n|an|ean|ian|ese|ish|ic|i)? ", " ".join(flat.split()).join("  ")) is not None


@pytest.mark.parametrize("seed", range(300))
def test_mentions_in_some_form_against_a_restatement(seed):
    rng = random.Random(seed)
    name = rng.choice(NAMES)
    words = rng.sample(["it", "is", "in", "the", "region", "of", "a", "country", "currency", "continent"], 4)
    for _ in range(rng.randint(0, 2)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(NAMES) + rng.choice(ENDINGS))
    text = " ".join(words)
    assert mentions_in_some_form(text, [name]) == _in_some_form(text, name), text
    if mentions(text, [name]):
        assert mentions_in_some_form(text, [name])   # whole words are one of the forms
