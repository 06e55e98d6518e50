"""The sampler against the learner: how far apart their log-probs are, and the corrections for it.

The engine that samples the agent (vLLM, or transformers) and the learner that recomputes its
log-probs differ in precision and kernels, and at `rollout.max_staleness` >= 1 in weights too, so
the "on-policy" update is slightly off-policy. This module holds the formulas, free of models,
configs and I/O, so they can be checked against an independent restatement
(tests/core/test_rollout_correction.py). Everything is taken on agent tokens only (loss mask 1):
environment-reply tokens were never sampled by the agent, and counting them would let a long
multi-turn exchange inflate the sequence ratios (TRL#4772).

Notation, per agent token: old = the learner's log-prob under the weights before the update, b =
the sampler's own log-prob (`Trajectory.logprobs`), d = old - b, rho = exp(d) = pi_learner / pi_sampler.

- token TIS: each token's policy term is multiplied by min(rho, cap) (`core.grpo.truncated_is_weights`);
- geometric sequence mask (SkyRL's geo mask, bounds [0.99, 1.01] there): a trajectory's policy terms are
  kept when the geometric mean of its agent tokens' ratios, exp(mean d), lies within [low, high], and
  zeroed otherwise (it still counts in the loss's normaliser and in the KL term);
- metrics (verl's `rollout_corr/*`), over the agent tokens (N) and the trajectories with any (S):
  `kl` = mean(b - old) (the direct estimate of KL(sampler || learner)), `k3_kl` = mean(rho - 1 - d)
  (the same KL's low-variance estimate, >= 0), `chi2_token` = mean(rho^2) - 1, `chi2_seq` = mean over
  trajectories of exp(2 sum d) - 1, `ess` = (sum rho)^2 / (N sum rho^2) (the effective sample size as
  a share of N, 1 = no mismatch), `token_capped_share` (rho >= cap), `seq_masked_share` and
  `token_masked_share` (outside the geometric bounds). For the metrics d is clamped to [-20, 20]
  per token and per trajectory before exp, so one wild token cannot overflow them.

Sequences are given as `seq_ids`, a tensor of the tokens' shape holding each token's trajectory
(0..n-1, -1 where none), so a padded micro-batch (one trajectory a row) and a packed one (several
a row) go through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from prompt_r1.core.grpo import truncated_is_weights

Mode = Literal["off", "metrics", "token-tis", "geo-mask", "both"]
MODES: tuple[str, ...] = ("off", "metrics", "token-tis", "geo-mask", "both")
LOG_RATIO_BOUND = 20.0  # |d| (token or trajectory) above it is clamped in the metrics: exp(40) still fits a float64

# the sums the metrics are made from: additive over micro-batches and learner ranks
SUMS = ("tokens", "sequences", "neg_log_ratio", "k3", "rho", "rho_sq", "seq_rho_sq", "capped", "seq_masked",
        "tokens_masked")


def check_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """Bounds [low, high] of the geometric mean ratio: 0 < low <= 1 <= high, so an exact match is kept."""
    low, high = bounds
    if not 0.0 < low <= 1.0 <= high:
        raise ValueError(f"geometric bounds must satisfy 0 < low <= 1 <= high (an exact match must be kept), "
                         f"got [{low}, {high}]")
    return float(low), float(high)


def sequence_sums(values: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """Per trajectory, the sum of `values` over its mask-1 tokens ([n_seqs]).

    >>> sequence_sums(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[1.0, 0.0, 1.0]]), torch.tensor([[0, 0, 1]]), 2)
    tensor([1., 4.])
    """
    slot = torch.where(seq_ids >= 0, seq_ids, n_seqs).flatten()  # tokens of no trajectory: one extra slot, dropped
    out = torch.zeros(n_seqs + 1, dtype=values.dtype, device=values.device)
    return out.index_add_(0, slot, (values * mask.to(values.dtype)).flatten())[:n_seqs]


def geometric_keep(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor,
                   bounds: tuple[float, float]) -> torch.Tensor:
    """Per token, 1.0 where its trajectory's geometric mean ratio exp(mean d) over agent tokens lies
    within `bounds`, else 0.0 (a trajectory without agent tokens is kept). A constant: no gradient.

    >>> old = torch.tensor([[-1.0, -1.0, -2.0, -2.0]])
    >>> b = torch.tensor([[-1.0, -1.01, -2.0, -2.0]])  # mean gap 0.005: ratio 1.005
    >>> geometric_keep(old, b, torch.ones(1, 4), torch.tensor([[0, 0, 1, 1]]), (0.99, 1.01)).tolist()
    [[1.0, 1.0, 1.0, 1.0]]
    >>> geometric_keep(old, b, torch.ones(1, 4), torch.tensor([[0, 0, 1, 1]]), (0.999, 1.001)).tolist()
    [[0.0, 0.0, 1.0, 1.0]]
    """
    low, high = check_bounds(bounds)
    dtype = torch.promote_types(old.dtype, torch.float32)
    d = (old.to(dtype) - behaviour.to(dtype)).detach()
    n_seqs = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    counts = sequence_sums(torch.ones_like(d), mask, seq_ids, n_seqs)
    geo = torch.exp(sequence_sums(d, mask, seq_ids, n_seqs) / counts.clamp(min=1.0))
    kept = ((geo >= low) & (geo <= high)) | (counts == 0)
    table = torch.cat([kept, kept.new_ones(1)])  # the extra slot: tokens of no trajectory are kept
    return table[torch.where(seq_ids >= 0, seq_ids, n_seqs)].to(dtype)


def mismatch_sums(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor,
                  cap: float, bounds: tuple[float, float]) -> dict[str, float]:
    """The `SUMS` of one micro-batch (float64, on the CPU); `mismatch_metrics` turns summed ones
    into the metrics. `cap` and `bounds` are those of token TIS and the geometric mask, whether or
    not the run applies them (metrics-only: what they would cap and mask)."""
    low, high = check_bounds(bounds)
    old, behaviour = old.detach().double().cpu(), behaviour.detach().double().cpu()
    mask, seq_ids = mask.detach().double().cpu(), seq_ids.detach().cpu()
    mask = mask * (seq_ids >= 0).double()
    d = old - behaviour
    n_seqs = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    counts = sequence_sums(torch.ones_like(d), mask, seq_ids, n_seqs)
    seq_d = sequence_sums(d, mask, seq_ids, n_seqs)
    geo = torch.exp(seq_d / counts.clamp(min=1.0))
    has_agent = counts > 0
    seq_masked = has_agent & ((geo < low) | (geo > high))
    clamped = d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rho = torch.exp(clamped)
    seq_rho_sq = torch.exp(2.0 * seq_d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    return {
        "tokens": mask.sum().item(),
        "sequences": has_agent.sum().item(),
        "neg_log_ratio": (-d * mask).sum().item(),
        "k3": ((rho - 1.0 - clamped) * mask).sum().item(),
        "rho": (rho * mask).sum().item(),
        "rho_sq": (rho ** 2 * mask).sum().item(),
        "seq_rho_sq": seq_rho_sq[has_agent].sum().item(),
        "capped": ((torch.exp(d) >= cap).double() * mask).sum().item(),
        "seq_masked": seq_masked.sum().item(),
        "tokens_masked": counts[seq_masked].sum().item(),
    }


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The `rollout_corr/*` metrics from summed `SUMS` (module docstring); with no agent token,
    the values of a perfect match.

    >>> m = mismatch_metrics(mismatch_sums(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3),
    ...                                    torch.zeros(1, 3, dtype=torch.long), 2.0, (0.99, 1.01)))
    >>> m["rollout_corr/k3_kl"], m["rollout_corr/ess"], m["rollout_corr/seq_masked_share"]
    (0.0, 1.0, 0.0)
    """
    n, s = sums["tokens"], sums["sequences"]
    if n <= 0:
        return {f"rollout_corr/{key}": value for key, value in (
            ("kl", 0.0), ("k3_kl", 0.0), ("chi2_token", 0.0), ("chi2_seq", 0.0), ("ess", 1.0),
            ("token_capped_share", 0.0), ("seq_masked_share", 0.0), ("token_masked_share", 0.0))}
    return {
        "rollout_corr/kl": sums["neg_log_ratio"] / n,
        "rollout_corr/k3_kl": sums["k3"] / n,
        "rollout_corr/chi2_token": sums["rho_sq"] / n - 1.0,
        "rollout_corr/chi2_seq": sums["seq_rho_sq"] / max(s, 1.0) - 1.0,
        "rollout_corr/ess": sums["rho"] ** 2 / (n * sums["rho_sq"]) if sums["rho_sq"] > 0 else 1.0,
        "rollout_corr/token_capped_share": sums["capped"] / n,
        "rollout_corr/seq_masked_share": sums["seq_masked"] / max(s, 1.0),
        "rollout_corr/token_masked_share": sums["tokens_masked"] / n,
    }


