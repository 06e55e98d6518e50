"""Bootstrap intervals and paired comparisons against independent statements of the same rules:
the normal approximation on large generated samples, exact binomial sign tests on small ones,
and a warehouse upgrade that adds the interval columns to older files."""

from __future__ import annotations

import math
import random

import duckdb
import numpy as np
import pytest

from prompt_r1.evaluation.compare import paired_comparisons
from prompt_r1.evaluation.stats import bootstrap_ci, paired_comparison, sign_flip_p
from warehouse.store import Warehouse


@pytest.mark.parametrize("seed", range(6))
def test_bootstrap_ci_matches_the_normal_approximation(seed):
    rng = np.random.default_rng(seed)
    n, p = int(rng.integers(100, 400)), float(rng.uniform(0.2, 0.8))
    x = (rng.random(n) < p).astype(float)
    lo, hi = bootstrap_ci(x, seed=seed, resamples=4000)
    m, se = x.mean(), x.std() / math.sqrt(n)
    # percentile bootstrap of a mean of 0/1 values ~ m +- 1.96 se (Monte Carlo and skew: 0.25 se)
    assert abs(lo - (m - 1.96 * se)) < 0.25 * se
    assert abs(hi - (m + 1.96 * se)) < 0.25 * se
    assert lo <= m <= hi


def test_half_correct_128_questions_has_about_nine_points_of_interval():
    lo, hi = bootstrap_ci([1.0, 0.0] * 64, seed=3)
    assert 0.07 < (hi - lo) / 2 < 0.10


def test_bootstrap_is_seeded_and_covers_at_nominal_rate():
    assert bootstrap_ci([0.1, 0.9, 0.4], seed=5) == bootstrap_ci([0.1, 0.9, 0.4], seed=5)
    rng = np.random.default_rng(0)
    covered = sum(lo <= 0.3 <= hi for lo, hi in
                  (bootstrap_ci((rng.random(200) < 0.3).astype(float), seed=i, resamples=1000) for i in range(200)))
    assert 0.89 <= covered / 200 <= 0.99  # nominal 0.95; a binomial(200, .95) sd is 1.5 points


def _exact_sign_test(k: int, n: int) -> float:
    """Two-sided exact binomial sign test for k successes of n (p = 1/2)."""
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail) if k != n - k else 1.0


@pytest.mark.parametrize("case", range(40))
def test_sign_flip_on_plus_minus_one_equals_the_exact_sign_test(case):
    # With differences of +-1 the sign-flip statistic is a function of the count of +1: the
    # permutation p-value is the exact binomial sign test.
    rng = random.Random(case)
    n = rng.randint(1, 14)
    k = rng.randint(0, n)
    diffs = [1.0] * k + [-1.0] * (n - k) + [0.0] * rng.randint(0, 3)  # ties carry no sign
    assert sign_flip_p([diffs]) == pytest.approx(_exact_sign_test(k, n))


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_monte_carlo_matches_the_normal_approximation(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.1, 1.0, size=300)  # continuous differences: no lattice, no continuity correction
    z = abs(d.sum()) / math.sqrt(np.sum(d**2))  # the permutation distribution's normal limit
    expected = math.erfc(z / math.sqrt(2))
    assert sign_flip_p([d], seed=seed, resamples=20000) == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_monte_carlo_matches_the_exact_sign_test_on_many_questions(seed):
    rng = np.random.default_rng(seed)
    d = rng.choice([-1.0, 0.0, 1.0], size=300, p=[0.25, 0.45, 0.30])
    k, m = int(np.sum(d > 0)), int(np.sum(d != 0))
    assert sign_flip_p([d], seed=seed, resamples=20000) == pytest.approx(_exact_sign_test(k, m), abs=0.015)


@pytest.mark.parametrize("seed", range(4))
def test_paired_interval_matches_the_normal_approximation_of_the_difference(seed):
    rng = np.random.default_rng(seed)
    a = (rng.random(256) < 0.6).astype(float)
    b = np.where(rng.random(256) < 0.8, a, 1 - a)  # correlated with a: pairing matters
    r = paired_comparison([a], [b], seed=seed, resamples=4000)
    d = a - b
    se = d.std() / math.sqrt(d.size)
    assert r["diff"] == pytest.approx(d.mean())
    assert r["ci_low"] == pytest.approx(d.mean() - 1.96 * se, abs=0.25 * se)
    assert r["ci_high"] == pytest.approx(d.mean() + 1.96 * se, abs=0.25 * se)
    unpaired_se = math.sqrt(a.var() / a.size + b.var() / b.size)
    assert r["ci_high"] - r["ci_low"] < 2 * 1.96 * unpaired_se * 0.8  # pairing narrows the interval


