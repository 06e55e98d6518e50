"""A trained agent put to work: one question in, the agent's multi-turn episode and answer out.

`ask`, the OpenAI-compatible server and the MLflow model all answer through `answer_question`,
which runs the ordinary rollout (`rollout_batch`, one greedy trajectory by the evaluation
settings) so a served answer is exactly what evaluation would score.

Concurrent questions share generation batches through `BatchingPolicy`: every episode's
`policy.generate` call lands in one queue, and a single worker thread sends whatever is
waiting (after at most `window_s`) to the real policy as one batch. There is no lock per
request; a slow environment reply delays only its own episode.

`watch_environment` wraps an environment so a caller sees each interaction prompt and reply as
it happens (what `ask` prints) without touching the rollout loop.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prompt_r1.config.experiment import Config
from prompt_r1.env.base import cost_usd
from prompt_r1.config.env import EnvConfig
from prompt_r1.policy.base import Policy, Sample, per_row_limits
from prompt_r1.core.failures import UserError
from prompt_r1.core.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class _Job:
    prompts: list[list[int]]
    limits: list[int]
    seeds: Any  # one seed per row, or what the caller passed (None: the policy picks)
    future: concurrent.futures.Future


def merged_seeds(jobs: list[_Job]) -> list[int] | None:
    """The batch's per-row seeds when every caller gave its own (so a row's draws do not depend
    on its batch-mates), else None (the policy picks its own).

    >>> from concurrent.futures import Future
    >>> merged_seeds([_Job([[1]], [1], [7], Future()), _Job([[2], [3]], [1, 1], [8, 9], Future())])
    [7, 8, 9]
    >>> merged_seeds([_Job([[1]], [1], [7], Future()), _Job([[2]], [1], None, Future())]) is None
    True
    """
    if all(isinstance(job.seeds, (list, tuple)) for job in jobs):
        return [int(s) for job in jobs for s in job.seeds]
    return None


class BatchingPolicy(Policy):
    """A `Policy` whose concurrent `generate` calls are merged into shared batches of `inner`."""

    def __init__(self, inner: Policy, window_s: float = 0.01, max_rows: int = 64):
        self.inner, self.tokenizer = inner, inner.tokenizer
        self.deterministic = getattr(inner, "deterministic", False)
        self.window_s, self.max_rows = window_s, max_rows
        self.calls = 0            # batches sent to `inner`
        self.rows = 0             # rows in them
        self.max_jobs = 0         # most callers served by one batch
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._carry: _Job | None = None
        self._worker = threading.Thread(target=self._run, name="agent-batcher", daemon=True)
        self._worker.start()

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int],
                 seeds: Sequence[int] | None = None) -> list[Sample]:
        if not prompts:
            return []
        if not self._worker.is_alive():
            raise RuntimeError("the agent's batching worker has stopped (policy closed)")
        job = _Job([list(p) for p in prompts], per_row_limits(max_new_tokens, len(prompts)), seeds,
                   concurrent.futures.Future())
        self._queue.put(job)
        return job.future.result()

    def _collect(self, first: _Job) -> list[_Job]:
        """`first` plus whatever arrives within `window_s`, up to `max_rows` rows (at least one job)."""
        jobs, rows = [first], len(first.prompts)
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # keep the stop signal for the loop
                break
            if rows + len(job.prompts) > self.max_rows:
                self._carry = job      # first in the next batch
                break
            jobs.append(job)
            rows += len(job.prompts)
        return jobs

    def _run(self) -> None:
        while True:
            first, self._carry = (self._carry, None) if self._carry else (self._queue.get(), None)
            if first is None:
                return
            jobs = self._collect(first)
            prompts = [p for job in jobs for p in job.prompts]
            limits = [n for job in jobs for n in job.limits]
            try:
                samples = self.inner.generate(prompts, limits, merged_seeds(jobs))
            except BaseException as err:  # every waiting caller gets the failure, none hangs
                for job in jobs:
                    job.future.set_exception(err)
                continue
            self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
            self.max_jobs = max(self.max_jobs, len(jobs))
            start = 0
            for job in jobs:
                job.future.set_result(samples[start : start + len(job.prompts)])
                start += len(job.prompts)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.inner.load_weights(state_dict)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)
        self.inner.close()


class watch_environment:  # noqa: N801 - reads as a function at the call site
    """An environment that reports each call to `on_event(kind, text)` (`interaction`, `reply`)."""

    def __init__(self, env: Any, on_event: Callable[[str, str], None]):
        self.env, self.on_event = env, on_event
        self.name, self.model = env.name, env.model

    async def reply(self, messages: list[dict[str, str]], turn: int = 0):
        self.on_event("interaction", messages[-1]["content"] if messages else "")
        reply = await self.env.reply(messages, turn=turn)
        self.on_event("reply", reply.text)
        return reply


def env_failure(traj: Trajectory) -> str | None:
    """Why an environment call failed in this episode (None when all succeeded)."""
    errors = [c.error for c in traj.env_calls if c.error]
    return getattr(traj, "error", None) or (errors[0] if errors else None)


def episode_report(question: str, traj: Trajectory, env_cfg: EnvConfig, agent: str, latency_s: float,
                   tokens: bool = False) -> dict[str, Any]:
    """What a user sees of one episode: turns, environment calls, tokens and cost.

    Agent prompt tokens are the agent's chat prompt; agent completion tokens are the ones it
    sampled (environment text inserted into its context is not counted twice).
    """
    env_prompt = sum(c.prompt_tokens for c in traj.env_calls)
    env_completion = sum(c.completion_tokens for c in traj.env_calls)
    agent_completion = sum(traj.loss_mask)
    turns: list[dict[str, str]] = []
    for i, text in enumerate(traj.agent_turns):
        turns.append({"role": "agent", "text": text})
        if i < len(traj.env_replies):
            turns.append({"role": "environment", "text": traj.env_replies[i]})
    report = {
        "question": question, "question_id": traj.question_id, "agent": agent,
        "environment": env_cfg.name, "env_model": env_cfg.model, "answer": traj.answer,
        "stop_reason": traj.stop_reason, "error": env_failure(traj), "turns": turns,
        "env_calls": [vars(c) for c in traj.env_calls],
        "usage": {"agent_prompt_tokens": len(traj.prompt_ids), "agent_completion_tokens": agent_completion,
                  "env_prompt_tokens": env_prompt, "env_completion_tokens": env_completion,
                  "prompt_tokens": len(traj.prompt_ids) + env_prompt,
                  "completion_tokens": agent_completion + env_completion},
        "cost_usd": cost_usd(env_cfg, env_prompt, env_completion),
        "latency_s": round(latency_s, 4),
    }
    if tokens:
        report["trajectory"] = traj.to_record()
    return report


class QuestionError(UserError, ValueError):
    """A question that cannot be asked: no text, text that is not Unicode, or longer than the limit
    (`serve` answers HTTP 400 to the same)."""


class EmptyQuestion(QuestionError):
    """A question with no text: there is nothing to ask."""


def first_surrogate(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate in `text`, or None. Such a code point is not text: it
    comes from bytes that are not UTF-8 (Python keeps them as surrogates in `sys.argv`) or from a JSON
    escape like `\\ud800`, and cannot be encoded for the tokenizer, the environment or the terminal.

    >>> first_surrogate("ok"), first_surrogate("ab" + chr(0xDCFF))
    (None, 2)
    """
    return next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)


