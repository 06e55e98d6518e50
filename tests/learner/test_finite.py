"""Every number the learner applies is finite, or the step stops before it is applied (issue 62 item 4):
a NaN or infinite advantage anywhere in a batch, by any route, leaves every weight as it was."""

from __future__ import annotations

import math
import random

import pytest
import torch
from grpo_helpers import hand_trajectories, make_config

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import parse_config
from prompt_r1.learner.finite import NonFiniteUpdate, check_finite_update
from prompt_r1.learner.grpo_learner import GRPOLearner
from prompt_r1.learner.update_state import PreparedBatch


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("seed", range(2))
def test_a_non_finite_advantage_stops_the_step_with_no_weight_changed(tiny_model_path, monkeypatch, bad, seed):
    learner = GRPOLearner(make_config(micro_batch_size=2, mini_batch_questions=1 + seed), tiny_model_path)
    before = {k: v.detach().clone() for k, v in learner.model.named_parameters()}
    real, rng = PreparedBatch.micro_advantages, random.Random(seed)

    def poisoned(self, micro):  # one loss token of every micro-batch gets the bad value
        adv = real(self, micro).clone().float()
        if adv.dim() == 1:  # one advantage per row
            adv[rng.randrange(adv.numel())] = bad
        else:
            rows, cols = torch.nonzero(micro.loss_mask, as_tuple=True)
            pick = rng.randrange(len(rows))
            adv[rows[pick], cols[pick]] = bad
        return adv

    monkeypatch.setattr(PreparedBatch, "micro_advantages", poisoned)
    with pytest.raises(NonFiniteUpdate, match=r"gradient norm of ppo epoch 1, mini-batch 1 of \d+ is (nan|inf)"):
        learner.step(hand_trajectories(learner.tokenizer))
    for name, value in learner.model.named_parameters():
        assert torch.equal(value, before[name]), name
        assert torch.isfinite(value).all(), name


@pytest.mark.parametrize("norm", [0.0, 1e-30, 3.0, 1e30])
def test_finite_norms_pass_unchanged(norm) -> None:
    assert check_finite_update(norm, 0, 0, 1) == norm


@pytest.mark.parametrize("weight", [100.5, 1e39, 1e300])
def test_a_turn_weight_beyond_what_float32_advantages_hold_is_refused(weight) -> None:
    with pytest.raises(ConfigError, match="reward.turn.weight"):
        parse_config({"reward": {"turn": {"weight": weight}}})
