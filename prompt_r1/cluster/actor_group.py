"""N Ray actors of one role, started, called and stopped one way: the rollout pool's engines, the
learner group's ranks and the evaluation engines are each an `ActorGroup`.

What a role keeps in its own file is what to send to which actor and what an answer means; what
every role needs alike is here (OpenRLHF's `RayActorGroup` has the same shape):

- starting: one actor per `(args, options)` pair, each with the driver's settings in its
  `runtime_env` (`actor_env.actor_env_vars`, under the actor's own variables), in the placement
  groups the role reserved, which the group then owns;
- gathering: results in the order asked, within a deadline; a deadline that passes raises
  `ActorWaitError`, an actor that dies or raises `ActorCallError`, both naming the actors by role,
  index or label and, once `locate` knew them, node and pid. A `UserError` an actor raises (a bad
  input, such as a damaged checkpoint) is raised as itself: it says what to fix without Ray's frames;
- stopping: each actor's own `shutdown()` within `SHUTDOWN_TIMEOUT_S`, then `ray.kill`, then the
  placement groups (after their actors: a group removed first kills them uncleanly). An actor that
  passed a deadline, or that a driver interrupt left inside a call, has a blocked queue: the group
  is then killed without asking. Safe to repeat, from `finally` or `__exit__`, also once Ray is gone.

`split_evenly` is the one contiguous split of a batch over a group, so whole GRPO groups stay
together in a rollout chunk and a mini-batch's rows go to the learner ranks in order.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import ray

from prompt_r1.cluster.actor_env import actor_env_vars
from prompt_r1.cluster.connect import RayWaitError
from prompt_r1.cluster.placement import release
from prompt_r1.core.failures import UserError

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 60.0  # an actor's own clean-up (environment client, policy) before ray.kill


class ActorWaitError(RayWaitError):
    """Actors of a group did not answer within a deadline; `indices` are those still busy."""

    def __init__(self, message: str, indices: list[int]):
        super().__init__(message)
        self.indices = indices


class ActorCallError(RuntimeError):
    """Actors of a group died or raised during a call; `indices` names them, the dead first, and
    `errors` holds each one's Ray error. Not a `UserError`: an actor's bug keeps its traceback."""

    def __init__(self, message: str, indices: list[int], errors: dict[int, BaseException]):
        super().__init__(message)
        self.indices, self.errors = indices, errors


class ActorGroup:
    """The actors of one role and the placement groups they run in (`groups`, released by `kill`).

    `role` names one actor in errors ("rollout engine" gives "rollout engine 1"; `labels` replace
    the index), `name` the group in log lines. The group is made before its actors are started
    (`start`), so the role holds every actor the moment it exists: a Ctrl-C or a failure during
    start-up still finds them to stop."""

    def __init__(self, role: str, *, groups: Sequence[Any] = (), labels: Sequence[str] | None = None,
                 name: str = ""):
        self.role, self.name, self.labels = role, name or role, list(labels or [])
        self.groups, self.actors = list(groups), []
        self.placements: list[dict[str, Any]] = []  # per actor: node_id, node_ip, gpu_ids, pid (`locate`)
        self.stuck = False  # a deadline passed: the actors' queues are blocked
        self._waiting = False  # inside `gather` (left True when an interrupt leaves it)

    def start(self, actor_cls: type, args: Sequence[tuple], options: Sequence[dict[str, Any]]) -> None:
        """`len(args)` actors of `actor_cls`, the i-th built with `args[i]` and `.options(**options[i])`;
        returns at once (`locate` or the first `gather` waits for them to be built)."""
        remote = ray.remote(actor_cls)
        for arg, opts in zip(args, options):
            self.actors.append(remote.options(**_with_driver_env(opts)).remote(*arg))
        log.info("%s: %d actor(s) starting", self.name, len(self.actors))

    # -- calling -------------------------------------------------------------------------------
    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` on every actor with the same arguments; the refs, in actor order."""
        return [getattr(actor, method).remote(*args, **kwargs) for actor in self.actors]

    def call_each(self, method: str, args: Sequence[tuple]) -> list[Any]:
        """`method` on the first `len(args)` actors, the i-th with `args[i]`; the refs, in order."""
        return [getattr(actor, method).remote(*arg) for actor, arg in zip(self.actors, args)]

    def gather(self, refs: Sequence[Any], what: str, *, timeout_s: float, field: str, fix: str = "",
               indices: Sequence[int] | None = None, shown_s: float | None = None, grace_s: float = 0.0) -> list[Any]:
        """The results of `refs` (ref i from actor `indices[i]`, by default i), in that order, within
        `timeout_s`. `field` is the deadline's setting, `shown_s` its whole value where part of it
        was spent on an earlier stage, `fix` what to change. After a failure, the others' errors
        are collected for `grace_s` more (an actor that died makes its peers' collectives fail
        too: the dead one is the cause)."""
        indices = list(range(len(refs))) if indices is None else list(indices)
        pending = dict(zip(refs, indices))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        self._waiting = True
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    self.stuck = True
                    late = sorted(pending.values())
                    raise ActorWaitError(f"{what} did not finish within {shown_s or timeout_s:g}s ({field}): no "
                                         f"answer from {self.names(late)}" + (f"; {fix}" if fix else ""), late)
                index = pending.pop(ready[0])
                try:
                    results[index] = ray.get(ready[0])
                except ray.exceptions.RayError as err:
                    self._failed(what, {index: err}, pending, time.monotonic() + grace_s)
        except Exception:  # an error, not an interrupt: `stuck` says whether queues are blocked
            self._waiting = False
            raise
        self._waiting = False
        return [results[index] for index in indices]

    def locate(self, timeout_s: float, *, what: str, field: str, fix: str = "",
               shown_s: float | None = None) -> list[dict[str, Any]]:
        """Each actor's `placement()` (`engine_placement.actor_location`), gathered (the start-up
        deadline: the answer comes once the actor is built) and kept to name actors in errors."""
        self.placements = self.gather(self.call("placement"), what, timeout_s=timeout_s, field=field, fix=fix,
                                      shown_s=shown_s)
        return self.placements

    def names(self, indices: Sequence[int]) -> str:
        """`rollout engine 1 (node 10.0.0.5, pid 7), rollout engine 2`: node and pid once located."""
        out = []
        for index in indices:
            label = self.labels[index] if index < len(self.labels) else index
            where = self.placements[index] if index < len(self.placements) else None
            out.append(f"{self.role} {label}" + (f" (node {where['node_ip']}, pid {where['pid']})" if where else ""))
        return ", ".join(out)

    def _failed(self, what: str, errors: dict[int, BaseException], pending: dict[Any, int], grace_end: float) -> None:
        """Raise for a failed call, with the errors of the others that fail before `grace_end`."""
        while pending and time.monotonic() < grace_end:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, grace_end - time.monotonic()))
            for ref in ready:
                index = pending.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as err:
                    errors[index] = err
        dead = sorted(i for i, e in errors.items() if isinstance(e, ray.exceptions.RayActorError))
        failed = sorted(i for i in errors if i not in dead)
        cause = getattr(errors[failed[0]], "cause", None) if failed and not dead else None
        if isinstance(cause, UserError):  # a bad input the actor reports: raised as the user would meet it
            raise cause from errors[failed[0]]
        parts = [f"{self.names([i])} died during {what} ("
                 + ("its constructor raised: " if getattr(errors[i], "actor_init_failed", False) else
                    "its process exited: ") + f"{first_line(errors[i])})" for i in dead]
        parts += [f"{self.names([i])} failed during {what}: {first_line(errors[i])}" for i in failed]
        first = errors[(dead + failed)[0]]
        raise ActorCallError("; ".join(parts), dead + failed, errors) from first

    # -- stopping ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Each actor's own `shutdown()` (all at once, within `SHUTDOWN_TIMEOUT_S`), then `kill`;
        without asking when a deadline passed or an interrupt left a call running."""
        try:
            if self.actors and not (self.stuck or self._waiting) and ray.is_initialized():
                refs = self.call("shutdown")
                ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_TIMEOUT_S)
        except Exception as err:  # an actor that is gone or has no clean-up: killed below all the same
            log.debug("%s: clean-up: %s", self.name, err)
        finally:
            self.kill()

    def kill(self) -> None:
        """`ray.kill` every actor, then release the placement groups; safe to repeat."""
        actors, groups, self.actors, self.groups = self.actors, self.groups, [], []
        for actor in actors:
            with contextlib.suppress(Exception):  # already dead, or Ray already shut down
                ray.kill(actor)
        if actors:
            log.info("%s: %d actor(s) stopped", self.name, len(actors))
        for group in groups:
            release(group)

    def __enter__(self) -> "ActorGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _with_driver_env(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with the driver's settings (`actor_env_vars`) in `runtime_env`, the actor's own
    variables (e.g. `CUDA_VISIBLE_DEVICES`) over them."""
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**actor_env_vars(), **runtime_env.get("env_vars", {})}
    return {**options, "runtime_env": runtime_env}


def first_line(err: BaseException) -> str:
    """The cause of a Ray error in one line (a remote traceback is long; its last line is the error)."""
    if isinstance(err, ray.exceptions.OutOfMemoryError):  # its message is a page of Ray's advice
        return "killed by Ray's memory monitor, the node ran low on memory"
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:300] if lines else type(err).__name__


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """Contiguous chunks whose sizes differ by at most one (empty ones last).

    >>> split_evenly([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    >>> split_evenly([1], 3)
    [[1], [], []]
    """
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks
