"""Each evaluation method's one rule for its prediction, and the instructions that ask for it.

Kept apart from `evaluate` because the baselines (`prompt_r1.evaluation.baselines`) score their
candidate instructions with the same `cot` rule while `evaluate` runs the baselines.
"""

from __future__ import annotations

import re

from prompt_r1.core.protocol import extract_answer, parse_turn

COT_SUFFIX = (
    "\nThink step by step. Then write the final answer on the last line as "
    "'Answer: <your answer>'."
)
AGENT_ONLY_SUFFIX = "\nAnswer the question directly. Write the final answer as <answer>...</answer>."
_ANSWER_LINE = re.compile(r"answer\s*:\s*(.+)", re.I)


def extract_cot_answer(reply: str) -> str:
    """Prediction of the `cot` method.

    >>> extract_cot_answer("2+2 is four.\\nAnswer: 4")
    '4'
    >>> extract_cot_answer("Some thoughts\\n\\nParis\\n")
    'Paris'
    """
    found = _ANSWER_LINE.findall(reply)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def extract_agent_only_answer(reply: str) -> str:
    """Prediction of the `agent_only` method.

    >>> extract_agent_only_answer("<think>x</think><answer> 7 </answer>")
    '7'
    >>> extract_agent_only_answer(" just 7 ")
    'just 7'
    """
    return extract_answer(reply) if parse_turn(reply).answer is not None else reply.strip()
