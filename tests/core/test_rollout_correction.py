"""`core.rollout_correction` against an independent restatement of its rules.

The oracle below works on plain Python lists, one trajectory at a time, with `math` only: it
shares no code with the module (no torch, no index_add, no masks as tensors). Random batches
(seeded, as the other property tests here: hypothesis is not a dependency) come in both layouts
the learner uses, padded (one trajectory a row) and packed (several a row, gaps between), with
environment spans (loss mask 0) whose values are wild, gaps between sampler and learner from
float-rounding size to far off, and trajectories without any agent token.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from prompt_r1.core.grpo import truncated_is_weights
from prompt_r1.core.rollout_correction import (MODES, SUMS, Correction, check_bounds, geometric_keep,
                                               mismatch_metrics, mismatch_sums, sequence_sums)

SEEDS = range(60)


# ---------------------------------------------------------------- random batches

def _trajectory(rng: random.Random) -> dict:
    """One trajectory's response: agent spans and environment spans, its learner and sampler log-probs."""
    n = rng.randint(1, 12)
    scale = rng.choice([1e-6, 1e-3, 0.01, 0.3, 3.0])
    mask = [1 if rng.random() < 0.7 else 0 for _ in range(n)]
    if rng.random() < 0.1:
        mask = [0] * n  # a trajectory with no agent token
    old = [-rng.uniform(0.0, 8.0) for _ in range(n)]
    behaviour = [o + rng.gauss(0.0, scale) for o in old]
    for k, m in enumerate(mask):
        if not m:  # environment tokens: wild values that must never count
            behaviour[k] = rng.choice([0.0, -50.0, 30.0])
    return {"old": old, "behaviour": behaviour, "mask": mask}


