"""What leaves the learner: the weight sync for the rollout engines and the merged HF weights.

After every update the engines need the learner's weights in their own dtype. Three forms:
`on_device_update` (engines that share the learner's GPU, `rollout.colocate`: one cast copy on the
device, `sync_copy.device_copy`), `adapter_update` (LoRA: the adapter alone, float32, a few MB,
with its LoraConfig) and `merged_state_dict` (plain HF names, LoRA deltas merged in, on the CPU in
one pinned buffer, `sync_copy.host_copy`): the full-weight sync, and under LoRA the merged model
that engines running the adapter must match. `GRPOLearner.weights_for_sync` picks the form.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from prompt_r1.core.weights import WeightUpdate, peft_config_dict
from prompt_r1.learner.collectives import Ranks
from prompt_r1.learner.sync_copy import device_copy, host_copy


@torch.no_grad()
def on_device_update(model: torch.nn.Module, skip: Collection[str], dtype: torch.dtype, device: torch.device,
                     version: int) -> WeightUpdate:
    """The full weights but `skip`, cast to `dtype` in one buffer on `device`, as policy `version`."""
    state = {k: v for k, v in model.state_dict().items() if k not in skip}
    return WeightUpdate.make(version, "full", device_copy(state, dtype, device), on_device=True)


@torch.no_grad()
def adapter_update(model: torch.nn.Module, version: int) -> WeightUpdate:
    """The LoRA adapter (PEFT's `get_peft_model_state_dict`, float32, on the CPU) with its LoraConfig."""
    from peft import get_peft_model_state_dict

    adapter = {k: v.detach().to("cpu", torch.float32, copy=True)
               for k, v in get_peft_model_state_dict(model).items()}
    return WeightUpdate.make(version, "adapter", adapter, peft_config_dict(model.peft_config["default"]))


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, ranks: Ranks, use_lora: bool, dtype: torch.dtype,
                      skip: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """Plain HF state dict of the current weights (LoRA deltas merged in, model untouched), on the
    CPU in `dtype`, without the names in `skip`. Without LoRA the tensors are views of one host
    buffer (`host_copy`: pickle them as a `WeightUpdate`, or clone them). Under FSDP every rank
    must call it (the weights are gathered); rank 0 gets them, others `{}`."""
    if not use_lora:
        full = ranks.full_state_dict(model)  # gathered under FSDP (rank 0; others get {})
        weights = model.state_dict() if full is None else full
        return host_copy({k: v for k, v in weights.items() if k not in skip}, dtype)
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and module.active_adapters:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.weight"] = delta
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        clean = key.replace(".base_layer.", ".")
        if ".lora_" in key or "lora_embedding" in key or clean in skip:
            continue
        tensor = value.detach().float()
        if clean in deltas:
            tensor = tensor + deltas[clean].float()
        out[clean] = tensor.to("cpu", dtype, copy=True)
    return out
