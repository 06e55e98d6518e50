"""The scaffold's cross-entropy term (`rollout.scaffold.ce_coef`): a verified scaffolded member's
agent tokens carry ce_coef more advantage, nothing else moves, and at the on-policy ratio of 1
that is exactly ce_coef x the gradient of their negative log-likelihood."""

from __future__ import annotations

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
    calls = spy_policy_loss(monkeypatch)
    advs = []
    for coef in (0.0, ce_coef):
        learner = GRPOLearner(_config(coef, verified_at), tiny_model_path)
        trajectories = hand_trajectories(learner.tokenizer)
        for t in trajectories:
            t.scaffold_turns = [0] if t.group_index == 2 else []
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


def test_the_sampled_mask_leaves_out_every_written_turn_and_nothing_else() -> None:
    """Against a restatement: a token was drawn by the sampler unless it lies in an agent turn (a run of
    loss-mask 1s, counted in order) that `scaffold_turns` lists; replies (mask 0) count as drawn (they are
    never read there: the sums multiply by the loss mask too)."""
    import random
    from types import SimpleNamespace

    from prompt_r1.core.trajectory import Trajectory
    from prompt_r1.learner.update_state import PreparedBatch

    rng = random.Random(0)
    trajectories = []
    for i in range(200):
        mask, turn_of = [], []
        for turn in range(rng.randint(1, 4)):
            mask += [1] * rng.randint(1, 5)
            turn_of += [turn] * (len(mask) - len(turn_of))
            reply = rng.randint(1, 3)
            mask += [0] * reply
            turn_of += [None] * reply
        turns = len({t for t in turn_of if t is not None})
        written = sorted(rng.sample(range(turns), rng.randint(0, turns)))
        trajectories.append((Trajectory("q", i, list(range(len(mask))), loss_mask=mask, scaffold_turns=written),
                             [0.0 if t in written else 1.0 for t in turn_of]))
    batch = PreparedBatch([t for t, _ in trajectories], [len(t.loss_mask) for t, _ in trajectories],
                          torch.zeros(len(trajectories)), None, 32, [], 0, {})
    masks = batch.sampled_masks(SimpleNamespace(indices=list(range(len(trajectories)))))
    for i, (_, expected) in enumerate(trajectories):
        assert masks[i].tolist() == expected
