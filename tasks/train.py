"""Training-step tasks around one `TrainingSession`.

Ray is driven from these tasks rather than through prefect-ray's task runner: the rollout
workers are *stateful* Ray actors (each holds a policy copy that receives new weights after
every step), while prefect-ray runs stateless tasks as Ray remote functions. So the flow keeps
a pool of actors alive for the whole run and each task talks to it.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from prompt_r1.train_loop import TrainingSession
from prompt_r1.trajectory import Trajectory
from warehouse.store import QuestionRow


@task(name="next-batch", cache_policy=NO_CACHE)
def next_batch(session: TrainingSession) -> list[QuestionRow]:
    """Advance the data order (outside the retried rollout, so a retry reuses the same batch)."""
    return session.next_batch()


@task(name="rollout", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def rollout(session: TrainingSession, questions: list[QuestionRow]) -> list[Trajectory]:
    """Multi-turn rollouts on the Ray actors (talks to the environment: retried)."""
    return session.rollout(questions)


@task(name="grpo-update", cache_policy=NO_CACHE)
def grpo_update(session: TrainingSession, trajectories: list[Trajectory]) -> dict[str, float]:
    """Update and record the step; raises `EnvironmentFailure` (not retried: no retries here) when
    the step's environment error rate passes `environment.max_error_rate`."""
    metrics = session.update(trajectories)
    session.finish_step(trajectories)
    return metrics


@task(name="broadcast-weights", cache_policy=NO_CACHE)
def broadcast_weights(session: TrainingSession) -> None:
    session.broadcast()


@task(name="checkpoint", cache_policy=NO_CACHE)
def checkpoint(session: TrainingSession, force: bool = False) -> str | None:
    path = session.checkpoint(force=force)
    return str(path) if path else None


@task(name="validate", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def validate(session: TrainingSession) -> dict[str, float]:
    return session.validate()

