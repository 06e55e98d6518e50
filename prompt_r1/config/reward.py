"""The `reward` section: the dual-constrained reward's weights, and its optional parts (what
environment calls cost, a task's per-turn reward, GDPO's per-part advantages).

A strict pydantic model whose fields carry their help (`description`), from which `docs/config.md`
is generated; `prompt_r1.config.experiment` puts it in the whole tree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from prompt_r1.config.base import StrictModel
from prompt_r1.config.identity import when_set
from prompt_r1.core.scorer import SPEC_PATTERN


class CostRewardConfig(StrictModel):
    """What environment calls cost in the reward (`reward.cost`); formulas in docs/training.md, "Cost-aware reward"."""

    mode: Literal["off", "bonus", "penalty"] = Field(
        "off",
        description="`off`: the reward is the dual-constrained one, unchanged. `bonus` (Router-R1): a right answer's "
        "total becomes total x (1 - alpha) + cheapness x alpha, cheapness = 1 - sqrt(cost) min-max scaled between "
        "percentiles of a rolling window of past trajectories' sqrt(cost). `penalty` (xRouter): at the format cap "
        "the answer score is multiplied by (penalty_keep - min(penalty_scale x cost, penalty_cap)). Cost = USD of "
        "the trajectory's successful environment calls at each environment's `price_per_1k_*`.",
    )
    alpha: float = Field(
        0.6, ge=0.0, le=1.0,
        description="`bonus`: weight of the cheapness in a right answer's reward (Router-R1's cost coefficient; "
        "it found a sharp knee between 0.6 and 0.7).",
    )
    correct_at: float = Field(
        1.0, gt=0.0, le=1.0,
        description="`bonus`: answer score (token F1) at or above which an answer counts as right and earns the "
        "bonus; 1.0 = exact match after normalisation, as Router-R1's exact-match reward.",
    )
    window: int = Field(
        1000, ge=1,
        description="`bonus`: trajectories in the rolling window of sqrt(cost) (Router-R1: 1000). The window is "
        "state of the training session, saved in each checkpoint, so `--resume` scales alike.",
    )
    low_percentile: float = Field(5.0, ge=0.0, lt=100.0, description="`bonus`: lower bound of the scale, a percentile of the window.")
    high_percentile: float = Field(95.0, gt=0.0, le=100.0, description="`bonus`: upper bound of the scale, a percentile of the window.")
    penalty_scale: float = Field(
        2.0, ge=0.0, description="`penalty`: USD-to-penalty factor lambda (xRouter's README: 2.0; its code: 3.0).",
    )
    penalty_cap: float = Field(
        0.6, ge=0.0, description="`penalty`: largest penalty, cost_max (xRouter's README: 0.6; its code: 0.8). At most "
        "`penalty_keep`: a larger cap makes the factor negative, so a right answer could score below a wrong one.",
    )
    penalty_keep: float = Field(
        1.0, gt=0.0, description="`penalty`: K, the factor at zero cost (xRouter: 1).",
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "CostRewardConfig":
        if self.low_percentile >= self.high_percentile:
            raise ValueError(f"reward.cost.low_percentile ({self.low_percentile}) must be below "
                             f"reward.cost.high_percentile ({self.high_percentile})")
        if self.penalty_cap > self.penalty_keep:
            raise ValueError(f"reward.cost.penalty_cap ({self.penalty_cap}) is above reward.cost.penalty_keep "
                             f"({self.penalty_keep}): the answer's factor keep - min(scale x cost, cap) would go "
                             "below 0 and a right answer score below a wrong one; lower penalty_cap to at most "
                             "penalty_keep")
        return self


class TurnRewardConfig(StrictModel):
    """Turn-level credit (`prompt_r1.core.turn_credit`): off while `scorer` is unset."""

    scorer: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path `package.module:function` (or `path/to/file.py:function`) of the task's turn "
        "scorer, called as "
        "`scorer(question, trajectory)` and returning one value per agent turn: None (not judged) or a number "
        "in [0, 1]. Before training it is called once per training question with an empty trajectory (it must "
        "return []), so a question it does not define stops the run at once. The two-hop task's: "
        "`prompt_r1.data.compositional:follow_up_turn_rewards` (the follow-up call) or "
        "`prompt_r1.data.first_call:two_hop_turn_rewards` (the first call too). Unset = no turn credit "
        "(the paper's GRPO).",
    )
    indicators: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path of the task's indicators, called as `indicators(question, trajectory)` and "
        "returning a dict of name -> True / False / None (None: not defined for this trajectory). Evaluation's "
        "turn table and each training step report each one's share. The two-hop task's: "
        "`prompt_r1.data.first_call:two_hop_indicators` (the first call asks the first hop; two leaks).",
        json_schema_extra=when_set(),
    )
    weight: float = Field(
        0.5, ge=0.0, le=100.0,
        description="c in A + c * A_t: how much of a turn's group-centred turn reward A_t is added to the "
        "advantage of that turn's tokens (at most 100: MT-GRPO uses 1). 0 = the turn rewards are computed and "
        "logged, not credited.",
    )


class RewardConfig(StrictModel):
    """Weights of the dual-constrained reward (the defaults are the reference's), and its optional cost part."""

    think_prompt_score: float = Field(
        0.4, description="Per non-final turn that is exactly `<think>..</think>`, optional white space, then "
        "`<interaction_prompt>..</interaction_prompt>` (one of each tag, nothing around it).",
    )
    nonblank_answer_score: float = Field(
        0.5, description="Final turn's first `<answer>` is non-blank after stripping (a blank or missing one earns 0).",
    )
    final_format_score: float = Field(
        0.1, description="Added to a non-blank answer when the final turn starts with `<think>..</think>` and "
        "ends with `</answer>`.",
    )
    format_cap: float = Field(1.0, description="Cap of the format score (epsilon); the answer F1 counts only at the cap.")
    cost: CostRewardConfig = Field(
        default_factory=CostRewardConfig, description="What environment calls cost in the reward (off by default).",
        json_schema_extra=when_set(by="mode"),
    )
    turn: TurnRewardConfig = Field(
        default_factory=TurnRewardConfig,
        description="A per-turn reward a task defines, credited to that turn's tokens (off by default).",
        json_schema_extra=when_set(by="scorer"),
    )
    normalize_parts: bool = Field(
        False,
        description="GDPO (arXiv 2601.05242): the advantage is the sum over the reward's parts (format, gated answer, "
        "cost) of each part's group-normalised advantage, instead of the advantage of their sum. False = GRPO's "
        "advantage of the total.",
        json_schema_extra=when_set(),
    )

    @property
    def turn_credit(self) -> bool:
        """A turn scorer is set and its weight moves the advantages."""
        return self.turn.scorer is not None and self.turn.weight > 0

    def format_weights(self) -> dict[str, float]:
        """The keyword arguments of `core.reward.compute_reward` (the dual-constrained reward's weights)."""
        return {"think_prompt_score": self.think_prompt_score, "nonblank_answer_score": self.nonblank_answer_score,
                "final_format_score": self.final_format_score, "format_cap": self.format_cap}
