"""A learner of `train.world_size` ranks: Ray actors in one placement group, joined by torch.distributed.

With `train.world_size` N > 1 the run's learner is N `LearnerRank` actors, each in its own
bundle of a placement group (`reserve`: `train.cpus_per_rank` CPUs, and one GPU when the cluster
has GPUs and `train.device` is not `cpu`; `train.placement_strategy` says whether the bundles pack
onto few nodes or spread over many). Each rank reports where it landed (node, GPUs, pid:
`LearnerGroup.placements`, logged at start); on GPUs the ranks of a node then see all of its
rank GPUs in one order and each picks its own (`rank_gpus`, as Ray Train does). Rank 0 reports
its node's address and a free port, every rank joins the process group there
(`collectives.join_process_group`: nccl with CUDA, gloo otherwise) and builds the ordinary `GRPOLearner`, policy and reference included; the driver
(`LearnerGroup`) holds no model. For each step the driver plans the batch's mini-batches, splits
each one over the ranks by whole GRPO groups (`batches.split_plan`) and sends every rank its
trajectories and its share; the ranks' losses are normalised by global counts, so N ranks make
the update one learner makes on the whole batch (`collectives` says how, under ddp and fsdp).

The ranks are one `cluster.actor_group.ActorGroup`, started, gathered and stopped as the rollout
engines are. Every wait on the ranks has the `train.dist_timeout_s` deadline. A rank that dies, raises or
passes the deadline fails the call with `LearnerRankError`, which names the rank (a dead rank
before the ranks that failed because of it; a `UserError` a rank raises, such as a damaged
checkpoint, is raised as itself); the group is then torn down at once (its actors killed, its
placement group released), and the run continues with `--resume` from its last checkpoint, at
any world size (`checkpoint`).
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import ray
import torch

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import Config
from prompt_r1.core.failures import UserError
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.weights import SyncHeader, WeightUpdate
from prompt_r1.cluster.engine_placement import describe_location
from prompt_r1.cluster.placement import in_group, reserve
from prompt_r1.cluster.actor_group import ActorCallError, ActorGroup, ActorWaitError
from prompt_r1.core.weights import UpdateRef
from prompt_r1.learner.batches import plan_mini_batches, split_plan
from prompt_r1.learner.rank_gpus import node_gpu_ids

log = logging.getLogger(__name__)

FAILURE_GRACE_S = 5.0  # after one rank fails, how long to wait for the others' errors (to find the cause)


class LearnerRankError(UserError, RuntimeError):
    """A learner rank died, failed or passed `train.dist_timeout_s`; `ranks` are the ranks named.

    A `UserError`: the CLI ends on its message (exit 2) rather than a traceback, because what to do
    next is the user's (look at the rank's node, then `--resume`)."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class LearnerRank:
    """One rank, as a Ray actor: a `GRPOLearner` whose collectives span the group."""

    def __init__(self, cfg: Config, model_path: str, rank: int, world_size: int, device: str):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        # as many compute threads as the bundle has CPUs: ranks sharing a node must not oversubscribe it
        torch.set_num_threads(max(1, int(cfg.train.cpus_per_rank)))
        self.cfg, self.model_path, self.rank, self.world_size, self.device = cfg, model_path, rank, world_size, device
        self.learner: Any = None

    def location(self) -> dict[str, Any]:
        """Where this rank runs: node, Ray's GPU ids, pid (`engine_placement.actor_location`)."""
        from prompt_r1.cluster.engine_placement import actor_location

        return actor_location()

    def share_gpus(self, visible: list[str]) -> str:
        """See the GPUs of every rank on this node and train on its own among them (`rank_gpus`);
        before anything touches CUDA. Returns the device."""
        from prompt_r1.learner.rank_gpus import adopt_node_gpus

        self.device = adopt_node_gpus(visible, ray.get_gpu_ids())
        return self.device

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port (asked of rank 0: the process group's store listens there)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, host: str, port: int) -> dict[str, Any]:
        """Join the process group, then build the learner (sharded under fsdp); returns where this
        rank runs (`engine_placement.actor_location`: node, GPU ids, pid)."""
        from prompt_r1.cluster.engine_placement import actor_location
        from prompt_r1.learner.grpo_learner import GRPOLearner
        from prompt_r1.learner.collectives import join_process_group

        ranks = join_process_group(self.cfg.train.strategy, self.rank, self.world_size, host, port,
                                   torch.device(self.device), self.cfg.train.dist_timeout_s)
        self.learner = GRPOLearner(self.cfg, self.model_path, device=self.device, ranks=ranks)
        return actor_location()

    def step(self, trajectories: list[Trajectory], plan: list[list[str]]) -> dict[str, float]:
        metrics = self.learner.step(trajectories, plan)
        if self.cfg.rollout.colocate and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the step's cached blocks back to the GPU: a colocated engine wakes into them
        return metrics

    def weights_for_sync(self, version: int) -> tuple[SyncHeader | None, WeightUpdate | None]:
        """Rank 0: the update's header and the update, two Ray return values, so the driver can
        fetch the small header alone (others: None, None)."""
        update = self.learner.weights_for_sync(version)
        return (update.header, update) if self.rank == 0 and update is not None else (None, None)

    def merged_state_dict(self) -> dict[str, torch.Tensor] | None:
        state = self.learner.merged_state_dict()
        # each its own storage: the tensors are views of one buffer, which torch's pickler (Ray's
        # return path) would send whole with every one of them
        return {k: v.clone() for k, v in state.items()} if self.rank == 0 else None

    def save_checkpoint(self, ckpt_dir: str, step: int, data_position: dict[str, Any]) -> str:
        from prompt_r1.learner.checkpoint import save_checkpoint

        return str(save_checkpoint(self.learner, Path(ckpt_dir), step, data_position, self.cfg))

    def load_checkpoint(self, path: str) -> tuple[int, dict[str, Any]]:
        from prompt_r1.learner.checkpoint import load_checkpoint

        return load_checkpoint(self.learner, Path(path))

    def shutdown(self) -> None:
        if self.learner is not None:
            self.learner.ranks.close()


def learner_device(train_device: str) -> str:
    """`cuda:0` when every rank gets a GPU of its own (the cluster has GPUs and `train.device` is
    not `cpu`), else `cpu`. A rank's device index is then its own GPU's among those of its node's
    ranks (`LearnerRank.share_gpus`), so a `cuda:N` index in `train.device` does not apply to ranks."""
    if train_device == "cpu":
        return "cpu"
    if ray.cluster_resources().get("GPU", 0.0) > 0:
        return "cuda:0"
    if train_device == "auto":
        return "cpu"
    raise ConfigError(f"train.device is {train_device!r} but the Ray cluster has no GPU for the learner ranks "
                      "(train.world_size > 1); use `auto` or `cpu`, or add GPU nodes")


class LearnerGroup:
    """The driver's handle on N learner ranks; the same interface as a learner in this process."""

    def __init__(self, cfg: Config, model_path: str | Path):
        """Place the ranks, start them and join their process group (within the deadlines of
        `train.placement_timeout_s` and `train.dist_timeout_s`); needs `ray.init` first."""
        train = cfg.train
        self.cfg, self.world_size, self.timeout_s = cfg, train.world_size, train.dist_timeout_s
        self.placements: list[dict[str, Any]] = []  # per rank: node_id, node_ip, gpu_ids, pid
        self.devices: list[str] = []  # per rank on GPUs: its device among its node's rank GPUs
        self.closed = False
        device = learner_device(train.device)
        gpus = 1 if device.startswith("cuda") else 0
        group = reserve(
            [{"CPU": train.cpus_per_rank, "GPU": gpus}] * self.world_size,
            what=f"the learner group ({self.world_size} ranks)", timeout_s=train.placement_timeout_s,
            field="train.placement_timeout_s", strategy=train.placement_strategy,
            fix="Lower train.world_size or train.cpus_per_rank, free the resources other Ray jobs hold, or add "
                "nodes" + ("" if gpus == 0 else " (train.device: cpu places the ranks without GPUs)")
                + ("" if not train.placement_strategy.startswith("STRICT") else
                   f"; train.placement_strategy {train.placement_strategy} may be more than the cluster allows"))
        # the ranks are named by number alone in errors (no `locate`): "learner rank 1 died during ..."
        self.ranks = ActorGroup("learner rank", groups=[group], name="learner group")
        try:
            self.ranks.start(
                LearnerRank, [(cfg, str(model_path), rank, self.world_size, device) for rank in range(self.world_size)],
                [{"num_cpus": train.cpus_per_rank, "num_gpus": gpus, "scheduling_strategy": in_group(group, rank)}
                 for rank in range(self.world_size)])
            if gpus:  # the ranks of a node see all its rank GPUs in one order, as in Ray Train (`rank_gpus`)
                visible = node_gpu_ids(self._gather(self.ranks.call("location"), "reporting GPUs"))
                self.devices = self._gather(self.ranks.call_each("share_gpus", [(v,) for v in visible]),
                                            "sharing the node's GPUs")
            ((host, port),) = self._gather([self.ranks.actors[0].rendezvous.remote()], "reporting rank 0's address")
            self.placements = self._gather(self.ranks.call("setup", host, port),
                                           "joining the process group and loading the model")
        except BaseException:
            self.close()
            raise
        log.info("learner group: %d ranks (%s, %s) joined at %s:%d", self.world_size, train.strategy, device,
                 host, port)
        for rank, where in enumerate(self.placements):
            log.info("%s", describe_location(rank, where, role="learner rank"))

    # -- the learner interface ------------------------------------------------------------------
    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One GRPO update: each rank trains its whole groups of every mini-batch."""
        train = self.cfg.train
        plan = plan_mini_batches(trajectories, train.mini_batch_questions, train.drop_uniform_groups,
                                 self.cfg.reward.turn_credit)
        shares = split_plan(plan, self.world_size)
        owner = {q: rank for rank, share in enumerate(shares) for mini in share for q in mini}
        # groups left out of the plan (train.drop_uniform_groups) still count in the group
        # metrics: rank 0 holds them
        parts = [[t for t in trajectories if owner.get(t.question_id, 0) == rank] for rank in range(self.world_size)]
        results = self._gather(self.ranks.call_each("step", list(zip(parts, shares))), "a GRPO step")
        return dict(results[0])  # the ranks summed the loss statistics and counts; rank 0 reports them

    def weights_for_sync(self, version: int) -> UpdateRef:
        """Rank 0's weight sync for the rollout workers (gathered by every rank under fsdp), left in
        the object store: this process fetches its header alone and hands the reference on."""
        actors = self.ranks.actors if self.cfg.train.strategy == "fsdp" else self.ranks.actors[:1]
        pairs = [a.weights_for_sync.options(num_returns=2).remote(version) for a in actors]
        header = self._gather([h for h, _ in pairs], "gathering the weights")[0]
        return UpdateRef(header, pairs[0][1])

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """Rank 0's full (merged) weights (gathered by every rank under fsdp)."""
        actors = self.ranks.actors if self.cfg.train.strategy == "fsdp" else self.ranks.actors[:1]
        return self._gather([a.merged_state_dict.remote() for a in actors], "gathering the weights")[0]

    def save_checkpoint(self, ckpt_dir: Path, step: int, data_position: dict[str, Any]) -> Path:
        """Rank 0 writes the full state (every rank takes part in gathering it)."""
        paths = self._gather(self.ranks.call("save_checkpoint", str(ckpt_dir), step, dict(data_position)),
                             f"saving the checkpoint of step {step}")
        return Path(paths[0])

    def load_checkpoint(self, path: Path) -> tuple[int, dict[str, Any]]:
        """Every rank loads the checkpoint (saved at any world size)."""
        return self._gather(self.ranks.call("load_checkpoint", str(path)), f"loading the checkpoint {path}")[0]

    def close(self) -> None:
        """Leave the process group, kill the actors, release the placement group; safe to repeat
        (a rank still in an interrupted step is killed without being asked: it would never get to it)."""
        if self.closed:
            return
        self.closed = True
        self.ranks.shutdown()

    def __enter__(self) -> "LearnerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- waiting on the ranks ---------------------------------------------------------------------
    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        """The ranks' results in rank order (ref i from rank i), within `train.dist_timeout_s`; a
        failure tears the group down and raises `LearnerRankError` naming the rank (a dead rank
        before the ranks that failed because of it), or a `UserError` a rank raised as itself."""
        if self.closed:
            raise LearnerRankError(f"the learner group was torn down after an earlier failure; cannot do {what}. "
                                   "Resume the run from its last checkpoint (--resume)", [])
        try:
            return self.ranks.gather(refs, what, timeout_s=self.timeout_s, field="train.dist_timeout_s",
                                     grace_s=min(FAILURE_GRACE_S, self.timeout_s))
        except (ActorCallError, UserError) as err:
            self._tear_down()
            if isinstance(err, ActorWaitError):
                late = err.indices
                raise _torn_down(f"learner rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} did not "
                                 f"finish {what} within {self.timeout_s:g}s (train.dist_timeout_s)", late) from err
            if isinstance(err, ActorCallError):
                oom = any(isinstance(e, ray.exceptions.OutOfMemoryError) for e in err.errors.values())
                raise _torn_down(str(err) + (" (lower train.micro_batch_size or train.world_size per node, or "
                                             "enable train.gradient_checkpointing)" if oom else ""),
                                 err.indices) from err
            raise  # a bad input a rank reports (a checkpoint, a setting): raised as itself

    def _tear_down(self) -> None:
        """Kill the ranks at once (a failed rank's peers may wait in a collective, so none is asked
        to clean up) and release their placement group."""
        self.closed = True
        self.ranks.kill()


def _torn_down(message: str, ranks: list[int]) -> LearnerRankError:
    return LearnerRankError(f"{message}. The learner group was torn down (placement group released); resume the "
                            "run from its last checkpoint (--resume)", ranks)
