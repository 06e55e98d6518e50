"""OPRO (Yang et al., "Large Language Models as Optimizers"): an optimiser LLM reads the scored
history of instructions, worst to best, and proposes new ones; each is scored on the training
questions; the best scored instruction wins.

There is no official package (the PyPI name `opro` is something else), so the loop lives here.
The optimiser is an environment (`eval.baselines.optimizer`, default: the evaluated one), and
its calls count against the same budget as the scoring calls.
"""

from __future__ import annotations

import re

from prompt_r1.evaluation.baselines.base import (
    SEED_INSTRUCTION, Budget, BudgetExhausted, Optimised, Scored, score_instruction,
)
from prompt_r1.config.experiment import BaselinesConfig

_INS = re.compile(r"<INS>(.*?)</INS>", re.S)


def meta_prompt(history: list[Scored], examples: list[tuple[str, str]], keep: int) -> str:
    """The optimiser's prompt: the best `keep` instructions in ascending score, a few training
    examples, and the request for a new instruction between <INS> tags.

    >>> h = [Scored("b", 0.5, [], []), Scored("a", 0.2, [], [])]
    >>> p = meta_prompt(h, [("Q?", "A")], keep=5)
    >>> p.index("text: a") < p.index("text: b"), "score: 50" in p, "<INS>" in p
    (True, True, True)
    """
    best = sorted(history, key=lambda s: s.score)[-keep:]
    lines = ["Your task is to write an instruction that makes a language model answer questions correctly.",
             "Below are earlier instructions with their scores (0-100), worst first.", ""]
    for s in best:
        lines += [f"text: {s.instruction}", f"score: {round(s.score * 100)}", ""]
    lines.append("The instruction is appended to each question, like these (expected answer after A:):")
    for q, a in examples:
        lines.append(f"Q: {q}\nA: {a}")
    lines += ["", "Write a new instruction that differs from the earlier ones and scores higher. The model "
              "must still end its reply with a line 'Answer: <answer>'. Write the instruction between "
              "<INS> and </INS>."]
    return "\n".join(lines)


def parse_instruction(reply: str) -> str | None:
    """The proposed instruction (None when the reply has none).

    >>> parse_instruction("Sure. <INS> Think, then answer. </INS>")
    'Think, then answer.'
    >>> parse_instruction("no tags") is None
    True
    """
    found = [m.strip() for m in _INS.findall(reply) if m.strip()]
    return found[-1] if found else None


async def optimise(env, optimizer_env, questions, cfg: BaselinesConfig, budget: Budget) -> Optimised:
    """Run OPRO until the budget or `cfg.steps` runs out; returns the best scored instruction."""
    history: list[Scored] = []
    log: list[dict] = []
    examples = [(q.question, q.golds[0] if q.golds else "") for q in questions[:3]]
    try:
        seed = await score_instruction(env, budget, questions, SEED_INSTRUCTION)
        if seed is not None:
            history.append(seed)
            log.append({"step": 0, "instruction": seed.instruction, "train_score": seed.score})
        for step in range(1, cfg.steps + 1):
            for _ in range(cfg.candidates_per_step):
                if budget.left() < 1 + len(questions):  # a proposal it could not score would waste a call
                    raise BudgetExhausted("no room for a proposal and its scoring")
                reply = await budget.call(optimizer_env, [{"role": "user", "content":
                                                          meta_prompt(history, examples, cfg.history)}])
                proposal = parse_instruction(reply.text) if reply.call.error is None else None
                if proposal is None or any(proposal == s.instruction for s in history):
                    log.append({"step": step, "instruction": proposal, "train_score": None})
                    continue
                scored = await score_instruction(env, budget, questions, proposal)
                log.append({"step": step, "instruction": proposal,
                            "train_score": scored.score if scored else None})
                if scored is not None:
                    history.append(scored)
    except BudgetExhausted:
        pass
    best = max(history, key=lambda s: s.score, default=None)
    return Optimised("opro", best.instruction if best else SEED_INSTRUCTION,
                     best.score if best else None, budget.spend(), log)
