"""What the learner trains: the policy and its frozen reference, built and laid out over the ranks.

Float32 master weights whatever `agent.dtype` says (that is the rollout and compute dtype), with
the LoRA adapter when `agent.lora.enabled`. The frozen reference of full fine-tuning is held in
bfloat16 on a GPU (it never updates), in float32 on the CPU; under LoRA the reference is the policy
with the adapter disabled, so none is built.

Start-up memory: a learner alone (or a DDP rank) reads the float32 model into host memory and
moves it to its device (4 bytes a parameter, 8 with the reference before it is cast). FSDP ranks
build on the meta device; rank 0 alone reads the float32 model into host memory (4 bytes a
parameter, once per group) and every rank's device receives only its shards, plus one full
tensor at a time while it is broadcast (`collectives`).
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM

from prompt_r1.config.experiment import Config
from prompt_r1.learner.collectives import Ranks
from prompt_r1.models.bundled import model_load_errors


def build_policy(cfg: Config, model_path: str, ranks: Ranks, device: torch.device,
                 mixed_precision: torch.dtype | None) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy and its frozen reference (None under LoRA, whose reference is the policy with
    the adapter off, and when `train.kl_coef` is 0), built and laid out as the group trains
    them (`Ranks.distribute`: FSDP shards, DDP starts every rank from rank 0's weights), before
    the optimiser sees the parameters; the identity layout for a learner alone."""
    train = cfg.train
    # the frozen reference in the compute dtype on a GPU (half the memory; its forward runs
    # in that dtype anyway); on the CPU in float32, as the tests compare values
    on_gpu_in_bf16 = device.type == "cuda" and cfg.agent.dtype == "bfloat16"
    ref_dtype = torch.bfloat16 if on_gpu_in_bf16 else torch.float32
    with_reference = not cfg.agent.lora.enabled and train.kl_coef > 0
    reference: torch.nn.Module | None = None
    if ranks.builds_on_meta:
        # FSDP: rank 0 alone reads the weights (host memory); every rank builds empty models
        # that `distribute` shards and fills from rank 0 (see `collectives`)
        source = build_model(cfg, model_path, meta=False) if ranks.rank == 0 else None
        torch.set_rng_state(ranks.broadcast_object(torch.get_rng_state()))  # as after rank 0's build
        model = build_model(cfg, model_path, meta=True)
        if with_reference:
            reference = build_model(cfg, model_path, meta=True, lora=False).to(ref_dtype)
    else:
        source = None
        model = build_model(cfg, model_path, meta=False).to(device)
        if with_reference:
            reference = copy.deepcopy(model).to(ref_dtype)
    if reference is not None:
        reference.eval().requires_grad_(False)
    model.config.use_cache = False
    if train.gradient_checkpointing:
        # non-reentrant: works with frozen inputs (LoRA) and needs no input-grad hooks
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = ranks.distribute(model, source, mixed_precision)
    if reference is not None:
        reference = ranks.distribute(reference, source, mixed_precision)
    return model, reference


def build_model(cfg: Config, model_path: str, meta: bool, lora: bool | None = None) -> torch.nn.Module:
    """The policy as the run configures it, on the CPU in float32 (master weights, whatever
    agent.dtype says: that is the rollout/compute dtype), or empty on the meta device; with the
    LoRA adapter when `lora` (default: agent.lora.enabled)."""
    with model_load_errors(model_path, "agent.model"):
        if meta:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model_path)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.eval()  # as from_pretrained leaves it
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if cfg.agent.lora.enabled if lora is None else lora:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model

        lora_cfg = cfg.agent.lora
        model = get_peft_model(model, PeftLoraConfig(
            r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
            target_modules=lora_cfg.target_modules, task_type="CAUSAL_LM"))  # a list, or peft's "all-linear"
    return model
