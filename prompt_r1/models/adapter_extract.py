"""A full-weight agent kept as a LoRA adapter: each linear layer's change, truncated to rank r.

Why: an agent trained with full weights is a whole model folder (hundreds of MiB), too large to
keep in a repository, while an adapter folder (`prompt_r1.models.adapter`) is kept anywhere and
merged onto its base wherever it is used. The change a training made to a linear layer, W_tuned -
W_base, cut to its top r singular directions is the closest rank-r matrix to it (Eckart-Young, in
Frobenius norm), and a rank-r matrix is exactly what a LoRA adapter adds: B @ A with scale 1
(`lora_alpha` = r). The rest is lost: what lies past rank r in each layer, and any change to the
embeddings and norms, which an adapter on linear layers cannot carry. `extract_adapter` says how
much of the change it kept (`kept_share`), and the result is an approximation to be measured as an
agent of its own, never taken for the full-weight one.

The base is the one the training started from: the `agent.model` of the training config the
folder carries (an export's `prompt-r1-training-config.yaml`), recorded as `export_adapter`
records it, so `merged_agent` finds it on another machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml

from prompt_r1.core.fsutil import atomic_dir
from prompt_r1.models.agent_files import ADAPTER_CONFIG, TRAINING_CONFIG, AgentSpecError, training_config_file

WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how PEFT names a causal LM's modules in a saved adapter


def low_rank_factors(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) with B @ A the best rank-`rank` approximation of `delta` (out x in): the singular
    values split evenly between the factors so neither is large where the other is small.

    >>> d = torch.outer(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0, 1.0]))
    >>> b, a = low_rank_factors(d, 1)
    >>> b.shape, a.shape, bool(torch.allclose(b @ a, d, atol=1e-5))
    (torch.Size([2, 1]), torch.Size([1, 3]), True)
    """
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).float(), (root[:, None] * vh[:rank]).float()


def linear_changes(base: dict[str, torch.Tensor], tuned: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Module name -> W_tuned - W_base for every 2-D weight of a linear layer inside the decoder
    layers (the embeddings and the output head, tied to them in small models, are left out)."""
    changes = {}
    for key, weight in tuned.items():
        if key.endswith(".weight") and weight.dim() == 2 and ".layers." in key:
            if key not in base or base[key].shape != weight.shape:
                raise ValueError(f"{key}: the base has no weight of shape {tuple(weight.shape)}; is it the model "
                                 "this agent was trained from?")
            changes[key[: -len(".weight")]] = weight.double() - base[key].double()
    return changes


def trained_from(folder: Path) -> str:
    """The `agent.model` of the training config `folder` carries: the base its training started from."""
    config_file = training_config_file(folder)
    model = yaml.safe_load(config_file.read_text()).get("agent", {}).get("model") if config_file else None
    if not model:
        raise AgentSpecError(f"{folder} carries no training config naming agent.model ({TRAINING_CONFIG}): "
                             "extract an adapter from a run's exported agent, which names the model it started from")
    return model


def extract_adapter(folder: Path, out_dir: Path, rank: int, dtype: torch.dtype = torch.float16) -> dict:
    """Keep full-weight agent `folder` (an HF folder with its training config) as a rank-`rank`
    LoRA adapter in `out_dir` (new; built beside it and renamed into place): adapter_config.json
    naming the base it was trained from, the factors in `dtype`, the training config. Returns what
    it kept: `base`, `rank`, `modules`, `kept_share` (of the linear layers' change, squared
    Frobenius norm) and `left_out_share` (of the whole change: embeddings, norms)."""
    from safetensors.torch import load_file, save_file

    from prompt_r1.models.bundled import resolve_model

    folder, out_dir = Path(folder), Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; name a new folder for the adapter")
    base_name = trained_from(folder)
    base = load_file(str(Path(resolve_model(base_name)) / "model.safetensors"))
    tuned = load_file(str(folder / "model.safetensors"))
    changes = linear_changes(base, tuned)
    linear = sum(d.pow(2).sum().item() for d in changes.values())
    rest = sum((tuned[k].double() - base[k].double()).pow(2).sum().item()
               for k in tuned if k in base and k[: -len(".weight")] not in changes)
    factors, kept = {}, 0.0
    for module, delta in changes.items():
        b, a = low_rank_factors(delta, rank)
        kept += (b.double() @ a.double()).pow(2).sum().item()
        factors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a.to(dtype).contiguous()
        factors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = b.to(dtype).contiguous()
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
              "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "base_model_name_or_path": base_name,
              "target_modules": sorted({m.rsplit(".", 1)[1] for m in changes})}
    with atomic_dir(out_dir) as tmp:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(factors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        shutil.copy(training_config_file(folder), tmp / TRAINING_CONFIG)
    return {"base": base_name, "rank": rank, "modules": len(changes),
            "kept_share": kept / linear if linear else 1.0,
            "left_out_share": rest / (linear + rest) if linear + rest else 0.0}
