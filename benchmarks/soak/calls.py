"""The soak's first call: every training question's group holds a member that asks the environment.

The tiny warm-started agent (`tiny-protocol`) seldom writes an interaction turn (in the hour of
2026-11-28, 26 environment calls in 156 trajectories), so the environment's faults had almost
nothing to hit. The soak therefore uses the project's own guided exploration
(`rollout.scaffold`, `prompt_r1.rollout.scaffold`): `pass_question_on` writes the first agent turn
of all but one member of every training group, which passes the question on to the environment;
the call itself is real (through the fault proxy to the vLLM server), everything after it is
sampled on-policy, and a failed call ends its trajectory as any other. The other member samples
its first turn, so GRPO still sees the policy's own choice. A question whose own text names one
of its gold answers ("What is 144 divided by 12?", gold 12) may not be passed on (a scaffold never
says a gold answer, `scaffold_turn`): its call asks for the method instead, without the numbers.
"""

from __future__ import annotations

from typing import Any

TURN = "<think>I ask the large language model.</think><interaction_prompt>{question}</interaction_prompt>"
METHOD = "How do I work out the answer to a question like this one, step by step?"


def pass_question_on(question: Any) -> str:
    """The scaffold turn (`rollout.scaffold.fn: benchmarks.soak.calls:pass_question_on`): the question
    itself as the interaction prompt, or `METHOD` when the question names one of its gold answers.

    >>> from types import SimpleNamespace
    >>> pass_question_on(SimpleNamespace(question=" Who wrote Hamlet? ", golds=["Shakespeare"]))
    '<think>I ask the large language model.</think><interaction_prompt>Who wrote Hamlet?</interaction_prompt>'
    >>> METHOD in pass_question_on(SimpleNamespace(question="What is 144 divided by 12?", golds=["12"]))
    True
    """
    from prompt_r1.core.metrics import mentions

    text = " ".join(question.question.split())
    return TURN.format(question=METHOD if mentions(text, question.golds) else text)


def scaffold_section(group_size: int) -> dict[str, Any]:
    """The config's `rollout.scaffold`: every member but one of each group starts with the call
    (the scaffold needs at least one sampled member, `RolloutConfig`).

    >>> scaffold_section(2)
    {'fn': 'benchmarks.soak.calls:pass_question_on', 'members': 1}
    """
    if group_size < 2:
        raise ValueError(f"the soak's scaffold needs groups of at least 2 (rollout.group_size is {group_size})")
    return {"fn": f"{__name__}:{pass_question_on.__name__}", "members": group_size - 1}
