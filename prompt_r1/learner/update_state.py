"""What one GRPO update carries between its parts (`GRPOLearner.step`: prepare, logprobs, update,
metrics): the prepared batch, the running sums the metrics are made from, and the run's
sampler/learner correction (`core.rollout_correction`) as the learner applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from prompt_r1.config.experiment import Config
from prompt_r1.core.rollout_correction import SUMS, Correction, mismatch_metrics, mismatch_sums
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import turn_spans
from prompt_r1.learner.batches import MicroBatch


def run_correction(cfg: Config) -> Correction:
    """The run's correction: `train.rollout_correction` with the token cap `train.tis_cap`; stale
    batches (`rollout.max_staleness` >= 1) always take token TIS."""
    corr = cfg.train.rollout_correction
    return Correction(corr.mode, cfg.train.tis_cap, (corr.geo_low, corr.geo_high), stale=cfg.rollout.max_staleness > 0)


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
        turns have no sampling log-prob, `Trajectory.scaffold_turns`), for `micro.scatter`."""
        out = {}
        for i in micro.indices:
            trajectory = self.trajectories[i]
            mask = torch.ones(self.resp_lens[i])
            spans = turn_spans(trajectory.loss_mask)
            for turn in trajectory.scaffold_turns:
                start, end = spans[turn]
                mask[start:end] = 0.0
            out[i] = mask
        return out

    def sequence_ids(self, micro: MicroBatch) -> torch.Tensor:
        """Each response column's trajectory within the micro-batch (0..b-1; -1 where none: padding,
        or a packed row's prompts), for the per-trajectory parts of `core.rollout_correction`."""
        spans = {i: torch.full((self.resp_lens[i],), k + 1.0) for k, i in enumerate(micro.indices)}
        return micro.scatter(spans).long() - 1


# the statistics of `policy_loss` that the metrics average per loss token
LOSS_STATISTICS = ("pg_loss", "kl", "clip_fraction", "dual_clip_fraction", "ratio_mean")


@dataclass
class UpdateSums:
    """One rank's running sums over an update's passes; `GRPOLearner.metrics` sums them over ranks once."""

    loss: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_STATISTICS, 0.0))  # x loss tokens
    tokens: float = 0.0  # loss tokens, every pass
    diff: float = 0.0  # |sampling - old log-prob| over the first pass's loss tokens
    diff_tokens: float = 0.0  # the first pass's loss tokens
    tis: float = 0.0  # token TIS weights over those tokens (stale batches, or rollout_correction token-tis/both)
    tis_capped: float = 0.0  # how many of them reached train.tis_cap
    mismatch: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUMS, 0.0))  # rollout_corr sums
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

    def add_mismatch(self, micro: MicroBatch, old: torch.Tensor, seq_ids: torch.Tensor, correction: Correction) -> None:
        """The micro-batch's `core.rollout_correction` sums (agent tokens only), at the run's cap and bounds."""
        part = mismatch_sums(old, micro.sampling_logprobs, micro.loss_mask, seq_ids, correction.tis_cap,
                             correction.geo_bounds)
        for key, value in part.items():
            self.mismatch[key] += value

    def correction_values(self) -> list[float]:
        """What `correction_metrics` needs, as one list for a single sum over ranks."""
        return [self.tis, self.tis_capped, *self.mismatch.values()]

    @staticmethod
    def correction_metrics(summed: list[float], tokens: float, correction: Correction) -> dict[str, float]:
        """`tis_mean` and `tis_capped_fraction` (per agent token) where token TIS applies, the
        `rollout_corr/*` metrics where the mode measures, from `correction_values` summed over ranks."""
        tis_sum, tis_capped, *mismatch = summed
        out = {}
        if correction.token_weights:
            out.update({"tis_mean": tis_sum / max(tokens, 1.0), "tis_capped_fraction": tis_capped / max(tokens, 1.0)})
        if correction.measures:
            out.update(mismatch_metrics(dict(zip(SUMS, mismatch))))
        return out