def _layout(trajs: list[dict], packed: bool, rng: random.Random) -> tuple[torch.Tensor, ...]:
    """old, behaviour, mask, seq_ids tensors holding `trajs` padded or packed, float64."""
    if packed:
        rows = [[]]
        for k, t in enumerate(trajs):
            if rows[-1] and rng.random() < 0.3:
                rows.append([])
            rows[-1].append((k, rng.randint(0, 2)))  # (trajectory, columns of gap before it)
        width = max(sum(gap + len(trajs[k]["old"]) for k, gap in row) for row in rows) + rng.randint(0, 2)
    else:
        rows = [[(k, rng.randint(0, 2))] for k in range(len(trajs))]
        width = max(gap + len(trajs[k]["old"]) for row in rows for k, gap in row) + rng.randint(0, 2)
    shape = (len(rows), width)
    old = torch.full(shape, -1.0, dtype=torch.float64)
    behaviour = torch.full(shape, 5.0, dtype=torch.float64)  # padding: wild too
    mask = torch.zeros(shape, dtype=torch.float64)
    seq = torch.full(shape, -1, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for k, gap in row:
            at += gap
            t = trajs[k]
            n = len(t["old"])
            old[r, at:at + n] = torch.tensor(t["old"], dtype=torch.float64)
            behaviour[r, at:at + n] = torch.tensor(t["behaviour"], dtype=torch.float64)
            mask[r, at:at + n] = torch.tensor(t["mask"], dtype=torch.float64)
            seq[r, at:at + n] = k
            at += n
    return old, behaviour, mask, seq


def _batch(seed: int, packed: bool) -> tuple[list[dict], tuple[torch.Tensor, ...]]:
    rng = random.Random(seed)
    trajs = [_trajectory(rng) for _ in range(rng.randint(1, 7))]
    return trajs, _layout(trajs, packed, rng)


# ---------------------------------------------------------------- the oracle

def _agent(t: dict) -> list[float]:
    """The trajectory's learner-minus-sampler log-prob gaps on its agent tokens only."""
    return [o - b for o, b, m in zip(t["old"], t["behaviour"], t["mask"]) if m]


def _clamp(x: float) -> float:
    return min(20.0, max(-20.0, x))


def oracle_kept(t: dict, low: float, high: float, tol: float = 1e-9) -> bool | None:
    """Whether the geometric mean ratio is within the bounds; None when it is within `tol` of a bound
    (the rounding of the dtype decides there)."""
    gaps = _agent(t)
    if not gaps:
        return True
    geo = math.exp(sum(gaps) / len(gaps))
    if min(abs(geo - low), abs(geo - high)) < tol:
        return None
    return low <= geo <= high


def oracle_metrics(trajs: list[dict], cap: float, low: float, high: float) -> dict[str, float]:
    gaps = [d for t in trajs for d in _agent(t)]
    with_agent = [t for t in trajs if _agent(t)]
    n, s = len(gaps), len(with_agent)
    if n == 0:
        return {"kl": 0.0, "k3_kl": 0.0, "chi2_token": 0.0, "chi2_seq": 0.0, "ess": 1.0,
                "token_capped_share": 0.0, "seq_masked_share": 0.0, "token_masked_share": 0.0}
    rhos = [math.exp(_clamp(d)) for d in gaps]
    masked = [t for t in with_agent if not oracle_kept(t, low, high)]
    return {
        "kl": sum(-d for d in gaps) / n,
        "k3_kl": sum(math.exp(_clamp(d)) - 1 - _clamp(d) for d in gaps) / n,
        "chi2_token": sum(r * r for r in rhos) / n - 1,
        "chi2_seq": sum(math.exp(2 * _clamp(sum(_agent(t)))) for t in with_agent) / s - 1,
        "ess": sum(rhos) ** 2 / (n * sum(r * r for r in rhos)),
        "token_capped_share": sum(math.exp(d) >= cap for d in gaps) / n,
        "seq_masked_share": len(masked) / s,
        "token_masked_share": sum(len(_agent(t)) for t in masked) / n,
    }


# ---------------------------------------------------------------- the tests

def _bounds(seed: int) -> tuple[float, float]:
    return [(0.99, 1.01), (0.5, 2.0), (1.0, 1.0), (0.999, 1.5)][seed % 4]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_metrics_match_the_restatement(seed, packed) -> None:
    trajs, (old, behaviour, mask, seq) = _batch(seed, packed)
    low, high = _bounds(seed)
    cap = [1.0, 2.0, 5.0][seed % 3]
    if any(oracle_kept(t, low, high) is None for t in trajs):
        pytest.skip("a trajectory sits on a bound")
    got = mismatch_metrics(mismatch_sums(old, behaviour, mask, seq, cap, (low, high)))
    want = oracle_metrics(trajs, cap, low, high)
    assert set(got) == {f"rollout_corr/{k}" for k in want}
    for key, value in want.items():
        assert got[f"rollout_corr/{key}"] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_geometric_keep_matches_the_restatement(seed, packed) -> None:
    trajs, (old, behaviour, mask, seq) = _batch(seed, packed)
    low, high = _bounds(seed)
    keep = geometric_keep(old, behaviour, mask, seq, (low, high))
    assert keep.dtype == torch.float64 and keep.shape == old.shape
    assert bool((keep[seq < 0] == 1.0).all())  # no trajectory's token: untouched
    for k, t in enumerate(trajs):
        want = oracle_kept(t, low, high)
        if want is not None:
            assert bool((keep[seq == k] == float(want)).all()), k


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_weights_the_policy_term_as_its_rule_says(seed, mode) -> None:
    trajs, (old, behaviour, mask, seq) = _batch(seed, packed=seed % 2 == 1)
    old, behaviour = old.float(), behaviour.float()  # as the learner holds them
    low, high = _bounds(seed)
    cap = [1.0, 2.0, 5.0][seed % 3]
    for stale in (False, True):
        tis, weights = Correction(mode, cap, (low, high), stale).weights(old, behaviour, mask, seq)
        token_tis = stale or mode in ("token-tis", "both")
        geo = mode in ("geo-mask", "both")
        assert (tis is None) == (not token_tis)
        if not token_tis and not geo:
            assert weights is None
            continue
        for k, t in enumerate(trajs):
            kept = oracle_kept(t, low, high, tol=1e-5) if geo else True
            if kept is None:
                continue  # on a bound, to float32 rounding
            got = weights[seq == k].tolist()
            for j, (o, b, m) in enumerate(zip(t["old"], t["behaviour"], t["mask"])):
                if not m:
                    continue  # an environment token's weight multiplies a loss-mask 0 term
                w = min(math.exp(float(torch.tensor(o - b, dtype=torch.float32))), cap) if token_tis else 1.0
                assert got[j] == pytest.approx(w * kept, rel=1e-5), (k, j)


@pytest.mark.parametrize("seed", range(20))
def test_environment_tokens_never_count(seed) -> None:
    """Whatever the values at loss-mask 0 positions, the weights at agent tokens and the metrics stay."""
    _, (old, behaviour, mask, seq) = _batch(seed, packed=seed % 2 == 0)
    moved = torch.where(mask > 0, behaviour, behaviour + torch.randn_like(behaviour) * 10)
    correction = Correction("both", 2.0, (0.9, 1.1))
    a = mismatch_sums(old, behaviour, mask, seq, 2.0, (0.9, 1.1))
    b = mismatch_sums(old, moved, mask, seq, 2.0, (0.9, 1.1))
    assert a == b
    wa = correction.weights(old, behaviour, mask, seq)[1]
    wb = correction.weights(old, moved, mask, seq)[1]
    assert torch.equal(wa[mask > 0], wb[mask > 0])


@pytest.mark.parametrize("seed", range(20))
def test_padded_and_packed_layouts_give_the_same_sums(seed) -> None:
    rng = random.Random(seed)
    trajs = [_trajectory(rng) for _ in range(rng.randint(1, 6))]
    padded = mismatch_sums(*_layout(trajs, False, random.Random(seed)), 2.0, (0.99, 1.01))
    packed = mismatch_sums(*_layout(trajs, True, random.Random(seed + 1)), 2.0, (0.99, 1.01))
    assert set(padded) == set(SUMS)
    for key in SUMS:
        assert packed[key] == pytest.approx(padded[key], rel=1e-12, abs=1e-12), key


def test_sums_add_over_micro_batches() -> None:
    """Metrics of two micro-batches' summed sums are those of the batch as one (ranks sum them alike)."""
    rng = random.Random(7)
    trajs = [_trajectory(rng) for _ in range(6)]
    whole = mismatch_sums(*_layout(trajs, False, random.Random(1)), 2.0, (0.99, 1.01))
    parts = [mismatch_sums(*_layout(half, False, random.Random(1)), 2.0, (0.99, 1.01))
             for half in (trajs[:2], trajs[2:])]
    summed = {k: parts[0][k] + parts[1][k] for k in SUMS}
    for key in SUMS:
        assert summed[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12), key


def test_off_is_todays_loss_and_stale_off_is_todays_weights_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 9, generator=g) * 4
    behaviour = old + torch.randn(3, 9, generator=g) * 0.5
    mask = (torch.rand(3, 9, generator=g) > 0.3).float()
    assert Correction("off").weights(old, behaviour, mask, None) == (None, None)
    tis, weights = Correction("off", 1.5, stale=True).weights(old, behaviour, mask, None)
    assert weights is tis and torch.equal(tis, truncated_is_weights(old, behaviour, 1.5))
    tis, weights = Correction("token-tis", 1.5).weights(old, behaviour, mask, None)
    assert torch.equal(weights, truncated_is_weights(old, behaviour, 1.5))


