"""TextGrad (Yuksekgonul et al., "automatic differentiation via text") through the `textgrad` package.

One instruction is a textgrad `Variable` with `requires_grad`; each step runs a minibatch of
training questions forward (question, then the instruction, as `cot`), scores every reply with
the project's metric in a `StringBasedFunction` (no LLM call), back-propagates textual gradients
and lets `TGD` rewrite the instruction. As in TextGrad's prompt-optimisation recipe, a new
instruction is kept only when its score on all training questions is not below the best so far.

Both engines are `ProjectEngine`s over the project's environment client (forward: the evaluated
environment; backward and optimiser: `eval.baselines.optimizer`), so every call goes through the
shared `Budget`; litellm is never called. `textgrad` imports litellm at import time only to
register an engine this module never uses: when litellm is absent (setup installs textgrad without
its dependencies, which would downgrade openai and huggingface-hub) a stub that refuses every call
stands in for it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import types

from prompt_r1.evaluation.baselines.base import (
    SEED_INSTRUCTION, BaselineError, Budget, BudgetExhausted, Optimised, Scored, blocking_caller,
    score_instruction,
)
from prompt_r1.config.experiment import BaselinesConfig

ROLE = "instruction appended to each question; the model must end its reply with 'Answer: <answer>'"


class StepFailed(RuntimeError):
    """An environment call of a TextGrad step failed; the step is dropped (not scored as 0)."""


def _import_textgrad():
    """`textgrad`, importable without litellm and writing its log file outside the work tree."""
    os.environ.setdefault("TEXTGRAD_LOG_DIR", os.path.join(tempfile.gettempdir(), "textgrad-logs"))
    try:
        import litellm  # noqa: F401
    except ImportError:
        stub = types.ModuleType("litellm")

        def refuse(*_, **__):
            raise BaselineError("litellm is not used by prompt-r1: TextGrad runs on the project's environments")

        stub.completion = refuse
        sys.modules["litellm"] = stub
    try:
        import textgrad
    except ImportError as e:
        raise BaselineError(f"the `textgrad` method needs the textgrad package ({e}); run scripts/setup.sh "
                            "or `.venv/bin/pip install --no-deps textgrad diskcache tenacity`") from None
    return textgrad


def make_engine(tg, env, budget: Budget, loop: asyncio.AbstractEventLoop, use_system: bool):
    """A `textgrad.EngineLM` whose calls are `env.reply` through `budget` (from a worker thread).

    The forward engine drops TextGrad's system prompt (`use_system=False`) so a training reply
    sees exactly the message the evaluation sends.
    """
    call = blocking_caller(env, budget, loop)

    class ProjectEngine(tg.EngineLM):
        model_string = f"prompt-r1:{env.cfg.name}"

        def generate(self, prompt, system_prompt=None, **kwargs):
            if not isinstance(prompt, str):
                raise BaselineError("TextGrad baseline: multimodal prompts are not supported")
            messages = [{"role": "user", "content": prompt}]
            if use_system and system_prompt:
                messages.insert(0, {"role": "system", "content": system_prompt})
            reply = call(messages)
            if reply.call.error is not None:
                raise StepFailed(f"environment {env.cfg.name}: {reply.call.error}")
            return reply.text

        def __call__(self, prompt, **kwargs):
            return self.generate(prompt, **kwargs)

    return ProjectEngine()


def step_calls(minibatch: int, questions: int) -> int:
    """Environment calls of one step: per minibatch question a forward call and two backward calls
    (the score's feedback, then the reply's), one optimiser call, then scoring on every question.

    >>> step_calls(2, 4)
    11
    """
    return 3 * minibatch + 1 + questions


def _feedback(q, reply: str) -> str:
    """TextGrad's loss text for one reply: its score under the question's rule, the extracted and the
    correct answer. A failed LLM judgement says so (no score, never a 0); the judge's `max_error_rate`
    is checked where candidates are scored (`score_instruction`), over the whole batch."""
    from prompt_r1.data.judge import JudgeFailure
    from prompt_r1.data.scorers import score_question
    from prompt_r1.evaluation.answers import extract_cot_answer
    from prompt_r1.evaluation.scoring import primary_scores

    pred = extract_cot_answer(reply)
    try:
        score = score_question(q, pred).score if q.scorer else primary_scores([pred], [q])[0]
    except JudgeFailure:
        score = None
    shown = "none (the judge's verdict gave no score)" if score is None else f"{score:.2f} (1 = correct)"
    return f"score {shown}; extracted answer: {pred!r}; correct answer: {' | '.join(q.golds)}"


async def optimise(env, optimizer_env, questions, cfg: BaselinesConfig, budget: Budget) -> Optimised:
    """Run TextGrad until the budget or `cfg.steps` runs out; returns the best scored instruction."""
    tg = _import_textgrad()
    from textgrad.autograd import LLMCall, StringBasedFunction

    loop = asyncio.get_running_loop()
    forward = make_engine(tg, env, budget, loop, use_system=False)
    backward = make_engine(tg, optimizer_env, budget, loop, use_system=True)
    instruction = tg.Variable(SEED_INSTRUCTION, requires_grad=True, role_description=ROLE)
    optimizer = tg.TGD(parameters=[instruction], engine=backward)

    scorer = (lambda q: StringBasedFunction(
        lambda response, golds: _feedback(q, response.value),
        "scores the reply's final 'Answer:' line against the correct answer"))
    m = min(cfg.minibatch, len(questions))

    def step(k: int) -> None:
        optimizer.zero_grad()
        losses = []
        for i in range(m):
            q = questions[(k * m + i) % len(questions)]
            prompt = tg.Variable(q.question + "\n", requires_grad=False, role_description="question") + instruction
            reply = LLMCall(forward)(prompt, response_role_description="reply to the question")
            golds = tg.Variable("\n".join(q.golds), requires_grad=False, role_description="correct answers")
            losses.append(scorer(q)(inputs={"response": reply, "golds": golds}))
        tg.sum(losses).backward(backward)
        optimizer.step()

    history: list[dict] = []
    best: Scored | None = None
    try:
        best = await score_instruction(env, budget, questions, SEED_INSTRUCTION)
        history.append({"step": 0, "instruction": SEED_INSTRUCTION, "train_score": best.score if best else None})
        for k in range(cfg.steps):
            if budget.left() < step_calls(m, len(questions)):  # a step it could not score would waste calls
                break
            before = instruction.value
            try:
                await asyncio.to_thread(step, k)
            except (StepFailed, IndexError) as e:  # IndexError: TGD found no <IMPROVED_VARIABLE> tags
                instruction.set_value(before)
                history.append({"step": k + 1, "instruction": None, "train_score": None, "error": str(e)[:300]})
                continue
            new = instruction.value
            scored = await score_instruction(env, budget, questions, new) if new != before else None
            history.append({"step": k + 1, "instruction": new, "train_score": scored.score if scored else None})
            if scored is not None and (best is None or scored.score >= best.score):
                best = scored
            else:  # keep optimising from the best instruction, as TextGrad's recipe does
                instruction.set_value(best.instruction if best else before)
    except BudgetExhausted:
        pass
    return Optimised("textgrad", best.instruction if best else SEED_INSTRUCTION,
                     best.score if best else None, budget.spend(), history)
