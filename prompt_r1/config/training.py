"""How a run trains: the `train` section (GRPO, optimiser, precision, the learner's layout, checkpoints).

The keys that say how the learner is laid out, or how it computes the same update (its logits
in chunks, its micro-batches packed), rather than what it computes, are marked `layout()`
(`prompt_r1.config.identity`): `Config.hash` leaves them out, so a run resumes at another world
size as the same run.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prompt_r1.config.base import StrictModel
from prompt_r1.config.env import PoolEnvConfig
from prompt_r1.config.identity import layout, when_set


class RolloutCorrectionConfig(StrictModel):
    """The sampler against the learner at any staleness (`core.rollout_correction`; docs/training.md,
    "Sampler/learner mismatch"): off by default: the loss and metrics of `max_staleness` alone."""

    mode: Literal["off", "metrics", "token-tis", "geo-mask", "both"] = Field(
        "off",
        description="How the learner treats the gap between the sampler's log-probs of the agent tokens "
        "(`Trajectory.logprobs`) and its own before the update. `off`: nothing beyond `rollout.max_staleness`'s "
        "token TIS. `metrics`: the `rollout_corr/*` metrics each step, the loss unchanged. "
        "`token-tis`: also each agent token's policy term times min(exp(old - sampler), `train.tis_cap`), at "
        "any staleness. `geo-mask`: also a trajectory's policy terms zeroed when the geometric mean of its agent "
        "tokens' ratios leaves [`geo_low`, `geo_high`]. `both`: token TIS and the mask. Any mode but off needs "
        "the sampler's log-probs of every trajectory.",
    )
    geo_low: float = Field(
        0.99, gt=0.0, le=1.0,
        description="Lower bound of a trajectory's geometric mean ratio exp(mean over agent tokens of "
        "(old - sampler)) below which `geo-mask`/`both` masks it (SkyRL: 0.99); `metrics` reports the share it would.",
    )
    geo_high: float = Field(
        1.01, ge=1.0, description="Upper bound of the geometric mean ratio (SkyRL: 1.01); see `geo_low`.",
    )


class TrainConfig(StrictModel):
    steps: int = Field(2, ge=0, description="GRPO steps (each = one rollout batch).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay (the reference uses 0.01).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant.")
    mini_batch_questions: int = Field(
        64, ge=1, description="Questions per optimiser step (a rollout batch may give several)."
    )
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per forward/backward.")
    ppo_epochs: int = Field(
        1, ge=1,
        description="Optimiser passes over each rollout batch (TRL's num_iterations). The old log-probs "
        "are fixed before the first pass, so later passes see ratios away from 1 and the clip bounds them.",
    )
    clip_low: float = Field(0.2, ge=0, description="PPO clip range below 1: ratio clipped at 1 - clip_low.")
    clip_high: float = Field(
        0.2, ge=0,
        description="PPO clip range above 1: ratio clipped at 1 + clip_high. Equal to clip_low (the default) "
        "is the symmetric clip; DAPO's clip-higher uses 0.28, so a token's probability may rise further "
        "than it may fall.",
    )
    clip_ratio_c: float | None = Field(
        None, gt=1.0,
        description="Dual-clip bound for negative advantages: the per-token loss is capped at "
        "-clip_ratio_c * A (the reference uses 3.0); None = plain PPO clipping.",
    )
    tis_cap: float = Field(
        2.0, ge=1.0,
        description="With `rollout.max_staleness` >= 1 or `rollout_correction.mode` token-tis/both: cap C of the "
        "truncated importance weight per agent token, "
        "min(exp(old - behaviour), C), where old is the learner's log-prob under the weights before the update "
        "and behaviour the log-prob the sampling engine recorded (`Trajectory.logprobs`); it multiplies the "
        "clipped PPO term. Otherwise unused (the `metrics` mode reports the share of tokens it would cap).",
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Correction of the sampler/learner gap at any staleness, and its metrics (off by default).",
        json_schema_extra=when_set(by="mode"),
    )
    kl_coef: float = Field(
        0.001, ge=0,
        description="Weight of the k3 KL to the reference policy. 0 = no KL term: no frozen reference copy "
        "is kept (full fine-tuning), no reference forward pass runs, and the `kl` metric reads 0.",
    )
    loss_agg: Literal["token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean",
        description="`token-mean`: mean over all agent tokens of the mini-batch; `seq-mean-token-sum-norm` "
        "(Dr.GRPO): per-sequence token sum / max response length, mean over sequences.",
    )
    scale_by_std: bool = Field(True, description="Divide advantages by the group std (False = Dr.GRPO).")
    drop_uniform_groups: bool = Field(
        False,
        description="Leave groups whose rewards are all equal (advantage 0 for every trajectory) out of "
        "the update, as DAPO's dynamic sampling does: they then add no KL, no tokens to the loss "
        "normalisation and no forward pass; a batch with none left makes no update (`update_skipped`). "
        "Every step logs `groups`, `groups_informative` and `informative_share` either way.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm, per optimiser step.")
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="Where the learner (policy and reference) runs: `auto` (first CUDA GPU if there is "
        "one, else CPU), `cpu`, `cuda` or `cuda:N`.",
    )
    autocast: bool = Field(
        True,
        description="With agent.dtype bfloat16, run the learner's forward/backward under torch autocast "
        "to bfloat16 where the device supports it (CPU, CUDA with bf16; FSDP on CUDA gathers the weights "
        "in bfloat16 through its MixedPrecisionPolicy instead); weights and optimiser state stay float32 "
        "either way. False = float32 compute.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, about a third more compute."
    )
    pack_tokens: int = Field(
        0, ge=0,
        description="0 = micro-batches of `micro_batch_size` trajectories, right-padded to the longest. N > 0 = "
        "micro-batches packed instead: whole trajectories one after another in one sequence of at most N tokens "
        "(prompt and response), each attending only to itself with its positions counted from 0, so no compute "
        "goes to padding; the same log-probs, loss and gradients to float rounding. Must exceed "
        "`agent.max_response_tokens`; a trajectory longer than N stops the step naming both. Needs "
        "`loss_agg: token-mean`; not with `strategy: fsdp`. `prompt-r1 plan` counts N tokens a micro-batch.",
        json_schema_extra=layout(),
    )
    logits_chunk_tokens: int = Field(
        0, ge=0,
        description="0 = the learner projects the whole response onto the vocabulary at once (B x T x V "
        "logits, the largest part of an update's memory at long responses and large vocabularies). N > 0 = "
        "N response positions at a time, recomputed in the backward (`core.grpo.chunked_logprobs`): at most "
        "B x N x V logits exist at once, for the same log-probs and gradients to float rounding and a second "
        "vocabulary projection's compute. `prompt-r1 plan` counts it. Not with `strategy: fsdp`.",
        json_schema_extra=layout(),
    )
    world_size: int = Field(
        1, ge=1,
        description="Learner ranks. 1 = one learner; N > 1 = N Ray actors in a placement group joined by "
        "torch.distributed (nccl where CUDA and NCCL are available, gloo otherwise), each taking whole GRPO "
        "groups of the batch, the loss normalised by the global token count so N ranks give the gradient of one.",
        json_schema_extra=layout(),
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How learner ranks share the model: `ddp` (every rank holds all weights, gradients are "
        "all-reduced) or `fsdp` (FSDP2 `fully_shard` over a device mesh: weights, gradients and AdamW state "
        "sharded, for full fine-tuning that does not fit one device; not with LoRA).",
        json_schema_extra=layout(),
    )
    cpus_per_rank: float = Field(
        1.0, gt=0, description="CPUs in each learner rank's placement bundle.", json_schema_extra=layout()
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="Ray placement strategy of the learner ranks' bundles: PACK keeps them on as few nodes as "
        "possible (collectives stay inside a node), SPREAD puts them on different nodes where it can (one rank "
        "per node), STRICT_* refuse anything else (a STRICT placement that cannot be met fails at "
        "train.placement_timeout_s).",
        json_schema_extra=layout(),
    )
    placement_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline for the learner ranks' placement group to be placed; past it the error names "
        "the resources missing and what to change.",
        json_schema_extra=layout(),
    )
    dist_timeout_s: float = Field(
        600.0, gt=0,
        description="Deadline for torch.distributed set-up and each collective, and for a learner rank's "
        "step: a rank that dies or hangs fails the step within it, naming the rank.",
        json_schema_extra=layout(),
    )
    checkpoint_every: int = Field(1, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    validate_every: int = Field(0, ge=0, description="Validation every N steps (0 = only at the end).")
    validation_questions: int = Field(8, ge=1, description="Validation questions per check.")
    environments: list[PoolEnvConfig] = Field(
        default_factory=list,
        description="The training pool of environment LLMs, each with a sampling `weight` (empty = the one "
        "`environment`, a pool of one). Names must be unique; evaluation reports environments outside "
        "the pool as held out.",
        json_schema_extra=when_set(),
    )

    @model_validator(mode="after")
    def _check_chunks_and_packing(self) -> "TrainConfig":
        """FSDP gathers the embeddings and the output layer inside the model's own forward, which
        the chunked and packed paths go around (they call the decoder and the output layer
        apart); a packed row is not one sequence, which Dr.GRPO's per-sequence sum assumes."""
        for key in ("logits_chunk_tokens", "pack_tokens"):
            if getattr(self, key) and self.strategy == "fsdp":
                raise ValueError(f"train.{key} {getattr(self, key)} does not work with train.strategy fsdp: "
                                 f"set train.{key} to 0 or use strategy ddp")
        if self.pack_tokens and self.loss_agg != "token-mean":
            raise ValueError(f"train.pack_tokens {self.pack_tokens} needs train.loss_agg token-mean (a packed row "
                             f"holds several trajectories, and {self.loss_agg} sums each row as one): set "
                             "train.pack_tokens to 0 or train.loss_agg to token-mean")
        return self

    @field_validator("environments")
    @classmethod
    def _check_pool(cls, pool: list[PoolEnvConfig]) -> list[PoolEnvConfig]:
        """Names key trajectories and metrics, so they are unique; the draw adds the weights up, so their sum is finite."""
        names = [env.name for env in pool]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"environment name(s) {repeated} appear more than once in the pool; give each a "
                             "unique `name` (it keys trajectories, metrics and the held-out report)")
        if not math.isfinite(sum(env.weight for env in pool)):
            raise ValueError(f"the pool's weights {[env.weight for env in pool]} add up to more than a float holds, "
                             "so every question would draw the last environment; weights are relative: use e.g. 1 and 3")
        return pool

