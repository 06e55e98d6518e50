"""Reaching Ray: a local instance of this process's own, or a cluster's address, within deadlines.

`init_ray` starts a quiet local instance (`ray.init(address="local")`: never whatever cluster
`RAY_ADDRESS` or the machine's last `ray start` points at) or connects to `rollout.ray_address`
after a TCP check with its own deadline. `RayWaitError` is every Ray wait that passed its deadline.
Used by the rollout pool and the learner group.

A local instance never grows, so its size is decided once, before anything starts:
`rollout.ray_num_cpus`, or by default (None) `local_cpus`: every core, or what the config's
actors ask for (`cpus_needed`: rollout actors and learner ranks) where that is more. Ray's CPUs
are logical, so a machine with fewer cores than that runs its actors on shared cores, with a
warning (`check_local_cpus`); an explicit `ray_num_cpus` smaller than what the actors ask for is
refused before any model loads.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import socket
import threading

import ray

from prompt_r1.config.experiment import Config, ConfigError, RolloutConfig
from prompt_r1.core.failures import UserError
from prompt_r1.core.signals import interrupts_held, sigterm_kept

log = logging.getLogger(__name__)

RAY_STOP_PATIENCE_S = 60.0  # how long stopping a local Ray holds off a further Ctrl-C


class RayWaitError(UserError, RuntimeError):
    """A Ray wait passed its deadline, or Ray could not be reached; the message says what to change."""



def address_host_port(address: str) -> tuple[str, int] | None:
    """Host and port of a Ray address; None when Ray looks it up itself (`auto`, `local`).

    >>> address_host_port("ray://10.0.0.5:10001")
    ('10.0.0.5', 10001)
    >>> address_host_port("head-node:6379")
    ('head-node', 6379)
    >>> address_host_port("auto") is None
    True
    """
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    return (host.strip("[]"), int(port)) if sep and port.isdigit() else None


def cpus_needed(cfg: Config, num_workers: int | None = None, learner: bool = True) -> float:
    """CPUs the config's actors ask of a local Ray instance: the rollout actors, plus (`learner`)
    the learner ranks wherever the learner may run in Ray (N > 1 ranks, or one rank that may train
    on a GPU: counted without asking Ray whether it has GPUs, so at most `cpus_per_rank` too many).

    >>> from prompt_r1.config.experiment import load_config
    >>> cpus_needed(load_config("configs/paper.yaml"))  # 4 engines and 4 learner ranks, 1 CPU each
    8.0
    """
    train = cfg.train
    ranks = train.world_size if learner and (train.world_size > 1 or train.device != "cpu") else 0
    return rollout_workers(cfg.rollout, num_workers) * cfg.rollout.cpus_per_worker + ranks * train.cpus_per_rank


def local_cpus(rollout_cfg: RolloutConfig, needed: float = 0.0) -> int:
    """The CPUs a local Ray instance starts with: `rollout.ray_num_cpus`, or (None) every core of
    this machine, or `needed` where that is more (the actors then share cores).

    >>> local_cpus(RolloutConfig(ray_num_cpus=3), needed=8)
    3
    >>> local_cpus(RolloutConfig(), needed=os.cpu_count() + 2.5) == os.cpu_count() + 3
    True
    """
    if rollout_cfg.ray_num_cpus:
        return rollout_cfg.ray_num_cpus
    return max(os.cpu_count() or 1, math.ceil(needed))


def init_ray(rollout_cfg: RolloutConfig, cpus_needed: float = 0.0) -> None:
    """Connect to `ray_address`, or start a quiet local instance of this process's own (`address=
    "local"`, never an instance already running on the machine) of `local_cpus(rollout_cfg,
    cpus_needed)` CPUs (`cpus_needed(cfg)` says what a config asks for); reuse one already initialised.

    `ray.init` takes SIGTERM over (a Python handler calling `sys.exit`, then its C++ core
    worker's stack-dump-and-SIGABRT handler, under which no Python clean-up runs); it is handed
    back afterwards (`sigterm_kept`), so SIGTERM still stops the driver as Ctrl-C does. A local
    instance is stopped when the process exits (`stop_local_ray`), before Ray's own exit hook."""
    if ray.is_initialized():
        return
    num_cpus = local_cpus(rollout_cfg, cpus_needed)
    with sigterm_kept():
        if rollout_cfg.ray_address:
            _connect(rollout_cfg.ray_address, rollout_cfg.ray_connect_timeout_s)
        else:
            atexit.register(stop_local_ray)  # exit hooks run last-in first: this one before Ray's
            # address="local": a new instance, never a cluster this machine started earlier
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    log.info("Ray: %s", f"connected to {rollout_cfg.ray_address}" if rollout_cfg.ray_address
             else f"started a local instance of {num_cpus} CPUs")


def stop_local_ray() -> None:
    """Stop the local Ray instance this process started, with Ctrl-C held off for up to
    `RAY_STOP_PATIENCE_S` (`interrupts_held`): a shutdown cut short by a second or third Ctrl-C
    leaves Ray's agents running for minutes."""
    atexit.unregister(stop_local_ray)
    if ray.is_initialized():
        with interrupts_held("stopping Ray", RAY_STOP_PATIENCE_S):
            ray.shutdown()


def rollout_workers(rollout_cfg: RolloutConfig, num_workers: int | None = None) -> int:
    """How many rollout actors to start: `num_workers` (`rollout --workers`) when given, else
    `rollout.num_workers`. Zero or fewer is refused: 0 reads like "no actors" or "the default",
    so it means neither.

    >>> rollout_workers(RolloutConfig(num_workers=2)), rollout_workers(RolloutConfig(num_workers=2), 3)
    (2, 3)
    """
    if num_workers is None:
        return rollout_cfg.num_workers
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"--workers (rollout actors) must be 1 or more, got {num_workers!r}; leave it out to "
                          f"use rollout.num_workers ({rollout_cfg.num_workers})")
    return num_workers


def check_local_cpus(rollout_cfg: RolloutConfig, num_workers: int | None = None, learner_ranks: int = 0,
                     cpus_per_rank: float = 1.0) -> None:
    """Before models load, from the config alone: raise `RayWaitError` when the rollout actors (and
    the `learner_ranks` of a learner group beside them) need more CPUs than a local Ray instance
    has (a running one, or `rollout.ray_num_cpus`: it never grows); with `ray_num_cpus` unset the
    instance is sized to hold them (`local_cpus`), and a machine with fewer cores gets a warning
    that they share cores. GPUs are counted by Ray once it runs (`engine_placement.place_engines`);
    a cluster (`ray_address`) is checked by the placement deadlines instead."""
    workers = rollout_workers(rollout_cfg, num_workers)
    if rollout_cfg.ray_address:
        return
    cpus_per_worker = rollout_cfg.cpus_per_worker
    learner = learner_ranks * cpus_per_rank
    needed = workers * cpus_per_worker + learner
    cores = os.cpu_count() or 1
    asked = f"{workers} actors x {cpus_per_worker:g} CPUs = {workers * cpus_per_worker:g} CPUs"
    if learner:
        asked += (f", and the learner group {learner_ranks} ranks x {cpus_per_rank:g} CPUs = {learner:g} CPUs "
                  "(train.world_size x train.cpus_per_rank)")
    if ray.is_initialized():
        total, source = ray.cluster_resources().get("CPU", 0.0), "already running"
    elif rollout_cfg.ray_num_cpus:
        total, source = float(rollout_cfg.ray_num_cpus), "rollout.ray_num_cpus"
    else:
        if needed > cores:
            log.warning("the rollout pool asks for %s, more than this machine's %d cores: the local Ray instance "
                        "gets %d CPUs and its actors share the cores (slower, not wrong); set rollout.ray_num_cpus "
                        "to refuse this instead", asked, cores, local_cpus(rollout_cfg, needed))
        return
    if needed > total:
        most = int(max(total - learner, 0.0) // cpus_per_worker)
        raise RayWaitError(
            f"the rollout pool asks for {asked}, but the local Ray instance has {total:g} CPUs ({source}); lower "
            f"rollout.num_workers (or `rollout --workers`) to at most {most}, lower rollout.cpus_per_worker"
            + (", or lower train.world_size or train.cpus_per_rank" if learner else "")
            + f", or raise rollout.ray_num_cpus (or leave it unset: every core of this machine, {cores}, or what the "
            "actors ask for where that is more)")


def _connect(address: str, timeout_s: float) -> None:
    """`ray.init(address)` within `timeout_s`: a TCP check first (says why an address is wrong at
    once), then `ray.init` in a helper thread, since it cannot be given a deadline itself."""
    fix = (f"rollout.ray_address={address!r}: check it (the head node's host:port, e.g. 10.0.0.5:6379, "
           "or ray://host:10001), that Ray runs there (`ray status` on the head), or leave ray_address "
           "empty for a local Ray")
    target = address_host_port(address)
    if target is not None:
        try:
            socket.create_connection(target, timeout=timeout_s).close()
        except OSError as err:
            raise RayWaitError(f"cannot reach Ray at {target[0]}:{target[1]} within {timeout_s:g}s "
                               f"(rollout.ray_connect_timeout_s): {err}. {fix}") from err
    failure: list[BaseException] = []
    given_up = threading.Event()
    lock = threading.Lock()

    def connect() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except BaseException as err:  # handed to the caller's thread
            failure.append(err)
            return
        with lock:
            if given_up.is_set():  # connected after the caller was told it failed: leave no connection
                ray.shutdown()

    thread = threading.Thread(target=connect, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with lock:
        late = thread.is_alive()
        if late:
            given_up.set()
    if late:
        raise RayWaitError(f"Ray at {address} accepted a connection but did not answer as a Ray cluster "
                           f"within {timeout_s:g}s (rollout.ray_connect_timeout_s). {fix}")
    if failure:
        raise RayWaitError(f"cannot connect to Ray at {address}: {failure[0]}. {fix}") from failure[0]
