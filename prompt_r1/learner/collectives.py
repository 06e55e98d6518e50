"""What differs between one learner and one rank of N: the collectives `GRPOLearner` calls.

`GRPOLearner` runs the same update code alone or as a rank of a `LearnerGroup`; what changes is
the `Ranks` object it holds:

- `Ranks` (world size 1, the in-process learner): every collective is the identity and the
  model is used as built, so one learner computes what a single process computes.
- `ReplicatedRanks` (`train.strategy: ddp`): every rank holds all weights and trains its own
  whole GRPO groups; after a mini-batch's backward passes the gradients are SUMMED over ranks
  (bucketed all-reduces, once per optimiser step rather than per backward as DDP would), so
  every rank takes the same AdamW step from the same gradient.
- `ShardedRanks` (`train.strategy: fsdp`): FSDP2 `fully_shard` over an explicit 1-D device mesh
  (weights, gradients and AdamW state sharded); its reduce-scatter is set to SUM too. A forward
  pass is then a collective (it all-gathers weights), so every rank must run as many of them:
  `matched_forwards` tells the learner to pad short ranks with empty micro-batches.

Summing is right because the learner weights each micro-batch's loss by the GLOBAL token (or
sequence) count of its mini-batch (`sum`): the ranks' gradients add up to the gradient one
learner computes on the whole batch, and gradient clipping then sees the global norm.

Start-up under FSDP (`builds_on_meta`): every rank builds the model on the meta device (no
memory), rank 0 alone reads the weights into host memory, and `distribute` shards the empty model,
allocates each rank's shards on its device and fills them from rank 0, one tensor at a time
(`set_model_state_dict(..., broadcast_from_rank0=True)`); the buffers a state dict leaves out
(rotary frequencies) are broadcast from rank 0 too. No rank but 0 ever holds a full weight but
the one being broadcast.

Checkpoints and weight broadcasts need the full weights in the plain HF format: `full_state_dict`
gathers them (a collective under FSDP: every rank calls it, rank 0 gets the result), and
`load_state_dict` puts a full state that rank 0 read back on every rank (broadcast from rank 0).
The optimiser state never travels whole: each rank saves and loads its own part with
torch.distributed.checkpoint (`checkpoint`). `load_optimizer_state` reads the full, index-keyed
optimiser state that checkpoints held before that (every rank passes all of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

BUCKET_ELEMENTS = 1 << 24  # gradient elements per all-reduce (64 MiB of float32): few, large collectives


def dist_backend(device: torch.device) -> str:
    """`nccl` for CUDA when this torch has it, else `gloo`: one backend, never a mixed string
    such as "cpu:gloo,cuda:nccl" (CPU wheels have no NCCL, and that string fails there).

    >>> dist_backend(torch.device("cpu"))
    'gloo'
    """
    import torch.distributed as dist

    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


class Ranks:
    """World size 1: the learner alone; every collective is the identity."""

    rank = 0
    world_size = 1
    matched_forwards = False  # must every rank run the same number of forward passes?
    builds_on_meta = False  # do ranks build an empty model that `distribute` fills from rank 0?

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over ranks."""
        return [float(v) for v in values]

    def max(self, values: Sequence[float]) -> list[float]:
        """Each value's maximum over ranks."""
        return [float(v) for v in values]

    def distribute(self, model: torch.nn.Module, source: torch.nn.Module | None = None,
                   mixed_precision: torch.dtype | None = None) -> torch.nn.Module:
        """The model as this group trains it (sharded under FSDP); call before building the optimiser.
        Under `builds_on_meta`, `model` is built on the meta device and `source` is rank 0's built
        model (None elsewhere) whose weights fill it; `mixed_precision` is the dtype FSDP gathers
        weights in for compute (None: as stored)."""
        return model

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a small picklable object)."""
        return value

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Make every rank's gradients the sum over ranks (FSDP did so in the backward pass)."""

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Clip by the global gradient norm; returns that norm (before clipping)."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights, gathered (rank 0 gets them, others an empty dict); None when the
        model in this process already holds all of them (save it as it is)."""
        return None

    def load_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load full weights: rank 0 passes the whole dict, the others `{}` (they get it from rank 0)."""
        model.load_state_dict(state)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             names: Sequence[str], state: dict[str, Any]) -> None:
        """Load a full optimiser state in `optimizer.state_dict()`'s format, keyed by the position
        of the parameter names `names` (older checkpoints; every rank passes all of it)."""
        optimizer.load_state_dict(state)

    def close(self) -> None:
        """Leave the process group (nothing to leave alone)."""


