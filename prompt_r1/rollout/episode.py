"""The multi-turn Prompt-R1 rollout: agent turns from a `Policy`, replies from an `Environment`.

One call samples `group_size` trajectories per question. Each trajectory is the agent prompt
(chat template, tokenised once) followed by a response built token-in/token-out:
- agent turns: the ids the policy sampled, loss mask 1, with their sampling log-probs;
- environment replies: `wrap_env_reply(reply)` tokenised and inserted with mask 0, log-prob 0.0
  (the reply is first cut to `max_env_reply_tokens` tokens; `env_replies` holds the cut text, so
  decoding each mask-0 span gives back exactly `wrap_env_reply(env_replies[i])`). A reply is text:
  special tokens written in it (`<|im_end|>`...) are tokenised as plain text, never as the
  control ids of the agent's chat template, and protocol tags written in it
  (`</interaction_response>`, `<answer>`...) are made inert by `wrap_env_reply`, so the reply
  can neither end its wrapper nor read as the agent's own turn. `env_replies` keeps the text as
  the environment wrote it (cut).
`rollout.max_turns` counts agent generations: at most `max_turns - 1` environment calls, each
followed by another agent turn. Stop reasons: `answered` (agent wrote `<answer>`), `invalid_turn`
(neither tag), `max_turns` (an interaction prompt in generation `max_turns`, whose reply the agent
could never read: the call is not made), `env_error` (an environment call failed after the
client's retries: the trajectory ends there with `error` set and no reward; the error text is
never put into the agent's context), `token_budget` (no room left:
the response never exceeds `max_response_tokens`; a reply that would leave no room for another
agent token is not inserted, though its call is still recorded in `env_calls`).
Environments: `env` is one environment or a training pool of them; each question draws one
(`core.seeding.draw_environment`, with `env_weights`) and its whole group prompts it, recorded in
`Trajectory.env_name`. Under `agent.describe_environment` the agent's prompt ends with that
environment's one-line description (`EnvConfig.prompt_description`).
The answer and the reward come from the agent's own turns only. Scoring is its own stage,
`reward_stage.RewardStage`, which a caller may run apart from the rollout (`score=False`).
Training rollouts may start some members of each group from a task's scaffold turn
(`scaffold`, `rollout.scaffold`): that first turn is written, not sampled, and the rest is sampled
as always, except the later turns a `follow_up` scaffold writes for those members after a reply.

Scheduling: every agent generation is one batched `policy.generate` call run in a worker thread,
so environment calls (asyncio tasks, all in flight at once) progress while the policy computes.
When no trajectory is waiting for the policy, the loop waits for the first environment reply, then
at most `gather_window_s` more for others, and generates for all of those at once. A slow reply
thus delays only its own trajectory; the price is possibly several smaller generation batches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prompt_r1.config.env import env_prices
from prompt_r1.config.experiment import AgentConfig, RewardConfig, RolloutConfig
from prompt_r1.env.base import error_text, short_reason
from prompt_r1.policy.base import Policy, Sample
from prompt_r1.core.protocol import env_messages, extract_answer, parse_turn, wrap_env_reply
from prompt_r1.core.seeding import NO_STEP, draw_environment, draw_seed
from prompt_r1.core.tokens import agent_prompt_ids, text_ids
from prompt_r1.core.trajectory import EnvCall, Trajectory
from prompt_r1.core.questions import QuestionRow
from prompt_r1.rollout.progress import RolloutProgress
from prompt_r1.rollout.reward_stage import RewardStage
from prompt_r1.rollout.scaffold import FollowUpScaffold, Scaffold, follow_up_turn, scaffold_turn, scaffolded_members

if TYPE_CHECKING:
    from prompt_r1.env.base import Environment

log = logging.getLogger(__name__)


@dataclass
class _Episode:
    """A trajectory being built, plus what the loop needs to continue it."""

    trajectory: Trajectory
    env: "Environment"                                     # the one its question drew
    env_prompts: list[str] = field(default_factory=list)   # interaction prompts sent so far
    env_history: list[str] = field(default_factory=list)   # the environment's full replies


async def _call_env(env: "Environment", messages: list[dict[str, str]], turn: int) -> tuple[str, EnvCall]:
    """One environment call that never raises: a failure becomes an error text and EnvCall.error."""
    started, wall = time.perf_counter(), time.time()
    try:
        reply = await env.reply(messages, turn=turn)
        text, call = reply.text, reply.call
    except Exception as err:  # the env contract says it never raises; keep the batch alive anyway
        log.warning("environment %s raised on turn %d: %r", getattr(env, "name", "?"), turn, err)
        reason = short_reason(f"{type(err).__name__}: {err}")
        text = error_text(reason)
        call = EnvCall(turn=turn, env_name=getattr(env, "name", ""), model=getattr(env, "model", ""),
                       latency_s=time.perf_counter() - started, error=reason)
    call.turn = turn
    call.started_at = wall
    call.env_name = call.env_name or getattr(env, "name", "")
    call.model = call.model or getattr(env, "model", "")
    return text, call


class _Loop:
    """State shared by the steps of one `rollout_batch` call."""

    def __init__(self, policy: Policy, agent_cfg: AgentConfig, rollout_cfg: RolloutConfig):
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.agent_cfg, self.rollout_cfg = agent_cfg, rollout_cfg
        self.progress: RolloutProgress | None = None  # advanced once per finished trajectory

    def room(self, episode: _Episode) -> int:
        return self.agent_cfg.max_response_tokens - len(episode.trajectory.token_ids)

    def absorb_turn(self, episode: _Episode, sample: Sample) -> list[dict[str, str]] | None:
        """Append an agent turn; returns the environment messages to send, or None when finished."""
        traj = episode.trajectory
        if len(sample.token_ids) != len(sample.logprobs):
            raise RuntimeError(f"policy returned {len(sample.token_ids)} ids but {len(sample.logprobs)} log-probs")
        traj.token_ids.extend(sample.token_ids)
        traj.loss_mask.extend([1] * len(sample.token_ids))
        traj.logprobs.extend(float(lp) for lp in sample.logprobs)
        traj.agent_turns.append(sample.text)
        turn = parse_turn(sample.text)
        if turn.kind == "answer":
            traj.stop_reason = "answered"
        elif turn.kind == "interaction":
            if len(traj.agent_turns) >= self.rollout_cfg.max_turns:
                traj.stop_reason = "max_turns"
            elif self.room(episode) <= 0:
                traj.stop_reason = "token_budget"
            else:
                prompt = turn.interaction_prompt or ""
                messages = env_messages(episode.env_prompts + [prompt], episode.env_history)
                episode.env_prompts.append(prompt)
                return messages
        elif sample.finish_reason == "length" and self.room(episode) <= 0:
            traj.stop_reason = "token_budget"
        else:
            traj.stop_reason = "invalid_turn"
        return None

    def episodes(self, envs: Sequence["Environment"], weights: Sequence[float], questions: Sequence[QuestionRow],
                 group: int, seed: int, step: int) -> list[_Episode]:
        """`group` new episodes per question, in order, each question's drawn environment (`draw_environment`)."""
        episodes: list[_Episode] = []
        for question in questions:
            drawn = envs[draw_environment(seed, step, question.question_id, weights)]
            described = _description(drawn) if self.agent_cfg.describe_environment else None
            prompt_ids = agent_prompt_ids(self.tokenizer, question.question, described)
            name = getattr(drawn, "name", "")
            for index in range(group):
                episodes.append(_Episode(Trajectory(question.question_id, index, list(prompt_ids), env_name=name),
                                         drawn))
        return episodes

    async def drive(self, episodes: list[_Episode], questions: Sequence[QuestionRow], group: int, seed: int,
                    step: int, gather_window_s: float, scaffold: Scaffold | None,
                    follow_up: FollowUpScaffold | None = None) -> None:
        """Run every episode to its end: batched generations for those waiting on the policy, the
        environment calls of the others in flight meanwhile (see the module docstring)."""
        ready: list[_Episode] = list(episodes)
        pending: dict[asyncio.Task, _Episode] = {}
        by_id = {q.question_id: q for q in questions}
        try:
            if scaffold is not None:  # those members' first turns are written: their calls start at once
                members = set(scaffolded_members(group, self.rollout_cfg.scaffold.members))
                for episode in [e for e in ready if e.trajectory.group_index in members]:
                    ready.remove(episode)
                    self._send(pending, episode, self.absorb_scaffold(
                        episode, scaffold_turn(scaffold, by_id[episode.trajectory.question_id])))
            while ready or pending:
                if not ready:
                    ready = await self._replies(pending, gather_window_s)
                    if follow_up is not None:
                        ready = self._follow_ups(ready, pending, follow_up, by_id)
                    continue
                batch, ready = ready, []
                limits = [min(self.agent_cfg.max_new_tokens, self.room(e)) for e in batch]
                seeds = [draw_seed(seed, step, e.trajectory.question_id, e.trajectory.group_index,
                                   len(e.trajectory.agent_turns)) for e in batch]
                began = time.time()
                samples = await asyncio.to_thread(
                    self.policy.generate, [e.trajectory.prompt_ids + e.trajectory.token_ids for e in batch], limits,
                    seeds)
                ended = time.time()
                for episode, sample in zip(batch, samples, strict=True):
                    episode.trajectory.turn_times.append([began, ended])
                    self._send(pending, episode, self.absorb_turn(episode, sample))
        finally:
            for task in pending:
                task.cancel()

    def _send(self, pending: dict[asyncio.Task, _Episode], episode: _Episode,
              messages: list[dict[str, str]] | None) -> None:
        """Start the environment call of an agent turn that asked one (None: the episode ended)."""
        if messages is None:
            self._finished()
            return
        turn = len(episode.env_prompts) - 1
        pending[asyncio.create_task(_call_env(episode.env, messages, turn))] = episode

    def _follow_ups(self, ready: list[_Episode], pending: dict[asyncio.Task, _Episode],
                    follow_up: FollowUpScaffold, by_id: dict[str, QuestionRow]) -> list[_Episode]:
        """Let `follow_up` write the next turn of each scaffolded episode that just got a reply (its call
        starts at once); returns the episodes left for the policy."""
        left = []
        for episode in ready:
            traj = episode.trajectory
            text = follow_up_turn(follow_up, by_id[traj.question_id], traj.env_replies) if traj.scaffold_turns else None
            if text is None or len(text_ids(self.tokenizer, text)) > self.room(episode):
                left.append(episode)   # the policy writes this turn (also when the written one would not fit)
            else:
                self._send(pending, episode, self.absorb_scaffold(episode, text))
        return left

    def _finished(self) -> None:
        if self.progress is not None:
            self.progress.advance()

    async def _replies(self, pending: dict[asyncio.Task, _Episode], gather_window_s: float) -> list[_Episode]:
        """Wait for the first environment reply, then at most `gather_window_s` more for others;
        returns the episodes that can go on."""
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        waiting = set(pending) - done
        if waiting and gather_window_s > 0:
            more, _ = await asyncio.wait(waiting, timeout=gather_window_s)
            done |= more
        ready = []
        for task in done:
            episode = pending.pop(task)
            text, call = task.result()
            if self.absorb_reply(episode, text, call):
                ready.append(episode)
            else:  # a failed call, or no room left: the episode ended
                self._finished()
        return ready

    def absorb_scaffold(self, episode: _Episode, text: str) -> list[dict[str, str]] | None:
        """Append a scaffold's turn as if sampled (no sampling log-prob: 0.0; its index in
        `scaffold_turns`); returns the environment messages to send, or None when finished."""
        ids = text_ids(self.tokenizer, text)
        now = time.time()
        episode.trajectory.turn_times.append([now, now])
        episode.trajectory.scaffold_turns.append(len(episode.trajectory.agent_turns))
        return self.absorb_turn(episode, Sample(ids, [0.0] * len(ids), text, "stop"))

    def absorb_reply(self, episode: _Episode, text: str, call: EnvCall) -> bool:
        """Record an environment call and insert its reply; True when the agent can go on.

        A failed call is recorded and ends the trajectory: its text is not a reply the agent may read."""
        traj = episode.trajectory
        traj.env_calls.append(call)
        if call.error is not None:
            traj.stop_reason, traj.error = "env_error", call.error
            return False
        episode.env_history.append(text)
        reply_ids = text_ids(self.tokenizer, text)
        limit = self.agent_cfg.max_env_reply_tokens
        seen = text if len(reply_ids) <= limit else self.tokenizer.decode(
            reply_ids[:limit], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        wrapped_ids = text_ids(self.tokenizer, wrap_env_reply(seen))
        if len(wrapped_ids) >= self.room(episode):  # no agent token would fit after it
            traj.stop_reason = "token_budget"
            return False
        traj.token_ids.extend(wrapped_ids)
        traj.loss_mask.extend([0] * len(wrapped_ids))
        traj.logprobs.extend([0.0] * len(wrapped_ids))
        traj.env_replies.append(seen)
        return True


def _description(env: "Environment") -> str:
    """The environment's line for the agent's prompt (its config's, else its name)."""
    cfg = getattr(env, "cfg", None)
    return cfg.prompt_description() if cfg is not None else " ".join(str(getattr(env, "name", "")).split())


async def rollout_batch(
    policy: Policy,
    env: "Environment | Sequence[Environment]",
    questions: Sequence[QuestionRow],
    agent_cfg: AgentConfig,
    rollout_cfg: RolloutConfig,
    reward_cfg: RewardConfig,
    group_size: int | None = None,
    seed: int = 0,
    gather_window_s: float = 0.05,
    step: int = NO_STEP,
    score: bool = True,
    env_weights: Sequence[float] | None = None,
    scaffold: Scaffold | None = None,
    progress: RolloutProgress | None = None,
    follow_up: FollowUpScaffold | None = None,
) -> list[Trajectory]:
    """Sample `group_size` (default `rollout_cfg.group_size`) trajectories per question.

    Returns them ordered by question, then group index 0..G-1, each with its answer set and, with
    `score`, its reward (the reward stage, `reward_stage.RewardStage`; `score=False` leaves it to the caller).
    Those ended by a failed environment call have `error` set and never an answer or reward.
    Each agent generation is seeded by `draw_seed(seed, step, question, group index, turn)`
    (`step`: the training step, `NO_STEP` outside training), never by batch or arrival order.
    With a pool of environments (`env` a sequence; `env_weights` default to equal) each question
    draws its environment by `draw_environment(seed, step, question, env_weights)`.
    With `scaffold` (training only) the last `rollout_cfg.scaffold.members` of each group start
    from the scaffold's first turn (`rollout.scaffold`), recorded in `scaffold_turns`; `follow_up` may
    write their later turns after each reply (`rollout.scaffold.follow_up`).
    `progress` is advanced once per trajectory as it ends (`rollout.progress`).
    """
    group = group_size or rollout_cfg.group_size
    envs = list(env) if isinstance(env, Sequence) else [env]
    weights = list(env_weights) if env_weights is not None else [1.0] * len(envs)
    if not envs or len(weights) != len(envs):
        raise ValueError(f"rollout_batch needs one weight per environment: {len(envs)} environment(s), "
                         f"{len(weights)} weight(s)")
    loop = _Loop(policy, agent_cfg, rollout_cfg)
    loop.progress = progress
    episodes = loop.episodes(envs, weights, questions, group, seed, step)
    await loop.drive(episodes, questions, group, seed, step, gather_window_s, scaffold, follow_up)
    trajectories = [e.trajectory for e in episodes]
    for traj in trajectories:
        if traj.error is None:  # a failure is not an answer
            traj.answer = extract_answer(traj.agent_turns[-1]) if traj.agent_turns else ""
    if score:  # priced at this environment's prices (validation, evaluation); training scores apart
        stage = RewardStage(reward_cfg, env_prices([e.cfg for e in envs]) if reward_cfg.cost.mode != "off" else None,
                            strict=False)
        stage.score(trajectories, {q.question_id: q for q in questions})
    return trajectories


def run_rollout(*args: Any, **kwargs: Any) -> list[Trajectory]:
    """Blocking `rollout_batch` for scripts (runs in a fresh thread when a loop is already running)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(rollout_batch(*args, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, rollout_batch(*args, **kwargs)).result()
