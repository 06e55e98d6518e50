"""Reaching Ray: a local instance of this process's own, or a cluster's address, within deadlines.

`init_ray` starts a quiet local instance (`ray.init(address="local")`: never whatever cluster
`RAY_ADDRESS` or the machine's last `ray start` points at) or connects to `rollout.ray_address`
after a TCP check with its own deadline; `check_local_cpus` refuses, from the config alone, more
actors than a local instance can start. `RayWaitError` is every Ray wait that passed its deadline.
Used by the rollout pool and the learner group.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import ray

from prompt_r1.config.experiment import ConfigError, RolloutConfig
from prompt_r1.core.failures import UserError
from prompt_r1.core.signals import sigterm_kept

log = logging.getLogger(__name__)


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


def init_ray(rollout_cfg: RolloutConfig) -> None:
    """Connect to `ray_address`, or start a quiet local instance of this process's own (`address=
    "local"`, never an instance already running on the machine); reuse one already initialised.

    `ray.init` takes SIGTERM over (a Python handler calling `sys.exit`, then its C++ core
    worker's stack-dump-and-SIGABRT handler, under which no Python clean-up runs); it is handed
    back afterwards (`sigterm_kept`), so SIGTERM still stops the driver as Ctrl-C does."""
    if ray.is_initialized():
        return
    with sigterm_kept():
        if rollout_cfg.ray_address:
            _connect(rollout_cfg.ray_address, rollout_cfg.ray_connect_timeout_s)
        else:
            # address="local": a new instance, never a cluster this machine started earlier
            ray.init(address="local", num_cpus=rollout_cfg.ray_num_cpus, include_dashboard=False,
                     logging_level=logging.WARNING)
    log.info("Ray: %s", f"connected to {rollout_cfg.ray_address}" if rollout_cfg.ray_address
             else "started a local instance")


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
    """Raise `RayWaitError` when the rollout actors (and the `learner_ranks` of a learner group
    beside them) need more CPUs than a local Ray instance has (it never grows). Checked before
    models load, from the config alone (GPUs are counted by Ray once it runs:
    `engine_placement.place_engines`); a cluster (`ray_address`) is checked by the placement
    deadlines instead."""
    workers = rollout_workers(rollout_cfg, num_workers)
    if rollout_cfg.ray_address:
        return
    cpus_per_worker = rollout_cfg.cpus_per_worker
    if ray.is_initialized():
        total, source = ray.cluster_resources().get("CPU", 0.0), "already running"
    elif rollout_cfg.ray_num_cpus:
        total, source = float(rollout_cfg.ray_num_cpus), "rollout.ray_num_cpus"
    else:
        total, source = float(os.cpu_count() or 1), "rollout.ray_num_cpus unset: every core"
    learner = learner_ranks * cpus_per_rank
    if workers * cpus_per_worker + learner > total:
        asked = f"{workers} actors x {cpus_per_worker:g} CPUs = {workers * cpus_per_worker:g} CPUs"
        if learner:
            asked += (f", and the learner group {learner_ranks} ranks x {cpus_per_rank:g} CPUs = {learner:g} CPUs "
                      "(train.world_size x train.cpus_per_rank)")
        most = int(max(total - learner, 0.0) // cpus_per_worker)
        raise RayWaitError(
            f"the rollout pool asks for {asked}, but the local Ray instance has {total:g} CPUs ({source}); lower "
            f"rollout.num_workers (or `rollout --workers`) to at most {most}, lower rollout.cpus_per_worker"
            + (", or lower train.world_size or train.cpus_per_rank" if learner else "")
            + f", or raise rollout.ray_num_cpus (this machine has {os.cpu_count()} cores)")


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

    def connect() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except BaseException as err:  # handed to the caller's thread
            failure.append(err)

    thread = threading.Thread(target=connect, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RayWaitError(f"Ray at {address} accepted a connection but did not answer as a Ray cluster "
                           f"within {timeout_s:g}s (rollout.ray_connect_timeout_s). {fix}")
    if failure:
        raise RayWaitError(f"cannot connect to Ray at {address}: {failure[0]}. {fix}") from failure[0]