def check_question(question: str, max_chars: int | None = None) -> str:
    """`question`, or `QuestionError` when it is empty or only white space (`EmptyQuestion`), holds
    something that is not Unicode text, or is longer than `max_chars` (`data.max_question_chars`,
    the limit ingest and `serve` apply). Messages never echo the bad text, which may not print.

    >>> check_question(" ")
    Traceback (most recent call last):
    ...
    prompt_r1.serving.service.EmptyQuestion: the question is empty; ask something, e.g. "Who wrote Hamlet?"
    >>> check_question("Why?" * 6, max_chars=20)
    Traceback (most recent call last):
    ...
    prompt_r1.serving.service.QuestionError: the question has 24 characters; the limit is 20 (data.max_question_chars): shorten it or raise data.max_question_chars
    """
    if not isinstance(question, str) or not question.strip():
        raise EmptyQuestion('the question is empty; ask something, e.g. "Who wrote Hamlet?"')
    at = first_surrogate(question)
    if at is not None:
        raise QuestionError(f"the question is not valid UTF-8 text: character {at + 1} is {ascii(question[at])}, "
                            "a byte that is not UTF-8 (or a lone surrogate); pass the question as UTF-8")
    if max_chars is not None and len(question) > max_chars:
        raise QuestionError(f"the question has {len(question)} characters; the limit is {max_chars} "
                            "(data.max_question_chars): shorten it or raise data.max_question_chars")
    return question


def question_id(question: str) -> str:
    """A stable id for an ad-hoc question (its trajectory carries it).

    >>> question_id("What is 2+2?") == question_id("What is 2+2?"), len(question_id("x"))
    (True, 16)
    """
    import hashlib

    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


async def answer_question(policy: Policy, env: Any, question: str, cfg: Config,
                          max_turns: int | None = None, max_env_reply_tokens: int | None = None) -> Trajectory:
    """One greedy episode (the evaluation settings) of the agent on `question` against `env`.

    `max_turns` / `max_env_reply_tokens` can only tighten the config's limits.
    """
    from prompt_r1.evaluation.evaluate import eval_agent, eval_rollout
    from prompt_r1.rollout.episode import rollout_batch
    from prompt_r1.core.questions import QuestionRow

    check_question(question)
    agent_cfg, rollout_cfg = eval_agent(cfg), eval_rollout(cfg)
    if max_turns is not None:
        rollout_cfg = rollout_cfg.model_copy(update={"max_turns": min(max_turns, rollout_cfg.max_turns)})
    if max_env_reply_tokens is not None:
        agent_cfg = agent_cfg.model_copy(
            update={"max_env_reply_tokens": min(max_env_reply_tokens, agent_cfg.max_env_reply_tokens)})
    row = QuestionRow(question_id=question_id(question), dataset="adhoc", split="adhoc", question=question,
                      golds=[], task_family="standard_qa", primary_metric="f1")
    trajs = await rollout_batch(policy, env, [row], agent_cfg, rollout_cfg, cfg.reward, group_size=1, seed=cfg.seed)
    return trajs[0]


def config_environments(cfg: Config) -> dict[str, EnvConfig]:
    """Every environment a config names, by name: the training ones first (a pool's members, else
    `environment`), then `environment` and `eval.environments`; of two with one name, the first."""
    envs: dict[str, EnvConfig] = {}
    for env_cfg in [*cfg.training_environments(), cfg.environment, *cfg.eval.environments]:
        envs.setdefault(env_cfg.name, env_cfg)
    return envs


def pick_environment(cfg: Config, name: str | None) -> EnvConfig:
    """The config's environment called `name` (when None, the training environment: the first of a pool)."""
    envs = config_environments(cfg)
    if name is None:
        return cfg.training_environments()[0]
    if name not in envs:
        raise KeyError(f"no environment named {name!r} in config {cfg.name!r}; known: {', '.join(envs)}")
    return envs[name]