@dataclass(frozen=True)
class Correction:
    """What a run corrects and measures: `mode` (`train.rollout_correction.mode`), the token cap
    (`train.tis_cap`), the geometric bounds, and whether batches may be stale
    (`rollout.max_staleness` >= 1, which always applies token TIS: the one path for both causes)."""

    mode: Mode = "off"
    tis_cap: float = 2.0
    geo_bounds: tuple[float, float] = (0.99, 1.01)
    stale: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown rollout correction mode {self.mode!r}; use one of {', '.join(MODES)}")
        check_bounds(self.geo_bounds)

    @property
    def token_weights(self) -> bool:
        """Token TIS on the policy term: stale batches, or asked for."""
        return self.stale or self.mode in ("token-tis", "both")

    @property
    def sequence_mask(self) -> bool:
        return self.mode in ("geo-mask", "both")

    @property
    def measures(self) -> bool:
        """The `rollout_corr/*` metrics: every mode but off."""
        return self.mode != "off"

    @property
    def needs_sampler(self) -> bool:
        """Whether every trajectory must carry the sampler's log-probs."""
        return self.token_weights or self.measures

    @property
    def per_sequence(self) -> bool:
        """Whether `weights` or `mismatch_sums` need the tokens' trajectories (`seq_ids`)."""
        return self.sequence_mask or self.measures

    def weights(self, old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                seq_ids: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(token TIS weights, the weights of each token's policy term): None where none apply.
        Off at staleness 0 both are None, the plain loss; stale and off both are the TIS weights."""
        tis = truncated_is_weights(old, behaviour, self.tis_cap) if self.token_weights else None
        if not self.sequence_mask:
            return tis, tis
        if seq_ids is None:
            raise ValueError("the geometric sequence mask needs the tokens' trajectories (seq_ids)")
        keep = geometric_keep(old.float(), behaviour.float(), mask, seq_ids, self.geo_bounds)
        return tis, keep if tis is None else tis * keep

