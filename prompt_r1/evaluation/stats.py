"""Uncertainty of evaluation scores: bootstrap intervals and paired comparisons over questions.

A benchmark file of 128 questions leaves a score near 50 with about +-9 points of 95% interval,
so every table cell carries one, and method differences are judged on the same questions
(paired), which removes the between-question variance both methods share.

- `bootstrap_ci`: percentile interval of the mean, resampling questions with replacement.
- `paired_comparison`: the mean per-question difference of two methods, its percentile bootstrap
  interval and a two-sided sign-flip permutation p-value (exact enumeration for small samples).
  Several datasets are strata: the statistic is the mean of the per-dataset mean differences
  (the paper's average over datasets), and resampling/flipping happens within each dataset.
- `paired_worst`: the smallest of several paired differences (the worst environment) with the
  bootstrap interval of that minimum.

Everything is seeded: the same inputs and seed give the same numbers. Callers drop questions
whose environment call failed before calling (a failure is not a score of 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from prompt_r1.core.seeding import derive_seed

RESAMPLES = 2000
LEVEL = 0.95
EXACT_MAX_N = 16  # sign flips are enumerated exactly (2**n) up to this many nonzero differences


def cell_seed(*parts: object) -> int:
    """A stable seed for one table cell, so a cell's interval does not depend on which others ran.

    >>> cell_seed("env", "direct", "nq") == cell_seed("env", "direct", "nq")
    True
    >>> cell_seed("env", "direct", "nq") != cell_seed("env", "cot", "nq")
    True
    """
    return derive_seed("table_cell", *map(str, parts))


def bootstrap_ci(values: Sequence[float], seed: int = 0, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean (None, None when there are no values).

    >>> bootstrap_ci([1.0, 1.0, 1.0])
    (1.0, 1.0)
    >>> bootstrap_ci([])
    (None, None)
    >>> lo, hi = bootstrap_ci([0.0, 1.0] * 64)
    >>> 0.40 < lo < 0.45 and 0.55 < hi < 0.60
    True
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None, None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _stratified_stat(diffs: list[np.ndarray]) -> float:
    return float(np.mean([d.mean() for d in diffs]))


def sign_flip_p(diffs: Sequence[Sequence[float]], seed: int = 0, resamples: int = RESAMPLES) -> float:
    """Two-sided p-value of "the mean difference is 0" by flipping the signs of differences.

    Under the null each question's difference is as likely positive as negative. With at most
    `EXACT_MAX_N` nonzero differences every flip pattern is enumerated (exact); otherwise
    `resamples` random patterns, counting the observed one (p >= 1/(resamples+1)).

    >>> sign_flip_p([[1.0, 1.0, 1.0]])  # all 8 patterns: only +++ and --- reach |mean| 1
    0.25
    >>> sign_flip_p([[0.0, 0.0]])
    1.0
    """
    arrays = [np.asarray(d, dtype=float) for d in diffs if len(d)]
    if not arrays:
        return 1.0
    observed = abs(_stratified_stat(arrays))
    weights = np.concatenate([np.full(a.size, 1.0 / (a.size * len(arrays))) for a in arrays])
    flat = np.concatenate(arrays) * weights  # the statistic is sum(sign * flat)
    nonzero = flat[flat != 0]
    tol = 1e-12 * max(1.0, observed)
    if nonzero.size == 0:
        return 1.0
    if nonzero.size <= EXACT_MAX_N:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=nonzero.size)))
        stats = np.abs(signs @ nonzero)
        return float(np.mean(stats >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, 500):  # chunks bound memory on large files
        k = min(500, resamples - start)
        signs = rng.choice((1.0, -1.0), size=(k, nonzero.size))
        hits += int(np.sum(np.abs(signs @ nonzero) >= observed - tol))
    return (hits + 1) / (resamples + 1)


def paired_comparison(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], seed: int = 0,
                      resamples: int = RESAMPLES, level: float = LEVEL) -> dict[str, float | int | None]:
    """Compare method A with B on the same questions: per stratum, A's and B's scores in the same
    question order. Returns diff (A - B, mean of per-stratum means), ci_low, ci_high, p_value, n.

    >>> r = paired_comparison([[1, 1, 0, 1]], [[0, 1, 0, 0]])
    >>> r["diff"], r["n"], r["p_value"]
    (0.5, 4, 0.5)
    """
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        raise ValueError("paired_comparison needs A and B scored on the same questions in each stratum")
    diffs = [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b) if len(x)]
    n = int(sum(d.size for d in diffs))
    if n == 0:
        return {"diff": None, "ci_low": None, "ci_high": None, "p_value": None, "n": 0}
    boot = _resampled_means(diffs, np.random.default_rng(seed), resamples).mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return {"diff": _stratified_stat(diffs), "ci_low": float(lo), "ci_high": float(hi),
            "p_value": sign_flip_p(diffs, derive_seed("sign_flip", seed), resamples), "n": n}


def _resampled_means(diffs: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """(resamples, strata): each stratum's mean difference over questions resampled within it."""
    return np.stack([d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1) for d in diffs], axis=1)


def paired_worst(groups: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]], seed: int = 0,
                 resamples: int = RESAMPLES, level: float = LEVEL) -> dict[str, float | int | None]:
    """The worst of several paired comparisons (e.g. one per environment): each group is
    (A's strata, B's strata) as `paired_comparison` takes them; `diff` is the smallest group
    difference, `index` the group it comes from, and the interval is the bootstrap interval of
    that minimum (questions resampled within each stratum of each group, the minimum taken in
    every resample), not the worst group's own interval, which would ignore that it was picked
    for being worst.

    >>> r = paired_worst([([[1, 1]], [[0, 0]]), ([[1, 0]], [[1, 0]])])
    >>> r["diff"], r["index"], r["ci_low"], r["ci_high"], r["n"]
    (0.0, 1, 0.0, 0.0, 4)
    """
    kept = [(i, [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b) if len(x)])
            for i, (a, b) in enumerate(groups)]
    kept = [(i, diffs) for i, diffs in kept if diffs]
    if not kept:
        return {"diff": None, "ci_low": None, "ci_high": None, "index": None, "n": 0}
    stats = [_stratified_stat(diffs) for _, diffs in kept]
    rng = np.random.default_rng(seed)
    boot = np.min(np.stack([_resampled_means(diffs, rng, resamples).mean(axis=1) for _, diffs in kept], axis=1),
                  axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    worst = int(np.argmin(stats))
    return {"diff": stats[worst], "ci_low": float(lo), "ci_high": float(hi), "index": kept[worst][0],
            "n": int(sum(d.size for _, diffs in kept for d in diffs))}
