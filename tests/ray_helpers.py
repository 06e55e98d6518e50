"""A local Ray instance with fake GPUs, the one way tests start it: Ray's logical GPU resources
on a machine without one (Ray still assigns ids and sets `CUDA_VISIBLE_DEVICES` in each actor)."""

from __future__ import annotations

import os


def init_fake_gpu_ray(num_cpus: int, num_gpus: int) -> None:
    """Stop any Ray of this process, then start a local one with `num_gpus` fake GPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    hidden = os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses fake GPUs when it is empty
    try:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
    finally:
        if hidden is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
