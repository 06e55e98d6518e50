"""Rollouts spread over Ray actors: each holds a policy copy and its own environment client.

The driver (trainer or CLI) owns a `RolloutPool`. A batch of questions is split into contiguous
chunks (whole GRPO groups stay in one actor), each `RolloutWorker` (the actor, `rollout.worker`)
runs `rollout_batch` on its chunk and returns the `Trajectory` objects, each stamped with the
policy version the actor holds (Ray pickles them, as it does the questions and the config); the
driver alone writes them to DuckDB and MLflow, so actors never open the warehouse (and therefore
keep no environment reply cache). After a GRPO
step `broadcast` sends the new weights (a versioned, checksummed `core.weights.WeightUpdate`: full
weights, or the LoRA adapter alone) through the object store once, every actor loads them and
answers with its version and checksum, and any answer that differs, fails or comes late is an
error naming the actor (`WeightSyncError`). Weights made in this process are put there; weights a
learner rank made stay where the rank put them (`UpdateRef`): the driver holds only their
`SyncHeader` and hands the reference on, so it never copies the tensors.

Asynchronous rollouts (`rollout.max_staleness` >= 1): `submit` queues a batch on the actors and
returns at once, `collect` waits for it. Ray runs one caller's calls to an actor in the order
they were made, so a broadcast queued behind a running batch lands after it and before every
batch submitted later: a batch samples with the newest weights broadcast before its `submit`.
Each actor stamps the trajectories it returns with the version of the weights it holds.

Environment clients: each actor holds one client per environment it trains against (the training
pool, `Config.training_environments()`: `train.environments`, or the one `environment`) and each
question draws one of them (`rollout_batch`). `inprocess` and `openai` environments are built
inside each actor, with the driver's settings (`cluster.actor_env.actor_env_vars`) and the environments'
API key variables handed over as an argument, never through `runtime_env` (`cluster.actor_env.secret_env`).
A `vllm` environment is a server the driver starts (`actor_environments`, one per pool member that
needs one); actors reach it as `openai` at its base URL. One laptop = a local Ray instance this process starts itself
(`ray.init(address="local")`: a plain `ray.init()` would join whatever cluster `RAY_ADDRESS` or
the machine's last `ray start` points at); a cluster = `ray_address` (both in `cluster.connect`).

Placement (`cluster.engine_placement`): each actor runs in its own placement group of one bundle, `{GPU:
agent.tensor_parallel_size, CPU: rollout.cpus_per_worker}` for vLLM on a cluster with GPUs, else
`{CPU: rollout.cpus_per_worker}`; the groups are released when the pool shuts down (also when it
fails to start). Each actor reports its node and GPU ids (`RolloutWorker.placement`), logged at
start. Under `rollout.colocate` each vLLM engine shares its learner ranks' GPUs instead
(`engine_placement.shared_gpus`) and `sleep` / `wake_up` free and retake its memory around each
update (the session calls them). The driver side never calls `torch.cuda`: it creates no CUDA
context and holds no GPU; actors see only the GPUs Ray assigned to them (or, colocated, shares).

The actors are one `cluster.actor_group.ActorGroup` (`engines`): it starts them, gathers their
answers and stops them as it does the learner's ranks. Every wait on Ray has a deadline from
`RolloutConfig` and fails with a `RayWaitError` (or, for placement, a `PlacementError`) that says
what to change: reaching `ray_address` (`ray.init` alone retries an unreachable address for
minutes), placing and starting the actors (a cluster without free CPUs or GPUs for them would wait
forever), and each rollout batch or weight broadcast.

A dead actor (its process killed, a crash) in the synchronous schedule (`max_staleness` 0): Ray
restarts it (`max_restarts`), and the pool redoes only that actor's share of the batch, after the
restarted actor has loaded the weights last sent (it comes back with the weights it was built
with); the pool keeps the last sync in the object store for that. Episodes are seeded per
(question, sample, turn), so the redone share equals the lost one. An actor that died while idle
is found by the version it stamps on its trajectories (a restarted one says 0) and redone the same
way. At most `rollout.actor_restarts` restarts per batch (or weight sync), then the batch fails
naming the actor; `restarts` counts them (the session logs `rollout_actor_restarts`).
With `max_staleness` >= 1 batches and weight loads queue up behind each other on the actors, and a
restart loses the queue: there Ray does not restart actors and a death fails the step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from prompt_r1.config.experiment import Config
from prompt_r1.config.env import EnvConfig, PoolEnvConfig
from prompt_r1.core.failures import ProcessesDied
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.seeding import derive_seed
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.cluster.actor_env import secret_env
from prompt_r1.cluster.actor_group import ActorCallError, ActorGroup, ActorWaitError, split_evenly
from prompt_r1.cluster.connect import RayWaitError, check_local_cpus, cpus_needed, init_ray, rollout_workers
from prompt_r1.core.weights import SyncHeader, UpdateRef, WeightUpdate
from prompt_r1.cluster.engine_placement import (actor_options, describe_location, place_colocated, place_engines,
                                                shared_gpus)
from prompt_r1.cluster.placement import describe
from prompt_r1.rollout.worker import RolloutWorker, refuse_managed_environments

log = logging.getLogger(__name__)



class WeightSyncError(RayWaitError):
    """A rollout engine did not take a weight sync: no answer within `rollout.sync_timeout_s`, a
    failed load, or another version or checksum than the learner sent; the message names it."""


@contextlib.contextmanager
def actor_environment(env_cfg: EnvConfig, log_dir: Path | None = None) -> Iterator[EnvConfig]:
    """The environment settings actors can use: a `vllm` server is started here, shared as `openai`."""
    if env_cfg.kind != "vllm":
        yield env_cfg.model_copy(update={"cache": False})
        return
    from prompt_r1.env.vllm_server import managed_vllm_server

    with managed_vllm_server(env_cfg, log_dir) as base_url:
        yield env_cfg.model_copy(update={"kind": "openai", "base_url": base_url, "cache": False})


@contextlib.contextmanager
def actor_environments(cfg: Config, log_dir: Path | None = None) -> Iterator[Config]:
    """`cfg` with every training environment usable by actors (`actor_environment`): a managed vLLM
    server is started for each pool member that needs one, all stopped on exit."""
    with contextlib.ExitStack() as stack:
        if not cfg.train.environments:
            env = stack.enter_context(actor_environment(cfg.environment, log_dir))
            yield cfg.model_copy(update={"environment": env})
            return
        pool = [PoolEnvConfig.model_validate({**stack.enter_context(actor_environment(entry.env(), log_dir))
                                              .model_dump(), "weight": entry.weight})
                for entry in cfg.train.environments]
        yield cfg.model_copy(update={"train": cfg.train.model_copy(update={"environments": pool})})


@dataclass(eq=False)  # compared by identity: the pool finds its own entries in its queue
class PendingRollout:
    """A batch submitted to the actors (`RolloutPool.submit`), not yet collected."""

    refs: list[Any]              # one per actor with a share of the batch
    questions: int
    loads: list["PendingSync"] = field(default_factory=list)  # weight syncs queued before it, verified with it
    args: list[tuple] = field(default_factory=list)  # each actor's `rollout` arguments, to redo its share
    version: int = 0             # the policy version its trajectories must carry (the last sync sent before it)


@dataclass(eq=False)
class PendingSync:
    """A weight sync sent to every actor (`RolloutPool.broadcast`), its answers not yet verified."""

    update: SyncHeader
    refs: list[Any]              # one `load_weights` call per actor
    weights: Any = None          # the ObjectRef of the tensors, kept alive until the answers are in


class RolloutPool:
    """`num_workers` rollout actors sharing one batch; the driver-side handle on their `ActorGroup`."""

    def __init__(self, cfg: Config, model_path: str | Path, num_workers: int | None = None,
                 env_factory: Callable[[EnvConfig], Any] | None = None,
                 learner_placements: list[dict[str, Any]] | None = None):
        """Place and start the actors (`rollout.cpus_per_worker`, `agent.tensor_parallel_size`: see
        `engine_placement`). `env_factory(env_cfg) -> Environment` replaces `open_environment`
        inside each actor (custom environments; it must be picklable by Ray). `learner_placements`
        (the learner ranks' nodes and GPU ids) place the engines beside them under `rollout.colocate`."""
        if not ray.is_initialized():
            init_ray(cfg.rollout, cpus_needed(cfg, num_workers))
        refuse_managed_environments(cfg)
        self.cfg = cfg
        self.num_workers = rollout_workers(cfg.rollout, num_workers)
        secrets = secret_env(cfg.training_environments())
        check_local_cpus(cfg.rollout, self.num_workers)  # a local instance never grows
        self._loads: list[PendingSync] = []  # weight syncs broadcast without waiting, not yet verified
        self._queued: list[PendingRollout] = []  # submitted, not collected
        # a dead actor is restarted only where nothing else is queued on it (see the module docstring)
        self.restartable = cfg.rollout.max_staleness == 0 and cfg.rollout.actor_restarts > 0
        self.restarts = 0  # actors restarted and brought back to the current weights, over the pool's life
        self._latest: PendingSync | None = None  # the last sync sent, its weights kept for a restarted actor
        self.engines: ActorGroup | None = None  # once placed
        timeout_s = cfg.rollout.actor_start_timeout_s
        deadline = time.monotonic() + timeout_s  # one deadline for placement and start-up together
        try:  # start-up errors (and SIGTERM/Ctrl-C while actors start) surface here
            shared = shared_gpus(cfg, self.num_workers, learner_placements)
            if shared is None:
                bundle, groups = place_engines(cfg, self.num_workers)
                bundles, visible = [bundle] * len(groups), [None] * len(groups)
            else:  # each engine beside its learner ranks, on their GPUs (`rollout.colocate`)
                bundles, groups = place_colocated(cfg, shared)
                visible = [",".join(s["gpu_ids"]) for s in shared]
            # the policy's own seed (engine start, calls without row seeds): distinct per actor
            self.engines = ActorGroup("rollout engine", groups=groups, name="rollout pool")
            self.engines.start(
                RolloutWorker,
                [(cfg, str(model_path), derive_seed("rollout_actor", cfg.seed, index), env_factory, secrets)
                 for index in range(len(groups))],
                # unbounded for Ray: the pool bounds restarts per batch (`rollout.actor_restarts`)
                [{**actor_options(bundles[index], group, visible[index]), "max_restarts": -1 if self.restartable else 0}
                 for index, group in enumerate(groups)])
            self.engines.locate(
                max(deadline - time.monotonic(), 1.0),
                what=f"starting the rollout actors (placed: {describe(bundles)})",
                field="rollout.actor_start_timeout_s", shown_s=timeout_s,
                fix="raise it if loading the policy is slow, or see the Ray logs (`/tmp/ray/session_latest/logs` on "
                    "the actor's node) for an actor that fails to start")
            for index, where in enumerate(self.placements):
                log.info("%s", describe_location(index, where))
        except BaseException:
            self.shutdown()
            raise

    @property
    def placements(self) -> list[dict[str, Any]]:
        """Per actor: node_id, node_ip, gpu_ids, pid (`engine_placement.actor_location`)."""
        return self.engines.placements if self.engines is not None else []

    def rollout(self, questions: Sequence[QuestionRow], step: int, greedy: bool = False,
                group_size: int | None = None, score: bool = True, scaffold: bool = False) -> list[Trajectory]:
        """Trajectories for `questions` in order (question, then group index), split over the actors;
        scored unless `score=False` (then the caller runs `prompt_r1.rollout.reward_stage.RewardStage`);
        `scaffold` (training rollouts only) starts some members from `rollout.scaffold.fn`'s turn."""
        return self.collect(self.submit(questions, step, greedy, group_size, score, scaffold))

    def submit(self, questions: Sequence[QuestionRow], step: int, greedy: bool = False,
               group_size: int | None = None, score: bool = True, scaffold: bool = False) -> PendingRollout:
        """Queue a batch on the actors (as `rollout`) and return at once; `collect` waits for it.
        It runs after everything queued before it, weight loads included."""
        chunks = [chunk for chunk in split_evenly(list(questions), len(self.engines.actors)) if chunk]
        # empty chunks come last: actor i still gets chunk i
        args = [(chunk, self.cfg.seed, step, greedy, group_size, score, scaffold) for chunk in chunks]
        refs = self.engines.call_each("rollout", args)
        version = self._latest.update.version if self._latest is not None else 0
        pending = PendingRollout(refs, len(questions), self._loads, args, version)
        self._loads = []
        self._queued.append(pending)
        return pending

    def collect(self, pending: PendingRollout) -> list[Trajectory]:
        """The trajectories of a submitted batch, in order. The deadline is `rollout_timeout_s` for
        it and again for each batch that was queued ahead of it and is still uncollected."""
        ahead = self._queued.index(pending) if pending in self._queued else 0
        if pending in self._queued:
            self._queued.remove(pending)
        timeout_s = self.cfg.rollout.rollout_timeout_s * (1 + ahead)
        for sync in pending.loads:  # queued before the batch: answered before it runs
            self._verify(sync, timeout_s + self.cfg.rollout.sync_timeout_s)
        what = (f"rolling out {pending.questions} questions on {len(pending.refs)} actors"
                + (f" (queued behind {ahead} other batch(es))" if ahead else ""))
        restarted = 0
        while True:  # bounded: each pass restarts an actor, at most `rollout.actor_restarts` of them
            try:
                results = self.engines.gather(
                    pending.refs, what, timeout_s=timeout_s, field="rollout.rollout_timeout_s",
                    fix="raise it for big batches, or check the environment (a server that stopped answering is "
                        "retried for up to environment.call_deadline_s per call)")
            except ActorCallError as err:
                dead = self._restartable(err, restarted)
                if not dead:
                    self._raise_if_killed(err, restarted)
                    raise
                stale = dead
            else:  # an actor restarted while idle comes back with the weights it was built with
                stale = [i for i, trajectories in enumerate(results)
                         if any(t.policy_version != pending.version for t in trajectories)]
                if not stale:
                    return [t for trajectories in results for t in trajectories]
                if not self.restartable or restarted + len(stale) > self.cfg.rollout.actor_restarts:
                    raise WeightSyncError(
                        f"{self.engines.names(stale)} sampled with other weights than policy version "
                        f"{pending.version} (restarted by Ray {restarted} time(s) in this batch already, "
                        f"rollout.actor_restarts {self.cfg.rollout.actor_restarts}); see that actor's Ray log")
            for index in stale:
                log.warning("%s died or was restarted during %s: Ray restarted it; it loads policy version %d and "
                            "redoes its %d question(s)", self.engines.names([index]), what, pending.version,
                            len(pending.args[index][0]))
                self._reload(index, pending.version)
                pending.refs[index] = self.engines.actors[index].rollout.remote(*pending.args[index])
            restarted += len(stale)

    def _raise_if_killed(self, err: ActorCallError, restarted: int) -> None:
        """`ProcessesDied` (exit 3, no traceback) when every failed actor's process died, none of a
        failing constructor or a raised error: a process killed from outside is no bug, and what
        helps is more restarts or a resume. Other failures keep their `ActorCallError`."""
        if not err.indices or not all(isinstance(err.errors[i], ray.exceptions.RayActorError)
                                      and not getattr(err.errors[i], "actor_init_failed", False) for i in err.indices):
            return
        raise ProcessesDied(
            f"{err}. A process killed from outside (the OOM killer, kill -9, a lost node) is not a bug of prompt-r1. "
            f"rollout.actor_restarts is {self.cfg.rollout.actor_restarts} ({restarted} restart(s) in this batch"
            f"{'' if self.restartable else '; this pool does not restart actors'}): raise it, or continue the run "
            "from its last checkpoint with `train --resume`") from err

    def _restartable(self, err: ActorCallError, restarted: int) -> list[int]:
        """The actors of a failed call to restart: all of them died (none raised), no constructor
        failed, and the batch's restarts stay within `rollout.actor_restarts`; else none."""
        dead = [i for i in err.indices if isinstance(err.errors[i], ray.exceptions.RayActorError)
                and not getattr(err.errors[i], "actor_init_failed", False)]
        if (not self.restartable or len(dead) != len(err.indices)
                or restarted + len(dead) > self.cfg.rollout.actor_restarts):
            return []
        return dead

    def _reload(self, index: int, version: int) -> Any:
        """Wait for Ray's restart of actor `index` (its start-up deadline) and load policy `version`
        into it (the last sync sent; version 0, the weights it is built with, needs none)."""
        self.restarts += 1
        actor, name = self.engines.actors[index], self.engines.names([index])
        limit = self.cfg.rollout.actor_start_timeout_s + self.cfg.rollout.sync_timeout_s
        deadline = time.monotonic() + limit
        while True:  # a restarting actor refuses calls (`ActorUnavailableError`) until it is up again
            try:
                [where] = self.engines.gather([actor.placement.remote()], f"restarting {name}",
                                              timeout_s=max(deadline - time.monotonic(), 1.0),
                                              field="rollout.actor_start_timeout_s", shown_s=limit, indices=[index])
                break
            except ActorCallError as err:
                if (not isinstance(err.errors.get(index), ray.exceptions.ActorUnavailableError)
                        or time.monotonic() > deadline):
                    raise
                time.sleep(0.5)
        self.engines.placements[index] = where
        if version == 0:
            return None
        sync = self._latest
        if sync is None or sync.update.version != version:
            raise WeightSyncError(f"{name} was restarted, but the weights of policy version {version} are no longer "
                                  "kept; resume the run from its last checkpoint")
        [reply] = self.engines.gather([actor.load_weights.remote(sync.weights)],
                                      f"loading policy version {version} into restarted {name}", timeout_s=limit,
                                      field="rollout.sync_timeout_s", indices=[index])
        if reply != sync.update.reply():
            raise WeightSyncError(f"restarted {name} answered version {reply['version']} checksum "
                                  f"{reply['checksum']} to policy version {version} ({sync.update.checksum})")
        return reply

    def cancel(self, pending: PendingRollout) -> None:
        """Drop a submitted batch: one still queued never runs (one already running finishes first;
        Ray does not interrupt a running call of a regular actor)."""
        with contextlib.suppress(ValueError):
            self._queued.remove(pending)
        for ref in pending.refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref)

    def broadcast(self, update: WeightUpdate | UpdateRef, wait: bool = True) -> list[dict[str, Any]] | None:
        """Load a weight sync in every actor (one copy in the object store: put there now, or where a
        learner rank put it, `UpdateRef`, never fetched into this process) and verify each one's
        answer: the sent version and checksum, within `rollout.sync_timeout_s` (plus
        `rollout.rollout_timeout_s` for each batch queued ahead of it). An actor that fails, does not
        answer in time, or answers otherwise raises `WeightSyncError` naming it; returns the answers
        (one per actor, in order). `wait=False` returns None at once: the loads run after the batches
        queued before them and are verified by the next `collect` (or the next waiting broadcast)."""
        header, ref = (update.header, ray.put(update)) if isinstance(update, WeightUpdate) else (update.header,
                                                                                                 update.ref)
        self._latest = PendingSync(header, self.engines.call("load_weights", ref), ref)
        self._loads.append(self._latest)
        if not wait:
            return None
        syncs, self._loads = self._loads, []
        timeout_s = self.cfg.rollout.sync_timeout_s + self.cfg.rollout.rollout_timeout_s * len(self._queued)
        return [self._verify(sync, timeout_s) for sync in syncs][-1]

    def sleep(self) -> None:
        """Every engine frees its GPU memory for a colocated learner's update (`rollout.colocate`;
        a no-op in engines that hold none), within `rollout.sync_timeout_s`."""
        self.engines.gather(self.engines.call("sleep"), "putting the colocated rollout engines to sleep",
                            timeout_s=self.cfg.rollout.sync_timeout_s, field="rollout.sync_timeout_s",
                            fix="see the Ray logs of the actors' node")

    def wake_up(self) -> None:
        """Every engine takes back what `sleep` freed, within `rollout.sync_timeout_s`."""
        self.engines.gather(self.engines.call("wake_up"), "waking the colocated rollout engines",
                            timeout_s=self.cfg.rollout.sync_timeout_s, field="rollout.sync_timeout_s",
                            fix="the learner may still hold the GPU memory they need (`prompt-r1 plan` checks both "
                                "fit); see the Ray logs of the actors' node")

    def _verify(self, sync: "PendingSync", timeout_s: float, restarted: int = 0) -> list[dict[str, Any]]:
        """Every actor's answer to one sync, checked against what was sent (see `broadcast`). An
        actor that died loading it is restarted and loads it again (`rollout.actor_restarts`)."""
        update, engines = sync.update, self.engines
        try:
            replies = engines.gather(sync.refs, f"loading policy version {update.version}", timeout_s=timeout_s,
                                     field="rollout.sync_timeout_s")
        except ActorWaitError as err:  # the late engines' queues are blocked: shutdown kills them without asking
            raise WeightSyncError(
                f"weight sync of policy version {update.version}: {engines.names(err.indices)} did not answer within "
                f"{timeout_s:g}s (rollout.sync_timeout_s, plus rollout.rollout_timeout_s per batch queued ahead); "
                "raise it for big models or slow networks, or see the Ray logs of that actor's node (stuck or out "
                "of memory)") from err
        except ActorCallError as err:  # a `UserError` of the policy (`UnsupportedUpdate`) is raised as itself
            dead = self._restartable(err, restarted) if sync is self._latest and update.version else []
            for index in dead:
                log.warning("%s died loading policy version %d: Ray restarted it; it loads it again",
                            engines.names([index]), update.version)
                sync.refs[index] = ray.put(self._reload(index, update.version))  # loaded and checked: its answer
            if dead:
                return self._verify(sync, timeout_s, restarted + len(dead))
            failure = err.errors[err.indices[0]]
            cause = getattr(failure, "cause", None) or failure  # the actor's own exception, without Ray's frames
            raise WeightSyncError(f"weight sync of policy version {update.version}: {engines.names(err.indices[:1])} "
                                  f"failed to load it: {type(cause).__name__}: {cause}; see that actor's log for the "
                                  "traceback") from err
        wrong = [index for index, reply in enumerate(replies) if reply != update.reply()]
        if wrong:
            got = "; ".join(f"engine {i} answered version {replies[i]['version']} checksum {replies[i]['checksum']}"
                            for i in wrong)
            raise WeightSyncError(
                f"weight sync of policy version {update.version} (checksum {update.checksum}): {engines.names(wrong)} "
                f"now use other weights ({got}); its rollouts would not come from the learner's policy. Check that "
                "the actors run the same agent.model, agent.dtype and agent.lora as the learner, then resume the run")
        log.info("weight sync: policy version %d (%s, %.1f MB, checksum %s) verified on %d engine(s)",
                 update.version, update.kind, update.nbytes / 1e6, update.checksum[:12], len(replies))
        return replies

    def shutdown(self) -> None:
        """Stop the actors and release their placement groups (`ActorGroup.shutdown`: stuck actors
        are killed without waiting on their blocked queue); safe to repeat."""
        if self.engines is not None:
            self.engines.shutdown()

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
