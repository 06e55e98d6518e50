"""Learner ranks on one node see all of that node's rank GPUs, in one order, as Ray Train's ranks do.

Ray gives each rank (an actor asking for one GPU) its own `CUDA_VISIBLE_DEVICES`, a single id,
not necessarily rank r's GPU r. NCCL between processes that each see one different GPU is where
known failures live on NVSwitch H100/H200 nodes: NVLS all-gather and reduce-scatter (exactly
FSDP2's collectives) return chunks in the wrong rank order when the visible devices are permuted
(NVIDIA/nccl#1906, silent), and the first collective takes 3-30 s with cuMem when the processes
cannot see each other's devices (NVIDIA/nccl#1749, pytorch/pytorch#147502). Ray Train's torch
backend avoids them by sharing (`share_cuda_visible_devices`): every worker on a node sees the
GPU ids of all workers on that node, and picks its own by its index among them.

The same here, before any rank touches CUDA: the driver gathers each rank's node and Ray GPU ids
(`engine_placement.actor_location`), `node_gpu_ids` gives each rank the sorted ids of its node's
ranks, and each rank sets `CUDA_VISIBLE_DEVICES` to them and uses `cuda:<its own id's index>`
(`adopt_node_gpus`). Rollout engines keep their own GPUs (nothing to share: no collective spans
them). Checked on CPU with Ray's fake GPUs (`tests/test_rank_gpus.py`); not yet on real GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


def _gpu_order(gpu_id: str) -> tuple[int, int | str]:
    """Numeric ids in number order (2 before 10), then any other (UUIDs) as text."""
    return (0, int(gpu_id)) if gpu_id.isdigit() else (1, gpu_id)


def node_gpu_ids(locations: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per rank, the GPU ids of every rank on its node (`node_id`), sorted: what it should see.

    >>> node_gpu_ids([{"node_id": "a", "gpu_ids": ["3"]}, {"node_id": "a", "gpu_ids": ["1"]},
    ...               {"node_id": "b", "gpu_ids": ["0"]}, {"node_id": "a", "gpu_ids": ["10"]}])
    [['1', '3', '10'], ['1', '3', '10'], ['0'], ['1', '3', '10']]
    """
    by_node: dict[str, set[str]] = {}
    for where in locations:
        by_node.setdefault(where["node_id"], set()).update(str(i) for i in where["gpu_ids"])
    shared = {node: sorted(ids, key=_gpu_order) for node, ids in by_node.items()}
    return [list(shared[where["node_id"]]) for where in locations]


def adopt_node_gpus(visible: Sequence[str], own: Sequence[Any]) -> str:
    """Inside a rank, before CUDA is initialised: see `visible` (its node's rank GPUs) and return
    the device of its own GPU `own` (Ray's `ray.get_gpu_ids()`: exactly one) among them.

    >>> import os; before = os.environ.get("CUDA_VISIBLE_DEVICES")
    >>> adopt_node_gpus(["1", "3", "10"], own=[3]), os.environ["CUDA_VISIBLE_DEVICES"]
    ('cuda:1', '1,3,10')
    >>> _ = os.environ.pop("CUDA_VISIBLE_DEVICES") if before is None else os.environ.update(CUDA_VISIBLE_DEVICES=before)
    """
    if len(own) != 1 or str(own[0]) not in visible:
        raise RuntimeError(f"a learner rank should hold exactly one GPU of {list(visible)}, Ray gave it {list(own)}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
    return f"cuda:{list(visible).index(str(own[0]))}"
