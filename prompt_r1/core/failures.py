"""Environment failures: how many calls failed, and when a run must stop because of them.

A failed environment call (after the client's own retries) is a recorded failure, never an
answer: the rollout ends that trajectory (`stop_reason="env_error"`), the learner leaves it out,
and evaluation stores the row with its error and no scores. Those rules keep single failures
harmless; a run where failures are common is stopped instead, because its numbers would
describe the outage, not the agent. `check_error_rate` is that stop: it raises
`EnvironmentFailure` naming the environment and its first error once the share of failed calls
passes the environment's `max_error_rate`. The CLI turns it into exit code 3.

`UserError` marks the other kind of failure: bad input or a missing resource (a config key, a
file, a run id, an agent spec, CPUs, a checkpoint). Every such error type of the library
derives from it (besides its usual base, `ValueError` or `RuntimeError`), and its message
names what is wrong and what to do; the CLI prints that one message and exits 2, while any
other exception keeps its traceback (it is a bug).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

EXIT_CODE = 3  # the CLI's exit status for a run stopped by environment failures
USER_ERROR_EXIT_CODE = 2  # the CLI's exit status for a `UserError`


class UserError(Exception):
    """Bad input or a missing resource: the message names the file, key or resource and what to do.

    A marker base: each subclass also derives from the built-in it always was (`ConfigError` is
    a `ValueError`, `WarehouseError` a `RuntimeError`), so existing `except` clauses still hold."""


class EnvironmentFailure(RuntimeError):
    """Too many environment calls failed; the message names the environment and its first error."""

    def __init__(self, message: str, env_name: str, first_error: str, error_rate: float):
        super().__init__(message)
        self.env_name, self.first_error, self.error_rate = env_name, first_error, error_rate


class ProcessesDied(RuntimeError):
    """Processes of a run died from outside (the OOM killer, `kill -9`, a lost node) more often than the
    run restarts them: not a bug of the project, so the CLI prints the message (what died, the
    setting that bounds restarts, how to resume) and exits 3, as for an environment failure, without
    a traceback (it stays in the log at debug level)."""


def error_rate(errors: Iterable[str | None]) -> float:
    """Share of failed calls among `errors` (one entry per call: None = it succeeded).

    >>> error_rate([None, "HTTP 500", None, None])
    0.25
    >>> error_rate([])
    0.0
    """
    items = list(errors)
    return sum(1 for e in items if e) / len(items) if items else 0.0


def check_error_rate(env_name: str, errors: Iterable[str | None], max_rate: float, where: str) -> float:
    """The error rate of `errors`; raises `EnvironmentFailure` when it exceeds `max_rate`.

    `where` says what the calls were ("training step 3", "evaluation").

    >>> check_error_rate("gpt", [None, None], 0.05, "evaluation")
    0.0
    >>> try:
    ...     check_error_rate("gpt", [None, "HTTP 401: bad key", "timeout"], 0.05, "training step 0")
    ... except EnvironmentFailure as err:
    ...     print(err)
    environment `gpt`: 2 of 3 calls failed in training step 0 (67% > its max_error_rate 5%); first error: HTTP 401: bad key
    """
    items = list(errors)
    rate = error_rate(items)
    if rate > max_rate:
        failed = [e for e in items if e]
        raise EnvironmentFailure(
            f"environment `{env_name}`: {len(failed)} of {len(items)} calls failed in {where} "
            f"({rate:.0%} > its max_error_rate {max_rate:.0%}); first error: {failed[0]}",
            env_name, failed[0], rate)
    return rate


def env_ended(trajectory: Any) -> bool:
    """Whether a failed environment call ended `trajectory` (`stop_reason` env_error). A trajectory
    dropped for a failed LLM judgement has an `error` too, but its environment did not fail."""
    return trajectory.stop_reason == "env_error"


def call_errors(trajectories: Iterable[Any]) -> list[str | None]:
    """One entry per environment call of the trajectories, in order: its error or None."""
    return [c.error for t in trajectories for c in t.env_calls]


def check_pool_error_rates(envs: Iterable[Any], trajectories: Sequence[Any], where: str) -> float:
    """`check_error_rate` for each environment of a pool (objects with `name` and
    `max_error_rate`, e.g. `EnvConfig`) over the calls of the trajectories that prompted it
    (`env_name`), each against its own limit; returns the share of failed calls over all of them.
    A pool of one is the single check it always was."""
    envs = list(envs)
    for env in envs:
        mine = trajectories if len(envs) == 1 else [t for t in trajectories if t.env_name == env.name]
        check_error_rate(env.name, call_errors(mine), env.max_error_rate, where)
    return error_rate(call_errors(trajectories))
