"""Which training rollouts a tracker shows, and what it shows of each: plain records, no MLflow.

A training step samples a group of trajectories per question and learns from each one's
reward through its group advantage; the numbers say how a step went, a few trajectories say
why. `RolloutTracer` picks `tracking.trace_rollouts` trajectories of a finished step (evenly
over the batch, ordered by environment and question, so a training pool's environments all
appear when the number allows) and turns each into the record the evaluation's traces use
(`prompt_r1.evaluation.scoring.episode_record`'s keys: question, gold answers, turns,
environment calls with their cost), plus what training saw: the step, the reward and its parts,
the advantage the update gave it (`learner.advantages.outcome_advantages`, the
learner's own rule), the policy
version that sampled it, and the environment. The orchestration shell (`tasks.stages`) logs
the records as MLflow traces; the library only builds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prompt_r1.core.trajectory import Trajectory

if TYPE_CHECKING:
    from prompt_r1.config.experiment import Config
    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.training.hooks import StepResult

METHOD = "train-rollout"  # the traces' `method` tag: never an evaluation method's name
# The learner's data, not a reader's (as `evaluation.scoring.EPISODE_DROPS`, which this rank may not import)
LEARNER_DATA = ("prompt_ids", "token_ids", "loss_mask", "logprobs")


def pick_rollouts(trajectories: Sequence[Trajectory], k: int) -> list[int]:
    """Indices of at most `k` trajectories, evenly over the batch ordered by environment,
    question and group member (the first always in).

    >>> ts = [Trajectory(q, i, [], env_name=e) for e, q in (("b", "q1"), ("a", "q2")) for i in range(3)]
    >>> [(ts[i].env_name, ts[i].question_id, ts[i].group_index) for i in pick_rollouts(ts, 2)]
    [('a', 'q2', 0), ('b', 'q1', 0)]
    >>> pick_rollouts(ts, 0), len(pick_rollouts(ts, 10))
    ([], 6)
    """
    order = sorted(range(len(trajectories)), key=lambda i: (trajectories[i].env_name, trajectories[i].question_id,
                                                           trajectories[i].group_index))
    if k >= len(order):
        return order
    return [order[j * len(order) // k] for j in range(k)]


class RolloutTracer:
    """Builds the trace records of each finished step (`records`): `k` trajectories of it.

    `questions`: the training questions by id (their text and gold answers); a trajectory of a
    question not among them is shown by its id alone."""

    def __init__(self, cfg: Config, k: int, questions: Mapping[str, QuestionRow] | None = None):
        self.cfg, self.k = cfg, k
        self.questions = dict(questions or {})
        self.environments = {e.name: e for e in cfg.training_environments()}

    def records(self, result: StepResult) -> list[dict[str, Any]]:
        """The trace records of `result`'s picked trajectories (none when `k` is 0)."""
        from prompt_r1.learner.advantages import outcome_advantages
        from prompt_r1.training.batch_stats import usable_for_update

        trajectories = result.trajectories
        picked = pick_rollouts(trajectories, self.k)
        if not picked:
            return []
        kept = usable_for_update(trajectories)  # what the update trained on; the others have no advantage
        advantages = dict(zip(map(id, kept), outcome_advantages(kept, self.cfg).tolist()))
        return [self.record(result.step, trajectories[i], advantages.get(id(trajectories[i]))) for i in picked]

    def record(self, step: int, traj: Trajectory, advantage: float | None) -> dict[str, Any]:
        """One trajectory as a trace record (`tasks.tracking.traces.log_episode_trace`'s input):
        the episode's keys, `reward` (its total, the trace's feedback), `reward_parts`, and `tags`:
        step, reward, advantage (`none` when the update left it out), environment, group member,
        policy version."""
        from prompt_r1.env.base import cost_usd

        env = self.environments.get(traj.env_name) or self.cfg.environment
        row = self.questions.get(traj.question_id)
        record = traj.to_record()
        calls = [dict(c, input_cost_usd=cost_usd(env, c["prompt_tokens"], 0),
                      output_cost_usd=cost_usd(env, 0, c["completion_tokens"])) for c in record["env_calls"]]
        reward = traj.reward.total if traj.reward else None
        tags = {"step": step, "reward": "none" if reward is None else f"{reward:.4f}",
                "advantage": "none" if advantage is None else f"{advantage:.4f}",
                "environment": traj.env_name or env.name, "group_index": traj.group_index,
                "policy_version": traj.policy_version}
        return {"env_name": traj.env_name or env.name, "env_model": env.model, "method": METHOD,
                "dataset": row.dataset if row else "", "question_id": traj.question_id,
                "question": row.question if row else traj.question_id, "golds": list(row.golds) if row else [],
                "primary_metric": "", "answer": traj.answer, "error": traj.error, "score": None,
                "reward": reward, "reward_parts": traj.reward.as_dict() if traj.reward else None,
                "advantage": advantage, "step": step, "env_calls": calls,
                "tags": {k: str(v) for k, v in tags.items()},
                "trajectory": {k: v for k, v in record.items() if k not in (*LEARNER_DATA, "env_calls")}}