def test_a_perfect_match_is_kept_and_measures_zero() -> None:
    old = -torch.rand(2, 5, dtype=torch.float64)
    seq = torch.tensor([[0] * 5, [1] * 5])
    m = mismatch_metrics(mismatch_sums(old, old.clone(), torch.ones(2, 5), seq, 1.0, (1.0, 1.0)))
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/k3_kl"] == 0.0 and m["rollout_corr/ess"] == 1.0
    assert m["rollout_corr/chi2_token"] == 0.0 and m["rollout_corr/chi2_seq"] == 0.0
    assert m["rollout_corr/seq_masked_share"] == 0.0
    assert m["rollout_corr/token_capped_share"] == 1.0  # rho = 1 reaches a cap of 1, as truncated_is_weights does
    assert bool((geometric_keep(old, old, torch.ones(2, 5), seq, (1.0, 1.0)) == 1.0).all())


def test_a_long_sequence_of_small_gaps_is_masked_by_its_mean_not_its_length() -> None:
    """TRL#4772: 0.012 a token over 100 tokens is a sequence ratio of exp(1.2) = 3.3; its geometric mean
    exp(0.012) = 1.012 is what the mask judges, the same at 10 tokens or 1000."""
    for n in (10, 100, 1000):
        old = torch.full((1, n), -1.0, dtype=torch.float64)
        seq = torch.zeros(1, n, dtype=torch.long)
        for gap, kept in ((0.012, 0.0), (0.008, 1.0)):
            keep = geometric_keep(old, old - gap, torch.ones(1, n), seq, (0.99, 1.01))
            assert bool((keep == kept).all()), (n, gap)


def test_bad_bounds_and_modes_are_refused() -> None:
    for bounds in ((1.01, 1.02), (0.9, 0.99), (0.0, 1.0)):
        with pytest.raises(ValueError, match="0 < low <= 1 <= high"):
            check_bounds(bounds)
    with pytest.raises(ValueError, match="unknown rollout correction mode"):
        Correction("geo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_ids"):
        Correction("geo-mask").weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), None)


def test_sequence_sums_drop_tokens_of_no_trajectory() -> None:
    values = torch.tensor([[1.0, 2.0, 4.0, 8.0]])
    got = sequence_sums(values, torch.ones(1, 4), torch.tensor([[-1, 0, -1, 1]]), 2)
    assert got.tolist() == [2.0, 8.0]
    assert sequence_sums(values, torch.ones(1, 4), torch.full((1, 4), -1), 0).numel() == 0
