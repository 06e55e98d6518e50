"""GRPO maths against hand-computed values: advantages, clipping, KL, masking, aggregation."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from grpo_helpers import tiny_llama
from prompt_r1.core import grpo
from prompt_r1.core.grpo import gather_logprobs, group_advantages, k3_kl, policy_loss


def test_doctests() -> None:
    assert doctest.testmod(grpo).failed == 0


def test_group_advantages_hand_values() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.5, 0.5, -1.0])
    groups = torch.tensor([10, 10, 10, 4, 4, 99])  # non-contiguous labels; 99 is a group of one
    adv = group_advantages(rewards, groups)
    expected = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # matches torch.std (unbiased) on an uneven group
    r = torch.tensor([0.2, -1.0, 0.9, 0.0])
    ref = (r - r.mean()) / (r.std() + 1e-6)
    assert torch.allclose(group_advantages(r, torch.zeros(4, dtype=torch.long)), ref, atol=1e-6)


def test_group_advantages_without_std_and_interleaved_groups() -> None:
    rewards = torch.tensor([1.0, 4.0, 3.0, 0.0])
    groups = torch.tensor([1, 2, 1, 2])
    assert group_advantages(rewards, groups, scale_by_std=False).tolist() == [-1.0, 2.0, 1.0, -2.0]


def test_equal_rewards_and_single_member_groups_give_zero() -> None:
    assert group_advantages(torch.tensor([0.3] * 5), torch.zeros(5, dtype=torch.long)).tolist() == [0.0] * 5
    assert group_advantages(torch.tensor([5.0]), torch.tensor([3])).tolist() == [0.0]
    assert group_advantages(torch.tensor([5.0]), torch.tensor([3]), scale_by_std=False).tolist() == [0.0]


def _ratios(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((1, len(values)), -1.0)
    logprobs = (old + torch.log(torch.tensor([values]))).requires_grad_(True)
    return logprobs, old


def test_positive_advantage_clips_high_ratios_and_masks_tokens() -> None:
    logprobs, old = _ratios([1.5, 0.5, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logprobs, old, logprobs.detach(), torch.tensor([1.0]), mask)
    # token 1: rho 1.5 -> clipped to 1.2; token 2: rho 0.5 keeps -0.5 (min of 0.5, 0.8); token 3 masked
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    grad = logprobs.grad[0]
    assert grad[0].item() == 0.0          # clipped branch: no gradient
    assert grad[1].item() == pytest.approx(-0.5 * 0.5)  # d(-A*rho)/dlogp / n_tokens
    assert grad[2].item() == 0.0          # masked token: no gradient


def test_negative_advantage_clips_low_ratios() -> None:
    logprobs, old = _ratios([0.5, 1.5])
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logprobs, old, None, torch.tensor([-1.0]), mask, kl_coef=0.0)
    # rho 0.5 -> max(0.5, 0.8) = 0.8 (clipped); rho 1.5 -> max(1.5, 1.2) = 1.5 (unclipped)
    assert loss.item() == pytest.approx((0.8 + 1.5) / 2, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0
    assert logprobs.grad[0, 1].item() == pytest.approx(1.5 / 2)


def test_asymmetric_clip_range() -> None:
    logprobs, old = _ratios([1.25])
    loss, stats = policy_loss(logprobs, old, None, torch.tensor([1.0]), torch.ones(1, 1),
                              clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    assert loss.item() == pytest.approx(-1.25) and stats["clip_fraction"] == 0.0


def test_kl_term_value_and_zero_at_reference() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    expected_kl = 0.5 + math.log(2) - 1  # exp(-ln 2) - (-ln 2) - 1
    assert k3_kl(logp, ref)[0].tolist() == pytest.approx([expected_kl, 0.0], abs=1e-6)
    loss, stats = policy_loss(logp, logp, ref, torch.tensor([0.0]), torch.ones(1, 2), kl_coef=0.5)
    assert stats["kl"] == pytest.approx(expected_kl / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * expected_kl / 2, abs=1e-6)
    assert k3_kl(torch.tensor([0.0]), torch.tensor([30.0])).item() == 10.0  # clamped


def test_dr_grpo_aggregation_value() -> None:
    old = torch.zeros(2, 3)
    logprobs = torch.zeros(2, 3)  # rho = 1 everywhere, so pg = -A
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, _ = policy_loss(logprobs, old, None, adv, mask, agg="seq-mean-token-sum-norm", kl_coef=0.0,
                          max_len=4)
    # seq 1: sum -1*3 = -3; seq 2: +2*1 = 2; each / 4, mean over 2 sequences
    assert loss.item() == pytest.approx((-3 / 4 + 2 / 4) / 2)
    token_mean, _ = policy_loss(logprobs, old, None, adv, mask, kl_coef=0.0)
    assert token_mean.item() == pytest.approx((-3 + 2) / 4)


def test_empty_mask_is_guarded() -> None:
    logprobs, old = _ratios([1.0, 1.0])
    loss, stats = policy_loss(logprobs, old, old, torch.tensor([1.0]), torch.zeros(1, 2))
    assert loss.item() == 0.0 and stats["tokens"] == 0.0 and not math.isnan(stats["ratio_mean"])
    loss.backward()
    assert torch.all(logprobs.grad == 0)


def test_gather_logprobs_matches_log_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 50, dtype=torch.bfloat16)
    targets = torch.randint(0, 50, (5, 7))
    expected = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(gather_logprobs(logits, targets, chunk_rows=2), expected, atol=1e-5)


def _reference_token_loss(rho: float, adv: float, low: float, high: float, c: float | None) -> float:
    """The per-token policy loss written out in scalars (verl's dual-clip PPO)."""
    plain = max(-adv * rho, -adv * min(max(rho, 1 - low), 1 + high))
    if c is not None and adv < 0:
        return min(plain, -c * adv)
    return plain


@pytest.mark.parametrize("clip_ratio_c", [None, 3.0, 1.5])
def test_dual_clip_matches_the_scalar_rule_on_random_tokens(clip_ratio_c) -> None:
    gen = torch.Generator().manual_seed(int((clip_ratio_c or 0) * 10))
    rows, cols = 64, 9
    # ratios from 0.05 to 20 so every branch (unclipped, clipped, dual-clipped) occurs
    log_rho = (torch.rand(rows, cols, generator=gen) * 6 - 3)
    adv = torch.randn(rows, generator=gen) * 2
    old = torch.randn(rows, cols, generator=gen)
    logprobs = (old + log_rho).requires_grad_(True)
    mask = (torch.rand(rows, cols, generator=gen) > 0.2).float()
    loss, stats = policy_loss(logprobs, old, None, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                              clip_ratio_c=clip_ratio_c)
    expected, capped, n = 0.0, 0, 0
    for b in range(rows):
        for t in range(cols):
            if mask[b, t]:
                rho, a = math.exp(log_rho[b, t].item()), adv[b].item()
                value = _reference_token_loss(rho, a, 0.2, 0.28, clip_ratio_c)
                expected += value
                n += 1
                capped += clip_ratio_c is not None and a < 0 and value == -clip_ratio_c * a
    assert loss.item() == pytest.approx(expected / n, rel=1e-5)
    assert stats["dual_clip_fraction"] == pytest.approx(capped / n)
    if clip_ratio_c is not None:
        assert capped > 10  # the bound was exercised, not vacuous
        loss.backward()
        rho = log_rho.exp()
        hit = (adv[:, None] < 0) & (rho * -adv[:, None] > clip_ratio_c * -adv[:, None]) & mask.bool()
        assert torch.all(logprobs.grad[hit] == 0)  # a capped token carries no gradient


def test_dual_clip_leaves_positive_advantages_alone_and_rejects_bad_bounds() -> None:
    logprobs, old = _ratios([5.0, 0.1])
    for c in (None, 3.0):
        loss, _ = policy_loss(logprobs, old, None, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.0, clip_ratio_c=c)
        assert loss.item() == pytest.approx((-1.2 - 0.1) / 2)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(logprobs, old, None, torch.tensor([-1.0]), torch.ones(1, 2), clip_ratio_c=1.0)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.6])
