"""Checkpoints that resume a run exactly and export to a plain HF model folder.

A checkpoint is a folder `ckpt_dir/step-000N/` holding:
- the weights in HF format: the full model (`save_pretrained`) or, under LoRA, the adapter
  (`adapter_config.json` + `adapter_model.safetensors`, whose base is the run's model path);
- the tokenizer, the resolved `config.yaml`;
- `trainer_state.pt`: optimiser, lr scheduler, RNG states (python, numpy, torch), the step
  and the data position.
It is written to a hidden temp folder and renamed into place, so a crash never leaves a
half-written `step-*` folder; only the newest `keep_checkpoints` are kept.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml

from prompt_r1.config import Config

if TYPE_CHECKING:
    from prompt_r1.trainer import GRPOLearner

STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FILE = "trainer_state.pt"
ADAPTER_CONFIG = "adapter_config.json"


def step_dir_name(step: int) -> str:
    """
    >>> step_dir_name(7)
    'step-000007'
    """
    return f"step-{step:06d}"


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in `ckpt_dir`, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for child in ckpt_dir.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    found = list_checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(learner: GRPOLearner, ckpt_dir: Path, step: int, data_position: dict[str, Any],
                    config: Config) -> Path:
    """Write `ckpt_dir/step-N/` atomically and prune old ones; returns the folder."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    learner.model.save_pretrained(tmp)  # full model, or the adapter under LoRA
    learner.tokenizer.save_pretrained(tmp)
    (tmp / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    torch.save({
        "step": step,
        "data_position": dict(data_position),
        "optimizer": learner.optimizer.state_dict(),
        "scheduler": learner.scheduler.state_dict(),
        "rng": rng_state(),
        "base_model_path": learner.model_path,
        "lora": learner.use_lora,
    }, tmp / STATE_FILE)
    if final.exists():  # re-saving a step (e.g. forced final save): replace it
        old = ckpt_dir / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    for _, stale in list_checkpoints(ckpt_dir)[:-config.train.keep_checkpoints]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _read_state(path: Path) -> dict[str, Any]:
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    return torch.load(state_file, map_location="cpu", weights_only=False)


@torch.no_grad()
def load_checkpoint(learner: GRPOLearner, path: Path) -> tuple[int, dict[str, Any]]:
    """Restore weights, optimiser, scheduler and RNG into `learner`; returns (step, data_position)."""
    path = Path(path)
    state = _read_state(path)
    is_adapter = (path / ADAPTER_CONFIG).is_file()
    if is_adapter != learner.use_lora:
        raise ValueError(f"checkpoint {path} is {'a LoRA adapter' if is_adapter else 'a full model'} but "
                         f"the config has agent.lora.enabled={learner.use_lora}; use the run's config")
    if is_adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(learner.model, load_file(str(path / "adapter_model.safetensors")))
    else:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(path, dtype=next(learner.model.parameters()).dtype)
        learner.model.load_state_dict(saved.state_dict())
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return int(state["step"]), dict(state["data_position"])


def load_merged_model(ckpt: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A plain HF model from a checkpoint (LoRA adapters merged into their base)."""
    from transformers import AutoModelForCausalLM

    ckpt = Path(ckpt)
    if not (ckpt / ADAPTER_CONFIG).is_file():
        return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype)
    from peft import PeftModel

    base_path = _read_state(ckpt)["base_model_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    return PeftModel.from_pretrained(base, ckpt).merge_and_unload()


def export_checkpoint(ckpt: Path, out_dir: Path) -> Path:
    """Write a plain HF model folder (merged weights + tokenizer) that any tool can load."""
    from transformers import AutoTokenizer

    ckpt, out_dir = Path(ckpt), Path(out_dir)
    if not (ckpt / STATE_FILE).is_file() and not (ckpt / "config.json").is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint folder (no {STATE_FILE} or config.json)")
    state = _read_state(ckpt) if (ckpt / STATE_FILE).is_file() else {}
    dtype = torch.bfloat16 if _saved_dtype(ckpt, state) == "bfloat16" else torch.float32
    model = load_merged_model(ckpt, dtype)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(ckpt).save_pretrained(tmp)
    for extra in ("generation_config.json",):
        source = Path(state.get("base_model_path", ckpt)) / extra
        if source.is_file() and not (tmp / extra).exists():
            shutil.copy(source, tmp / extra)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def _saved_dtype(ckpt: Path, state: dict[str, Any]) -> str:
    config_file = ckpt / "config.yaml"
    if config_file.is_file():
        return (yaml.safe_load(config_file.read_text()) or {}).get("agent", {}).get("dtype", "float32")
    return "float32"
