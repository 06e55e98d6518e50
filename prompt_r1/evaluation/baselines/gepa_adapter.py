"""GEPA (Agrawal et al., reflective prompt evolution) through the `gepa` package's core.

The package drives the search (Pareto candidate selection, minibatch reflection); this adapter
answers its two questions with the project's environment client, no litellm: `evaluate` sends
each question with the candidate instruction through the shared `Budget`, and the reflection LM
is the optimiser environment. GEPA is synchronous, so it runs in a worker thread and submits
each environment call to the evaluation's event loop (the async clients belong to it).

Candidates are scored on the full training set as GEPA's validation set; every such full
evaluation is recorded here too, so when the budget ends mid-search (a `BudgetExhausted`
raised inside GEPA) the best fully scored instruction is still known.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prompt_r1.evaluation.baselines.base import (
    CALL_DEADLINE_S, SEED_INSTRUCTION, Budget, BudgetExhausted, Optimised, baseline_prompt, blocking_caller,
)
from prompt_r1.config.experiment import BaselinesConfig

COMPONENT = "instruction"


class ProjectAdapter:
    """`gepa.GEPAAdapter` over the project's environment: data instances are QuestionRows."""

    def __init__(self, env, budget: Budget, loop: asyncio.AbstractEventLoop, full: list):
        self.env, self.budget, self.loop = env, budget, loop
        self.full_ids = [q.question_id for q in full]
        self.scored: dict[str, float] = {}  # instruction -> mean over the full training set
        self.propose_new_texts = None

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=CALL_DEADLINE_S)

    def evaluate(self, batch, candidate: dict[str, str], capture_traces: bool = False):
        from gepa import EvaluationBatch

        from prompt_r1.evaluation.answers import extract_cot_answer
        from prompt_r1.evaluation.scoring import primary_scores

        instruction = candidate[COMPONENT]
        if self.budget.left() < len(batch):
            raise BudgetExhausted(f"{self.budget.left()} calls left, {len(batch)} needed")

        async def go():
            return await asyncio.gather(*[self.budget.call(
                self.env, [{"role": "user", "content": baseline_prompt(q.question, instruction)}]) for q in batch])

        replies = self._run(go())
        scores_by = primary_scores([extract_cot_answer(r.text) for r in replies], batch)
        # a failed call, or a failed LLM judgement (None), has no score: GEPA needs a number for it, but
        # such a batch never counts as the candidate's training score
        errors = [r.call.error or (None if s is not None else "the judge's verdict gave no score")
                  for r, s in zip(replies, scores_by)]
        scores = [0.0 if bad else scores_by[i] for i, bad in enumerate(errors)]
        if [q.question_id for q in batch] == self.full_ids and not any(errors):
            self.scored[instruction] = sum(scores) / len(scores)
        traces = [{"question": q.question, "golds": q.golds, "reply": r.text, "score": s,
                   "error": e} for q, r, s, e in zip(batch, replies, scores, errors)] if capture_traces else None
        return EvaluationBatch(outputs=[r.text for r in replies], scores=scores, trajectories=traces)

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        records = [{"Inputs": {"question": t["question"]}, "Generated Outputs": t["reply"],
                    "Feedback": (f"error: {t['error']}" if t["error"] else
                                 f"score {t['score']:.2f}; correct answer: {' | '.join(t['golds'])}")}
                   for t in eval_batch.trajectories or []]
        return {c: records for c in components_to_update}


def reflection_lm(env, budget: Budget, loop):
    """GEPA's reflection LM: one optimiser-environment call per prompt, charged to the budget."""

    send = blocking_caller(env, budget, loop)

    def call(prompt: str | list[dict[str, Any]]) -> str:
        reply = send(prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}])
        return reply.text if reply.call.error is None else ""

    return call


async def optimise(env, optimizer_env, questions, cfg: BaselinesConfig, budget: Budget) -> Optimised:
    """Run GEPA within the budget; returns the best instruction scored on every training question."""
    import gepa

    loop = asyncio.get_running_loop()
    adapter = ProjectAdapter(env, budget, loop, questions)

    def run():
        try:
            gepa.optimize(seed_candidate={COMPONENT: SEED_INSTRUCTION}, trainset=questions, valset=questions,
                          adapter=adapter, reflection_lm=reflection_lm(optimizer_env, budget, loop),
                          reflection_minibatch_size=min(cfg.minibatch, len(questions)),
                          max_metric_calls=cfg.max_env_calls, seed=0, display_progress_bar=False)
        except BudgetExhausted:
            pass  # the budget ended the search; the fully scored candidates are in adapter.scored

    await asyncio.to_thread(run)
    history = [{"instruction": i, "train_score": s} for i, s in adapter.scored.items()]
    best = max(adapter.scored.items(), key=lambda kv: kv[1], default=None)
    return Optimised("gepa", best[0] if best else SEED_INSTRUCTION, best[1] if best else None,
                     budget.spend(), history)