class ReplicatedRanks(Ranks):
    """`ddp`: all weights on every rank, gradients summed over ranks before each optimiser step."""

    def __init__(self, rank: int, world_size: int, device: torch.device):
        import torch.distributed as dist

        self.rank, self.world_size, self.device = rank, world_size, device
        # the small collectives (counts, metrics) go where the backend wants its tensors
        self.comm_device = device if dist_backend(device) == "nccl" else torch.device("cpu")

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        import torch.distributed as dist

        # float64: token counts and metric sums stay exact integers / close to the 1-rank sums
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.MAX)

    @torch.no_grad()
    def distribute(self, model: torch.nn.Module, source: torch.nn.Module | None = None,
                   mixed_precision: torch.dtype | None = None) -> torch.nn.Module:
        """Every rank starts from rank 0's trainable weights (as DDP does; they are equal anyway:
        the same file and the same seeded adapter initialisation)."""
        import torch.distributed as dist

        for param in model.parameters():
            if param.requires_grad:
                dist.broadcast(param.data, src=0)
        return model

    def broadcast_object(self, value: Any) -> Any:
        import torch.distributed as dist

        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @torch.no_grad()
    def load_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Rank 0 loads the dict, then every weight and buffer is broadcast from it (one host copy
        of the checkpoint per node's rank 0, not per rank)."""
        import torch.distributed as dist

        if self.rank == 0:
            model.load_state_dict(state)
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)

    @torch.no_grad()
    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks. A rank with no data in this mini-batch has no gradient:
        it sends zeros; a parameter no rank has a gradient for keeps none (AdamW skips it, as it
        would for one learner)."""
        import torch.distributed as dist

        present = torch.tensor([p.grad is not None for p in params], dtype=torch.int64, device=self.comm_device)
        dist.all_reduce(present)
        grads = []
        for param, count in zip(params, present.tolist()):
            if count == 0:
                continue
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        bucket: list[torch.Tensor] = []
        size = 0
        for grad in grads:
            bucket.append(grad)
            size += grad.numel()
            if size >= BUCKET_ELEMENTS:
                _all_reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            _all_reduce_bucket(bucket)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _all_reduce_bucket(grads: list[torch.Tensor]) -> None:
    """Sum a list of same-device tensors over ranks in one collective (flattened, then copied back)."""
    import torch.distributed as dist

    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


class ShardedRanks(ReplicatedRanks):
    """`fsdp`: FSDP2 `fully_shard` per transformer block and at the root, over a 1-D mesh."""

    matched_forwards = True
    builds_on_meta = True

    def __init__(self, rank: int, world_size: int, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh

        super().__init__(rank, world_size, device)
        # an explicit mesh on the learner's device: the default follows the accelerator, and a
        # CPU (gloo) group sharding onto CUDA fails (pytorch#132471)
        self.mesh = init_device_mesh(device.type, (world_size,))

    @torch.no_grad()
    def distribute(self, model: torch.nn.Module, source: torch.nn.Module | None = None,
                   mixed_precision: torch.dtype | None = None) -> torch.nn.Module:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # buffers no state dict holds (rotary frequencies): rank 0's, broadcast below
        loose = [name for name, _ in model.named_buffers() if name not in model.state_dict()]
        # weights gathered in the compute dtype, gradients reduced in float32 (master weights stay float32)
        policy = (MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32)
                  if mixed_precision is not None else MixedPrecisionPolicy())
        block_types = set(getattr(model, "_no_split_modules", None) or ())  # HF: the decoder layer class
        units = [m for m in model.modules() if type(m).__name__ in block_types]
        for unit in units:
            fully_shard(unit, mesh=self.mesh, mp_policy=policy)
        fully_shard(model, mesh=self.mesh, mp_policy=policy)
        for unit in [*units, model]:
            unit.set_gradient_divide_factor(1.0)  # sum, not mean: the loss already has the global count
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=self.device)  # this rank's shards only
            if self.rank == 0 and source is None:
                raise ValueError("ShardedRanks.distribute: rank 0 needs the source model to fill a meta model")
            self.load_state_dict(model, source.state_dict() if self.rank == 0 else {})
            own = dict(model.named_buffers())
            theirs = dict(source.named_buffers()) if self.rank == 0 else {}
            for name in loose:
                if self.rank == 0:
                    own[name].copy_(theirs[name])
                dist.broadcast(own[name], src=0)
        return model

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Nothing to do: FSDP reduce-scattered (summed) every backward pass."""

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # over the DTensor shards: global
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # gathering copies tied weights apart (lm_head = embeddings); share them again, so that
        # `save_pretrained` stores them once, as it does for the unsharded model
        for alias, source in tied_aliases(model).items():
            if alias in full and source in full:
                full[alias] = full[source]
        return full

    def load_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Rank 0's full dict, broadcast one tensor at a time; each rank keeps its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # a copy: set_model_state_dict replaces the dict's tensors by DTensors in place
        set_model_state_dict(model, dict(state),
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             names: Sequence[str], state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, optimizer_state_by_name(state, names),
                                 options=StateDictOptions(full_state_dict=True))
        # it hands hyperparameters back rebuilt (AdamW's betas tuple becomes a list): keep the
        # saved values, so that saving again writes what was loaded
        for group, saved in zip(optimizer.param_groups, state["param_groups"]):
            group.update({key: value for key, value in saved.items() if key != "params"})


