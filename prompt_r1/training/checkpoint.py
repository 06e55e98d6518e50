"""Checkpoints that resume a run exactly and export to a plain HF model folder.

A checkpoint is a folder `ckpt_dir/step-000N/` holding:
- the weights in HF format: the full model (`save_pretrained`) or, under LoRA, the adapter
  (`adapter_config.json` + `adapter_model.safetensors`, whose base is the run's model path);
- the tokenizer, the resolved `config.yaml`;
- `trainer_state.pt`: optimiser, lr scheduler, RNG states (python, numpy, torch), the step
  and the data position.
It is written to a hidden temp folder and renamed into place, so a crash never leaves a
half-written `step-*` folder; only the newest `keep_checkpoints` are kept.

An export carries a marker file; exporting again replaces only such a folder or an empty one,
never a folder holding anything else.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml

from prompt_r1.config.experiment import Config
from prompt_r1.core.fsutil import atomic_dir

if TYPE_CHECKING:
    from prompt_r1.training.learner import GRPOLearner

STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FILE = "trainer_state.pt"
ADAPTER_CONFIG = "adapter_config.json"
EXPORT_MARKER = ".prompt-r1-export.json"  # marks folders that export_checkpoint may replace


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
    with atomic_dir(final, replace=True) as tmp:  # re-saving a step (forced final save) replaces it
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


def is_export(folder: Path) -> bool:
    """True for a folder written by `export_checkpoint` (it carries the marker file)."""
    return (Path(folder) / EXPORT_MARKER).is_file()


def check_export_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse a target that holds anything but an earlier export (that one only with `overwrite`).

    Exporting replaces only what an export wrote, so a mistyped folder never loses user files.
    """
    out_dir = Path(out_dir)
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise FileExistsError(f"{out_dir} exists and is not a plain folder; give a new or empty folder")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return
    if not is_export(out_dir):
        raise FileExistsError(f"{out_dir} is not empty and is not an earlier export (no {EXPORT_MARKER}); "
                              "nothing was changed: give a new or empty folder")
    if not overwrite:
        raise FileExistsError(f"{out_dir} holds an earlier export; pass --overwrite to replace it")


def export_checkpoint(ckpt: Path, out_dir: Path, overwrite: bool = False) -> Path:
    """Write a plain HF model folder (merged weights + tokenizer) that any tool can load.

    The folder is built beside `out_dir` and renamed into place; an existing `out_dir` is
    replaced only when empty or (with `overwrite`) an earlier export, see `check_export_target`.
    """
    from transformers import AutoTokenizer

    ckpt, out_dir = Path(ckpt), Path(out_dir)
    if not (ckpt / STATE_FILE).is_file() and not (ckpt / "config.json").is_file():
        raise FileNotFoundError(f"{ckpt} is not a checkpoint folder (no {STATE_FILE} or config.json)")
    check_export_target(out_dir, overwrite)
    state = _read_state(ckpt) if (ckpt / STATE_FILE).is_file() else {}
    dtype = torch.bfloat16 if _saved_dtype(ckpt, state) == "bfloat16" else torch.float32
    model = load_merged_model(ckpt, dtype)
    with atomic_dir(out_dir, replace=True) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(ckpt).save_pretrained(tmp)
        for extra in ("generation_config.json",):
            source = Path(state.get("base_model_path", ckpt)) / extra
            if source.is_file() and not (tmp / extra).exists():
                shutil.copy(source, tmp / extra)
        (tmp / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve())}) + "\n")
        check_export_target(out_dir, overwrite)  # again: it may have changed while we built
    return out_dir


def _saved_dtype(ckpt: Path, state: dict[str, Any]) -> str:
    config_file = ckpt / "config.yaml"
    if config_file.is_file():
        return (yaml.safe_load(config_file.read_text()) or {}).get("agent", {}).get("dtype", "float32")
    return "float32"
