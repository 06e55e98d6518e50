"""The one interface a training run has to its learner, whether it lives in this process or in N ranks.

`TrainingSession` talks to its learner only through `Learner`: `step` (one GRPO update on a
rollout batch), `weights_for_sync` (the versioned weights for the rollout workers),
`save_checkpoint` / `load_checkpoint` (the world-size-independent format of `checkpoint`) and
`close`. `open_learner` gives the right one for `train.world_size`:

- N > 1: `LearnerGroup`, N Ray actors joined by torch.distributed; this process holds no model;
- 1 with GPUs in reach (`train.device` not `cpu` and the Ray cluster has GPUs): a `LearnerGroup`
  of one rank, so the learner's GPU is one Ray placed and hands to no rollout engine, and the
  driver still holds no model and never touches CUDA;
- 1 otherwise (CPU): `LocalLearner`, the `GRPOLearner` in this process (no actor to start, and
  the one-process path that tests and CPU runs rely on).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prompt_r1.config.experiment import Config
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.weights import WeightUpdate

if TYPE_CHECKING:
    from prompt_r1.core.weights import UpdateRef


class Learner(Protocol):
    """What a training run needs of a learner."""

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One GRPO update; returns its metrics (loss statistics, group counts, throughput; the
        batch's `rollout_stats` are the caller's to add)."""
        ...

    def weights_for_sync(self, version: int) -> WeightUpdate | UpdateRef:
        """The rollout engines' weight sync as policy `version`: full weights, or the LoRA adapter
        alone (from ranks: left in the object store, see `core.weights.UpdateRef`)."""
        ...

    def save_checkpoint(self, ckpt_dir: Path, step: int, data_position: dict[str, Any]) -> Path:
        """Write `ckpt_dir/step-N/` (see `checkpoint.save_checkpoint`); returns the folder."""
        ...

    def load_checkpoint(self, path: Path) -> tuple[int, dict[str, Any]]:
        """Restore a checkpoint saved at any world size; returns (step, data_position)."""
        ...

    def close(self) -> None:
        """Release what the learner holds (processes, placement groups); safe to repeat."""
        ...


class LocalLearner:
    """World size 1: the `GRPOLearner` in this process."""

    def __init__(self, cfg: Config, model_path: str | Path):
        from prompt_r1.learner.grpo_learner import GRPOLearner  # looked up at call time (tests replace it)

        self.cfg = cfg
        self.learner = GRPOLearner(cfg, model_path)

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        return self.learner.step(trajectories)

    def weights_for_sync(self, version: int) -> WeightUpdate:
        update = self.learner.weights_for_sync(version)
        assert update is not None  # a learner alone is rank 0
        return update

    def save_checkpoint(self, ckpt_dir: Path, step: int, data_position: dict[str, Any]) -> Path:
        from prompt_r1.learner.checkpoint import save_checkpoint

        return save_checkpoint(self.learner, ckpt_dir, step, data_position, self.cfg)

    def load_checkpoint(self, path: Path) -> tuple[int, dict[str, Any]]:
        from prompt_r1.learner.checkpoint import load_checkpoint

        return load_checkpoint(self.learner, path)

    def close(self) -> None:
        """Nothing to release: the model goes with this object."""


def learner_in_ray(cfg: Config) -> bool:
    """Whether the learner runs as Ray actors: always for N > 1 ranks, and for one rank when it
    would train on a GPU (`train.device` not `cpu` and the Ray cluster, started here if need be,
    has GPUs: counted by Ray, so this process never touches CUDA)."""
    if cfg.train.world_size > 1:
        return True
    if cfg.train.device == "cpu":
        return False
    import ray

    from prompt_r1.cluster.connect import cpus_needed, init_ray

    init_ray(cfg.rollout, cpus_needed(cfg))
    return ray.cluster_resources().get("GPU", 0.0) > 0


@contextmanager
def open_learner(cfg: Config, model_path: str | Path) -> Iterator[Learner]:
    """The learner `train.world_size` asks for (see the module docstring), closed when the block
    ends (a group starts Ray with `rollout`'s settings if it is not running yet)."""
    if not learner_in_ray(cfg):
        yield LocalLearner(cfg, model_path)
        return
    from prompt_r1.cluster.connect import cpus_needed, init_ray
    from prompt_r1.learner.ray_group import LearnerGroup

    init_ray(cfg.rollout, cpus_needed(cfg))
    group = LearnerGroup(cfg, model_path)
    try:
        yield group
    finally:
        group.close()
