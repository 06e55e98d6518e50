"""The scaffold's cross-entropy term (`rollout.scaffold.ce_coef`): a verified scaffolded member's
agent tokens carry ce_coef more advantage, nothing else moves, and at the on-policy ratio of 1
that is exactly ce_coef x the gradient of their negative log-likelihood."""

from __future__ import annotations

import random

import pytest
import torch
from grpo_helpers import hand_trajectories, make_config, spy_policy_loss

from prompt_r1.learner.grpo_learner import GRPOLearner


def _config(ce_coef: float, verified_at: float = 0.99):
    cfg = make_config(micro_batch_size=6, kl_coef=0.0, lr=1e-3)
    scaffold = {"fn": "prompt_r1.data.first_call:first_hop_scaffold", "members": 1, "ce_coef": ce_coef,
                "verified_at": verified_at}
    return cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={
        "group_size": 3, "scaffold": cfg.rollout.scaffold.model_copy(update=scaffold)})})


@pytest.mark.parametrize("ce_coef,verified_at", [(0.5, 0.99), (1.5, 0.5), (0.25, 2.0)])
def test_only_verified_scaffolded_members_gain_the_coefficient(tiny_model_path, monkeypatch, ce_coef, verified_at):
    rng = random.Random(int(ce_coef * 100))
    calls = spy_policy_loss(monkeypatch)
    advs = []
    for coef in (0.0, ce_coef):
        learner = GRPOLearner(_config(coef, verified_at), tiny_model_path)
        trajectories = hand_trajectories(learner.tokenizer)
        for t in trajectories:
            t.scaffold_tokens = rng.randint(1, 4) if t.group_index == 2 else 0
        learner.step(trajectories)
        advs.append(calls[-1]["adv"])
        mask = calls[-1]["mask"]
    plain = advs[0] if advs[0].dim() == 2 else advs[0][:, None].expand_as(advs[1])  # per row without the term
    bonus = (advs[1] - plain) * mask  # compared on the agent tokens, the only ones the loss reads
    for row, t in enumerate(trajectories):  # one micro-batch of all six, in order
        verified = t.group_index == 2 and t.reward.total >= verified_at
        expected = torch.zeros_like(bonus[row])
        if verified:
            expected = ce_coef * mask[row]
        assert torch.allclose(bonus[row], expected, atol=1e-6), (row, t.reward.total)


def test_at_ratio_one_the_bonus_is_the_cross_entropy_gradient() -> None:
    """Gradient of -mean(A x ratio) with A + c on some tokens = the same minus c x grad of their mean log-prob."""
    logp = torch.randn(2, 7, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1]], dtype=torch.float32)
    adv = torch.randn(2, 7)
    ce = torch.tensor([[1.0] * 7, [0.0] * 7]) * mask
    ratio = (lambda: torch.exp(logp - logp.detach()))
    (grad_bonus,) = torch.autograd.grad(-((adv + 0.5 * ce) * ratio() * mask).sum() / mask.sum(), logp)
    (grad_plain,) = torch.autograd.grad(-(adv * ratio() * mask).sum() / mask.sum(), logp)
    (grad_ce,) = torch.autograd.grad(-(0.5 * ce * logp).sum() / mask.sum(), logp)
    assert torch.allclose(grad_bonus, grad_plain + grad_ce, atol=1e-6)
