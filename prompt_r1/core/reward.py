"""The dual-constrained reward of Prompt-R1 (format + answer), as a pure function.

Format first, correctness second: the answer score only counts once the format score
reaches its cap (epsilon), so an agent cannot collect answer reward without following the
protocol, and it cannot reach the cap without asking the environment at least once.
Only the agent's own messages are scored; environment replies never enter here.

Format: `think_prompt_score` per well-formed non-final turn (`is_interaction_turn`);
for the final turn, `nonblank_answer_score` when its first `<answer>` is non-blank after
stripping, plus `final_format_score` when the turn is also in full format (`is_answer_turn`).
A missing or blank answer adds nothing. The sum is capped at `format_cap`.
Answer: token F1 against the golds (the paper's), or the score of the dataset's own scorer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from prompt_r1.core.metrics import f1_score
from prompt_r1.core.protocol import extract_answer, is_answer_turn, is_interaction_turn

# Float sums of the weights (0.4 + 0.5 + 0.1) must open the gate as the exact cap would.
GATE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward's parts: `total` = -1 + format + answer (answer only at the format cap) + cost.

    `cost` is the part `reward.cost` adds (0.0 when it is off; `core.cost_reward`); records written
    before it existed lack the key and read as 0.0."""

    format: float
    answer: float
    total: float
    cost: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def parts(self, format_cap: float) -> tuple[float, float, float]:
        """(format, answer as it counts: 0 below the format cap, cost); total = -1 + their sum.

        >>> RewardBreakdown(format=0.4, answer=0.7, total=-0.6).parts(format_cap=1.0)
        (0.4, 0.0, 0.0)
        """
        gated = self.answer if self.format >= format_cap - GATE_TOLERANCE else 0.0
        return self.format, gated, self.cost


def format_score(
    agent_turns: Sequence[str],
    think_prompt_score: float = 0.4,
    nonblank_answer_score: float = 0.5,
    final_format_score: float = 0.1,
    format_cap: float = 1.0,
) -> float:
    """Format part of the reward (reference semantics); equals `format_cap` exactly at the cap.

    >>> ask = "<think>t</think><interaction_prompt>p</interaction_prompt>"
    >>> format_score([ask, "<think>t</think>\\nFinal answer: <answer>42</answer>"])
    1.0
    >>> format_score(["<think>t</think><answer>42</answer>"])  # never asked: cannot reach the cap
    0.6
    >>> format_score([ask, "<think>t</think><answer>  </answer>"])  # blank answer earns nothing
    0.4
    >>> format_score([" " + ask, "<answer>42</answer>"])  # leading space; final turn lacks think
    0.5
    """
    if not agent_turns:
        return 0.0
    score = sum((think_prompt_score for turn in agent_turns[:-1] if is_interaction_turn(turn)), 0.0)
    final = agent_turns[-1]
    if extract_answer(final):
        score += nonblank_answer_score
        if is_answer_turn(final):
            score += final_format_score
    return format_cap if score >= format_cap - GATE_TOLERANCE else score


def compute_reward(
    agent_turns: Sequence[str],
    golds: Sequence[str],
    think_prompt_score: float = 0.4,
    nonblank_answer_score: float = 0.5,
    final_format_score: float = 0.1,
    format_cap: float = 1.0,
    answer_score: Callable[[str], float] | None = None,
) -> RewardBreakdown:
    """Reward of one trajectory from the agent's messages (last = final turn) and gold answers.

    `answer` is the max token-F1 of the final turn's first answer (stripped) against the golds, or
    `answer_score(answer)` when the question's dataset brings its own scorer (`core.scorer`: a
    number in [0, 1]; the format gate stays the paper's); `total` is `-1 + format + answer` when
    format reaches the cap, else `-1 + format`.

    >>> ask = "<think>t</think><interaction_prompt>q</interaction_prompt>"
    >>> compute_reward([ask, "<think>t</think>\\nFinal answer: <answer>Paris</answer>"], ["Paris"])
    RewardBreakdown(format=1.0, answer=1.0, total=1.0, cost=0.0)
    >>> compute_reward([ask, "<think>t</think><answer>  </answer>"], ["Paris"])
    RewardBreakdown(format=0.4, answer=0.0, total=-0.6, cost=0.0)
    >>> compute_reward(["<think>t</think><answer>Paris</answer>"], ["Paris"]).total
    -0.4
    >>> compute_reward([ask, "<think>t</think><answer>paris</answer>"], ["Paris"], answer_score=lambda a: 0.25)
    RewardBreakdown(format=1.0, answer=0.25, total=0.25, cost=0.0)
    """
    fmt = format_score(
        agent_turns,
        think_prompt_score=think_prompt_score,
        nonblank_answer_score=nonblank_answer_score,
        final_format_score=final_format_score,
        format_cap=format_cap,
    )
    if not agent_turns:
        answer = 0.0
    elif answer_score is not None:
        answer = float(answer_score(extract_answer(agent_turns[-1])))
    else:
        answer = f1_score(extract_answer(agent_turns[-1]), golds)
    total = -1.0 + fmt + answer if fmt == format_cap else -1.0 + fmt
    return RewardBreakdown(format=fmt, answer=answer, total=total)
