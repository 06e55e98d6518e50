"""What a step's batch holds, as numbers and rows: which trajectories GRPO may learn from, how
stale their sampling weights were, what the scaffolded members did, and the warehouse rows.

Small pure functions of a batch, apart from the session that calls them once a step, so tests and
the rollout traces use the same rule the update does.
"""

from __future__ import annotations

from typing import Any

from prompt_r1.core.failures import env_ended
from prompt_r1.core.trajectory import Trajectory, env_call_records


def env_error_trajectories(trajectories: list[Trajectory]) -> int:
    """How many trajectories a failed environment call ended (`stop_reason` env_error). A trajectory
    dropped for a failed LLM judgement also has an `error` and no reward, but the environment did not
    fail: it is the step's `judge_dropped`, not counted here.

    >>> t = lambda err=None, stop="answered": Trajectory("q", 0, [], error=err, stop_reason=stop)
    >>> env_error_trajectories([t(), t("HTTP 500", "env_error"), t("judge `j`: no score")])
    1
    """
    return sum(1 for t in trajectories if env_ended(t))


def usable_for_update(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories GRPO may learn from: those no environment failure ended, in groups
    (questions) that keep at least 2 of them, so group statistics are over real rewards only.

    >>> t = lambda q, err=None: Trajectory(q, 0, [], error=err)
    >>> [x.question_id for x in usable_for_update([t("a"), t("a", "500"), t("a"), t("b"), t("b", "500")])]
    ['a', 'a']
    """
    ok = [t for t in trajectories if t.error is None]
    sizes: dict[str, int] = {}
    for t in ok:
        sizes[t.question_id] = sizes.get(t.question_id, 0) + 1
    return [t for t in ok if sizes[t.question_id] >= 2]


def policy_age(trajectories: list[Trajectory], version: int) -> dict[str, float]:
    """How many updates behind the learner's `version` the sampling weights were (mean, max).

    >>> ts = [Trajectory("q", 0, [], policy_version=3), Trajectory("q", 1, [], policy_version=1)]
    >>> policy_age(ts, 3)
    {'policy_age_mean': 1.0, 'policy_age_max': 2.0}
    """
    ages = [version - t.policy_version for t in trajectories] or [0]
    return {"policy_age_mean": sum(ages) / len(ages), "policy_age_max": float(max(ages))}


def scaffold_stats(scaffolded: list[Trajectory], kept: int, verified_at: float) -> dict[str, float]:
    """The scaffolded members' share of the trained batch, their mean reward and share of verified successes.

    >>> from prompt_r1.core.reward import RewardBreakdown
    >>> t = Trajectory("q", 7, [], scaffold_turns=[0], reward=RewardBreakdown(1.0, 1.0, 1.0))
    >>> scaffold_stats([t], 4, 0.99)
    {'scaffolded_share': 0.25, 'scaffolded_reward': 1.0, 'scaffolded_verified': 1.0}
    """
    rewards = [t.reward.total for t in scaffolded if t.reward is not None]
    return {"scaffolded_share": len(scaffolded) / max(kept, 1),
            "scaffolded_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "scaffolded_verified": sum(r >= verified_at for r in rewards) / len(rewards) if rewards else 0.0}


def trajectory_rows(trajectories: list[Trajectory]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Warehouse rows (trajectories, env_calls) of one step: the one conversion at the warehouse edge."""
    return [t.to_record() for t in trajectories], env_call_records(trajectories)