def join_process_group(strategy: str, rank: int, world_size: int, host: str, port: int,
                       device: torch.device, timeout_s: float) -> Ranks:
    """Join the learner group's process group (rank 0 listens at `host:port`) and return the
    `Ranks` of `strategy`. Collectives that wait longer than `timeout_s` fail. One rank joins
    nothing: it gets the identity `Ranks` (no process group, no gradient buckets, no sharding)."""
    import torch.distributed as dist

    if device.type == "cuda":  # before the group: nccl and the device mesh use the current device
        torch.cuda.set_device(device)
    if world_size == 1:
        return Ranks()
    where = f"[{host}]" if ":" in host else host  # an IPv6 address
    dist.init_process_group(dist_backend(device), init_method=f"tcp://{where}:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return (ShardedRanks if strategy == "fsdp" else ReplicatedRanks)(rank, world_size, device)


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """State-dict keys that hold the same tensor as an earlier key (tied weights), mapped to it.

    >>> lin = torch.nn.Linear(2, 2); model = torch.nn.ModuleDict({"a": lin, "b": torch.nn.Linear(2, 2)})
    >>> model["b"].weight = lin.weight
    >>> tied_aliases(model)
    {'b.weight': 'a.weight'}
    """
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def optimizer_state_by_name(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A full optimiser state in `optimizer.state_dict()`'s format (parameter `names[i]` at index i)
    keyed by name, as torch.distributed.checkpoint's `set_optimizer_state_dict` takes it.

    >>> optimizer_state_by_name({"state": {1: {"step": 1}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
    ...                         ["a", "b"])
    {'state': {'b': {'step': 1}}, 'param_groups': [{'lr': 0.1, 'params': ['a', 'b']}]}
    """
    # inner dicts copied: set_optimizer_state_dict replaces their tensors in place
    return {"state": {names[int(i)]: dict(value) for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                             for group in state["param_groups"]]}