def test_strata_average_dataset_means_not_questions():
    # dataset 1: 2 questions, +1 each; dataset 2: 8 questions, 0 each -> mean of means 0.5 (pooled: 0.2)
    r = paired_comparison([[1, 1], [0] * 8], [[0, 0], [0] * 8])
    assert r["diff"] == pytest.approx(0.5) and r["n"] == 10
    assert r["ci_low"] == r["ci_high"] == pytest.approx(0.5)  # nothing varies within a dataset
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison([[1, 0]], [[1]])


def test_identical_methods_give_zero_difference_and_p_one():
    r = paired_comparison([[0.3, 0.7, 1.0]], [[0.3, 0.7, 1.0]])
    assert (r["diff"], r["ci_low"], r["ci_high"], r["p_value"]) == (0.0, 0.0, 0.0, 1.0)


def test_comparisons_pair_by_question_and_drop_failures():
    rows = []
    for q in range(10):
        rows.append({"env_name": "e", "method": "agent:trained", "dataset": "nq", "question_id": f"q{q}",
                     "score": 1.0, "error": "timeout" if q == 0 else None})
        rows.append({"env_name": "e", "method": "direct", "dataset": "nq", "question_id": f"q{q}",
                     "score": None if q == 1 else 0.0, "error": "HTTP 500" if q == 1 else None})
    rows.append({"env_name": "e", "method": "direct", "dataset": "nq", "question_id": "only-direct",
                 "score": 1.0, "error": None})
    (cell, avg) = paired_comparisons(rows)
    assert (cell["dataset"], cell["n"], cell["dropped"], cell["diff"]) == ("nq", 8, 3, 1.0)
    assert cell["p_value"] == pytest.approx(2 / 2**8)  # exact: all 8 differences +1
    assert avg["dataset"] == "avg in_domain" and avg["diff"] == 1.0
    assert paired_comparisons([r for r in rows if r["method"] == "direct"]) == []


@pytest.mark.parametrize("seed", range(200))
def test_answers_differ_counts_changed_answers_among_paired_questions(seed):
    """`changed` = paired (error-free) questions whose final answers differ, whatever the scores."""
    rng = random.Random(seed)
    cases = [(rng.choice("abc"), rng.choice("abc"), rng.random() < 0.2) for _ in range(rng.randint(1, 30))]
    rows = []
    for q, (ref_text, other_text, failed) in enumerate(cases):
        rows.append({"env_name": "e", "method": "agent:trained", "dataset": "nq", "question_id": q,
                     "score": 0.0, "prediction": ref_text, "error": "timeout" if failed else None})
        rows.append({"env_name": "e", "method": "agent:base", "dataset": "nq", "question_id": q,
                     "score": 0.0, "prediction": other_text, "error": None})
    cell = paired_comparisons(rows)[0]
    assert cell["dataset"] == "nq"
    assert cell["changed"] == sum(a != b for a, b, failed in cases if not failed)
    assert cell["n"] + cell["dropped"] == len(cases)


def test_old_warehouse_gains_interval_columns(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE eval_results (run_id VARCHAR NOT NULL, env_name VARCHAR NOT NULL, "
                "method VARCHAR NOT NULL, dataset VARCHAR NOT NULL, n INTEGER NOT NULL, "
                "primary_metric VARCHAR NOT NULL, score DOUBLE NOT NULL, em DOUBLE NOT NULL, "
                "f1 DOUBLE NOT NULL, substring DOUBLE NOT NULL, ssim DOUBLE NOT NULL, "
                "env_prompt_tokens BIGINT NOT NULL, env_completion_tokens BIGINT NOT NULL, "
                "cost_usd DOUBLE NOT NULL, created_at TIMESTAMP NOT NULL, "
                "PRIMARY KEY (run_id, env_name, method, dataset))")
    con.close()
    with Warehouse(path) as wh:
        wh.write_eval("r", [], [{"env_name": "e", "method": "direct", "dataset": "nq", "n": 2,
                                 "primary_metric": "em", "score": 0.5, "em": 0.5, "f1": 0.5, "substring": 0.5,
                                 "ssim": 0.5, "env_prompt_tokens": 1, "env_completion_tokens": 1,
                                 "cost_usd": 0.0, "errors": 0, "ci_low": 0.0, "ci_high": 1.0}])
        (row,) = wh.eval_results("r")
    assert (row["ci_low"], row["ci_high"]) == (0.0, 1.0)
