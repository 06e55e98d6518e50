"""What one GRPO update carries between its parts (`GRPOLearner.step`: prepare, logprobs, update,
metrics): the prepared batch, and the running sums the metrics are made from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from prompt_r1.core.trajectory import Trajectory
from prompt_r1.learner.batches import MicroBatch


@dataclass(frozen=True)
class PreparedBatch:
    """A rollout batch as one rank trains it (`GRPOLearner.prepare`); lists run over its trajectories."""

    trajectories: list[Trajectory]
    resp_lens: list[int]
    advantages: torch.Tensor  # each trajectory's outcome advantage within its GRPO group
    token_advantages: list[torch.Tensor] | None  # turn credit: each response token's; else None
    max_len: int  # the loss's length normaliser: agent.max_response_tokens, or a longer response (over ranks)
    mini_batches: list[list[MicroBatch]]  # one list of micro-batches per optimiser step of a pass
    trained_tokens: int  # prompt + response tokens of the planned questions' trajectories
    group_metrics: dict[str, float]  # groups, groups_informative, informative_share (over ranks)

    @property
    def empty(self) -> bool:
        """Nothing planned (every group uniform under `train.drop_uniform_groups`): no update."""
        return not self.mini_batches

    def split(self, micro: MicroBatch, values: torch.Tensor) -> list[torch.Tensor]:
        """`values` of the micro-batch's layout as one response vector per trajectory (`MicroBatch.split`)."""
        return micro.split(values, self.resp_lens)

    def micro_advantages(self, micro: MicroBatch) -> torch.Tensor:
        """The micro-batch's advantages: one per row (a padded row is one trajectory), or per token
        under turn credit or packing (a packed row holds several trajectories)."""
        if self.token_advantages is not None:
            return micro.scatter(self.token_advantages)
        if micro.packed:
            return micro.scatter({i: self.advantages[i].expand(self.resp_lens[i]) for i in micro.indices})
        return self.advantages[micro.indices]

    def sampled_masks(self, micro: MicroBatch) -> dict[int, torch.Tensor]:
        """Per trajectory of the micro-batch, 1 on the response tokens the sampler drew (a scaffold's
        leading tokens have no sampling log-prob, `Trajectory.scaffold_tokens`), for `micro.scatter`."""
        out = {}
        for i in micro.indices:
            mask = torch.ones(self.resp_lens[i])
            mask[: self.trajectories[i].scaffold_tokens] = 0.0
            out[i] = mask
        return out


# the statistics of `policy_loss` that the metrics average per loss token
LOSS_STATISTICS = ("pg_loss", "kl", "clip_fraction", "dual_clip_fraction", "ratio_mean")


@dataclass
class UpdateSums:
    """One rank's running sums over an update's passes; `GRPOLearner.metrics` sums them over ranks once."""

    loss: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_STATISTICS, 0.0))  # x loss tokens
    tokens: float = 0.0  # loss tokens, every pass
    diff: float = 0.0  # |sampling - old log-prob| over the first pass's loss tokens
    diff_tokens: float = 0.0  # the first pass's loss tokens
    tis: float = 0.0  # importance weights of stale batches over those tokens
    tis_capped: float = 0.0  # how many of them reached train.tis_cap
    grad_norms: list[float] = field(default_factory=list)  # one per optimiser step, before clipping
    lr: float = 0.0  # the lr of the optimiser steps

    def add_loss(self, stats: dict[str, float]) -> None:
        """A micro-batch's `policy_loss` statistics, weighted by its loss tokens."""
        for key in self.loss:
            self.loss[key] += stats[key] * stats["tokens"]
        self.tokens += stats["tokens"]

    def add_sampling_gap(self, micro: MicroBatch, old: torch.Tensor, tis: torch.Tensor | None, tis_cap: float,
                         sampled: torch.Tensor | None = None) -> None:
        """How far the sampler's log-probs are from the old policy's on the micro-batch's loss tokens
        the sampler drew (`sampled`, the micro-batch's layout; None = all of them), and its importance
        weights (None: on-policy batches have none)."""
        mask_cpu = micro.loss_mask.cpu() * (sampled.cpu() if sampled is not None else 1.0)
        diff = (micro.sampling_logprobs.cpu() - old.cpu()).abs() * mask_cpu
        self.diff += diff.sum().item()
        self.diff_tokens += mask_cpu.sum().item()
        if tis is not None:
            tis_cpu = tis.cpu()
            self.tis += (tis_cpu * mask_cpu).sum().item()
            self.tis_capped += ((tis_cpu >= tis_cap).float() * mask_cpu).sum().item()
