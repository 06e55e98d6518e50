"""Each trajectory's outcome advantage within its GRPO group, by the config's rule.

One function for the learner, which trains with these (`GRPOLearner._advantages`, where turn
credit then adds per-token terms), and for whatever reports them beside a trajectory (the
training rollouts' traces, `prompt_r1.training.rollout_traces`), so both say the same number.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prompt_r1.config.experiment import Config
from prompt_r1.core.grpo import decoupled_advantages, group_advantages
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.learner.batches import question_order


def outcome_advantages(trajectories: Sequence[Trajectory], cfg: Config,
                       question_index: dict[str, int] | None = None) -> torch.Tensor:
    """`core.grpo.group_advantages` of the total reward within each question's group (std-scaled
    unless `train.scale_by_std` is off), or under `reward.normalize_parts` (GDPO)
    `decoupled_advantages` of the reward's parts; a trajectory without a reward counts 0.
    `question_index` (question id -> group id) defaults to the questions' first-seen order.

    >>> from prompt_r1.config.experiment import parse_config
    >>> from prompt_r1.core.reward import RewardBreakdown
    >>> ts = [Trajectory("q", i, [], reward=RewardBreakdown(1.0, r, r)) for i, r in enumerate((1.0, 0.0))]
    >>> [round(a, 4) for a in outcome_advantages(ts, parse_config({})).tolist()]
    [0.7071, -0.7071]
    """
    if not trajectories:
        return torch.zeros(0)
    if question_index is None:
        question_index = {q: i for i, q in enumerate(question_order(list(trajectories)))}
    groups = torch.tensor([question_index[t.question_id] for t in trajectories], dtype=torch.long)
    if cfg.reward.normalize_parts:  # GDPO: each part normalised within its group, then summed
        cap = cfg.reward.format_cap
        parts = torch.tensor([t.reward.parts(cap) if t.reward else (0.0, 0.0, 0.0) for t in trajectories])
        return decoupled_advantages(parts, groups, scale_by_std=cfg.train.scale_by_std)
    # per group: a rank holds whole groups, so these are global
    rewards = torch.tensor([t.reward.total if t.reward else 0.0 for t in trajectories])
    return group_advantages(rewards, groups, scale_by_std=cfg.train.scale_by_std)
