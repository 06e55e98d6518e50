"""The sampler-vs-learner benchmark (benchmarks/speed/rollout_mismatch.py): its measuring half on the
tiny model with a torch sampler, so the script cannot rot between real (vLLM) measurements: every
figure is there, and a sampler with the learner's own numbers measures a gap at float rounding only,
one that is moved measures it."""

from __future__ import annotations

import torch
from grpo_helpers import make_config, rollout

from benchmarks.speed.rollout_mismatch import measure
from prompt_r1.learner.grpo_learner import GRPOLearner


def test_measure_reports_every_figure_and_sees_a_moved_sampler(tiny_model_path) -> None:
    cfg = make_config(rollout_correction={"mode": "metrics"}, micro_batch_size=3)
    sampler = GRPOLearner(cfg, tiny_model_path)
    torch.manual_seed(0)
    trajectories = rollout(sampler, ["a", "b"], group_size=3, new_tokens=5)  # true sampling log-probs
    same = measure(cfg, trajectories)
    assert {"agent_tokens", "logprob_diff", "abs_diff_p99", "abs_diff_max", "rollout_corr/k3_kl",
            "rollout_corr/ess", "rollout_corr/seq_masked_share"} <= set(same)
    assert same["agent_tokens"] == 30 and same["abs_diff_max"] < 1e-5 and same["rollout_corr/seq_masked_share"] == 0
    for t in trajectories:
        t.logprobs = [v - 0.05 for v in t.logprobs]
    moved = measure(cfg, trajectories)
    assert abs(moved["logprob_diff"] - 0.05) < 1e-4 and moved["rollout_corr/seq_masked_share"] == 1.0