def test_gather_logprobs_is_the_tempered_log_softmax(temperature) -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 40) * 4
    targets = torch.randint(0, 40, (3, 5))
    probs = torch.softmax(logits.double() / temperature, -1)  # independent: probabilities, then log
    expected = probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).log().float()
    assert torch.allclose(gather_logprobs(logits, targets, temperature=temperature), expected, atol=1e-5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        gather_logprobs(logits, targets, temperature=0.0)


def test_informative_groups_match_the_rule_on_random_batches() -> None:
    """A group is informative when it has two or more members and not all their rewards are equal."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        n = int(torch.randint(1, 13, (1,), generator=gen))
        groups = torch.randint(0, 4, (n,), generator=gen) * 5 + 2  # few, non-contiguous labels
        rewards = torch.randint(0, 3, (n,), generator=gen).float() * 0.35 - 0.6  # ties are common
        members: dict[int, list[float]] = {}
        for g, r in zip(groups.tolist(), rewards.tolist()):
            members.setdefault(g, []).append(r)
        expected = [len(members[g]) > 1 and len(set(members[g])) > 1 for g in groups.tolist()]
        assert grpo.informative_groups(rewards, groups).tolist() == expected
        # the groups it drops are exactly those that get advantage 0 everywhere
        adv = group_advantages(rewards, groups)
        for g, keep, a in zip(groups.tolist(), expected, adv.tolist()):
            assert keep or a == 0.0


def _ppo_piecewise(rho: float, adv: float, low: float, high: float) -> tuple[float, bool]:
    """PPO's clipped loss in its piecewise form (Schulman et al. 2017, fig. 1), and whether it is
    flat there: A > 0 stops gaining above 1 + high, A < 0 stops gaining below 1 - low."""
    if adv > 0 and rho > 1 + high:
        return -adv * (1 + high), True
    if adv < 0 and rho < 1 - low:
        return -adv * (1 - low), True
    return -adv * rho, False


@pytest.mark.parametrize("clip_high", [0.2, 0.28])
def test_clip_higher_matches_the_piecewise_rule_on_random_tokens(clip_high) -> None:
    """Clip-higher (DAPO): ratios clipped to [1 - 0.2, 1 + clip_high]; the default 0.2 is symmetric."""
    gen = torch.Generator().manual_seed(28)
    rows, cols = 48, 11
    log_rho = torch.rand(rows, cols, generator=gen) * 0.8 - 0.4  # ratios 0.67 .. 1.49: every branch
    adv = torch.randn(rows, generator=gen)
    old = torch.randn(rows, cols, generator=gen) - 2
    logprobs = (old + log_rho).requires_grad_(True)
    mask = (torch.rand(rows, cols, generator=gen) > 0.15).float()
    loss, stats = policy_loss(logprobs, old, None, adv, mask, clip_low=0.2, clip_high=clip_high, kl_coef=0.0)
    loss.backward()
    total, flat, n, between = 0.0, 0, 0, 0
    for b in range(rows):
        for t in range(cols):
            rho, a = math.exp(log_rho[b, t].item()), adv[b].item()
            value, is_flat = _ppo_piecewise(rho, a, 0.2, clip_high)
            if mask[b, t]:
                total, n, flat = total + value, n + 1, flat + is_flat
                between += a > 0 and 1.2 < rho < 1 + clip_high
                # gradient: none where the rule is flat, -A * rho / n (d/dlogp of -A*rho) elsewhere
                expected_grad = 0.0 if is_flat else -a * rho / mask.sum().item()
                assert logprobs.grad[b, t].item() == pytest.approx(expected_grad, rel=1e-4, abs=1e-7)
            else:
                assert logprobs.grad[b, t].item() == 0.0
    assert loss.item() == pytest.approx(total / n, rel=1e-5)
    assert stats["clip_fraction"] == pytest.approx(flat / n)
    if clip_high > 0.2:
        assert between > 5  # tokens the symmetric clip would stop and clip-higher lets rise


def _random_batch(seed: int):
    """Random right-padded rows (prompts that share a start, or in some cases differ early), the
    response start and a sampling temperature."""
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(2, 5, (1,), generator=gen))
    prompt = torch.randint(1, 97, (int(torch.randint(3, 20, (1,), generator=gen)),), generator=gen).tolist()
    prompts = [prompt if seed % 4 else torch.randint(1, 97, (len(prompt),), generator=gen).tolist()
               for _ in range(rows)]
    seqs = [p + torch.randint(1, 97, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
            for p in prompts]
    width = max(map(len, seqs))
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    return ids, mask, len(prompt), float(torch.empty(1).uniform_(0.5, 1.5, generator=gen)), gen


def _logprobs_and_gradient(model, ids, mask, start, temperature, **how):
    lp = grpo.token_logprobs(model, ids, mask, start, temperature, **how)
    (lp * mask[:, start:]).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()]).clone()
    model.zero_grad()
    return lp.detach(), grad


def _assert_same(plain, other, mask, start) -> None:
    (plain_lp, plain_grad), (lp, grad) = plain, other
    real = mask[:, start:].bool()
    assert torch.allclose(plain_lp[real], lp[real], atol=1e-5), (plain_lp - lp).abs().max()
    assert (plain_grad - grad).norm() <= 1e-5 * plain_grad.norm() + 1e-7


@pytest.mark.parametrize("seed", range(12))
def test_shared_prefix_log_probs_and_gradients_are_the_full_batch_ones(seed) -> None:
    """Running the rows' common prompt once (share_prefix) against the plain padded batch, on random
    prompts, response lengths, right padding and temperatures: the same log-probs and gradients."""
    model = tiny_llama(seed)
    ids, mask, start, temperature, _ = _random_batch(seed)
    _assert_same(_logprobs_and_gradient(model, ids, mask, start, temperature),
                 _logprobs_and_gradient(model, ids, mask, start, temperature, share_prefix=True), mask, start)


@pytest.mark.parametrize("seed", range(12))
def test_chunked_logits_give_the_full_logits_log_probs_and_gradients(seed) -> None:
    """The output layer run a random number of response positions at a time (1 up to more than the
    response), with or without the shared prompt, against the plain path's whole logits tensor:
    the same log-probs and gradients."""
    model = tiny_llama(seed)
    ids, mask, start, temperature, gen = _random_batch(seed)
    chunk = int(torch.randint(1, ids.shape[1] - start + 3, (1,), generator=gen))
    _assert_same(_logprobs_and_gradient(model, ids, mask, start, temperature),
                 _logprobs_and_gradient(model, ids, mask, start, temperature, share_prefix=bool(seed % 2),
                                        chunk_tokens=chunk), mask, start)


def test_chunked_logits_hold_one_chunk_of_logits_at_a_time() -> None:
    """What the chunks are for: the graph the forward leaves for the backward holds no [B, T, V]
    tensor, only chunk-sized logits while one is computed (the saved tensors are counted)."""
    model = tiny_llama(0)
    ids = torch.randint(1, 97, (2, 40))
    mask = torch.ones_like(ids)
    saved: list[tuple[int, ...]] = []

    def keep(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    for chunk in (0, 4):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            grpo.token_logprobs(model, ids, mask, 10, 1.0, chunk_tokens=chunk)
        vocab_wide = [shape for shape in saved if shape and shape[-1] == 97 and len(shape) >= 2]
        if chunk:
            assert vocab_wide == [], vocab_wide  # the checkpointed chunks keep their inputs only
        else:
            assert any(s[:2] == (2, 30) for s in vocab_wide)  # the plain path keeps the whole response's logits


def test_chunked_logits_refuse_a_model_that_caps_its_logits() -> None:
    model = tiny_llama(0)
    model.config.final_logit_softcapping = 30.0
    ids = torch.randint(1, 97, (1, 8))
    with pytest.raises(ValueError, match="logits_chunk_tokens"):
        grpo.token_logprobs(model, ids, torch.ones_like(ids), 4, 1.0, chunk_tokens=2)


def test_shared_prefix_length_stops_at_the_first_differing_or_padded_column() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, 3, (3, 8), generator=gen)
        mask = (torch.rand(3, 8, generator=gen) > 0.1).long()
        limit = int(torch.randint(0, 9, (1,), generator=gen))
        expected = 0  # the rule restated: count columns from the left while all rows agree and are real
        while expected < min(limit, 8) and len(set(ids[:, expected].tolist())) == 1 and bool(mask[:, expected].all()):
            expected += 1
        assert grpo.shared_prefix_length(ids, mask, limit) == expected
