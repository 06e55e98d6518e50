"""The checkpoint folder as files: its manifest, its verification, and its export to a plain HF model.

Why it is here, below the learner: a checkpoint or a kept LoRA adapter becomes an agent anyone can
load (`export_checkpoint`: the adapter merged into its base), and the agent resolver does that for
an adapter folder (`models.adapter`), while writing and resuming checkpoints is the learner's
(`learner.checkpoint`, which lays out the folder these functions read).

A checkpoint's `manifest.json` holds the size and CRC-32 of every other file, written last;
`verify_checkpoint` checks a folder against it (or, for a checkpoint written before manifests,
reads what it can cheaply). An export carries a marker file; exporting again replaces only such a
folder or an empty one, never a folder holding anything else.
"""

from __future__ import annotations

import json
import pickle
import shutil
import zlib
from pathlib import Path
from typing import Any

import torch
import yaml

from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import atomic_dir, check_output_folder
from prompt_r1.models.agent_files import ADAPTER_CONFIG, TRAINING_CONFIG, training_config_file

STATE_FILE = "trainer_state.pt"
MANIFEST = "manifest.json"  # size and CRC-32 of every other file of a checkpoint
EXPORT_MARKER = ".prompt-r1-export.json"  # marks folders that export_checkpoint may replace


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used (damaged, or not of this config); the message names it."""


def _crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_manifest(folder: Path) -> None:
    """Record the size and CRC-32 of every file in `folder` (call it last, on the finished folder)."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "crc32": _crc32(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")


def verify_checkpoint(path: Path) -> None:
    """Raise `CheckpointError` naming the checkpoint and the damaged file when `path` is not intact:
    against its manifest (every file present, same size and CRC-32), or, for a checkpoint
    without one, by reading its trainer state and the headers of its weight files."""
    path = Path(path)
    fix = "it cannot be resumed from or exported; delete the folder (older checkpoints of the run stay usable)"
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"checkpoint {path} is corrupted: {STATE_FILE} is missing; {fix}")
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"checkpoint {path} is corrupted: {MANIFEST} is unreadable ({err}); {fix}") from None
        for name, expected in files.items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"checkpoint {path} is corrupted: {name} is missing; {fix}")
            size = file.stat().st_size
            if size != expected["size"]:
                raise CheckpointError(f"checkpoint {path} is corrupted: {name} has {size} bytes, "
                                      f"{expected['size']} were written; {fix}")
            if _crc32(file) != expected["crc32"]:
                raise CheckpointError(f"checkpoint {path} is corrupted: {name} does not match its "
                                      f"checksum in {MANIFEST}; {fix}")
        return
    read_state(path)  # a checkpoint from before manifests: read what can be read cheaply
    from safetensors import SafetensorError, safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"checkpoint {path} is corrupted: {weights.name} cannot be read ({err}); "
                                  f"{fix}") from None


def read_state(path: Path) -> dict[str, Any]:
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    try:
        return torch.load(state_file, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:  # a damaged file
        raise CheckpointError(f"checkpoint {path} is corrupted: {STATE_FILE} cannot be read "
                              f"({type(err).__name__}: {' '.join(str(err).split())[:300]}); delete the "
                              "folder") from None


def load_merged_model(ckpt: Path, dtype: torch.dtype = torch.float32, base: Path | str | None = None) -> torch.nn.Module:
    """A plain HF model from a checkpoint (LoRA adapters merged into their base: `base`, else the
    model the run trained from)."""
    from transformers import AutoModelForCausalLM

    ckpt = Path(ckpt)
    if not (ckpt / ADAPTER_CONFIG).is_file():
        return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype)
    from peft import PeftModel

    base_path = base if base is not None else read_state(ckpt)["base_model_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    return PeftModel.from_pretrained(base, ckpt).merge_and_unload()


def is_export(folder: Path) -> bool:
    """True for a folder written by `export_checkpoint` (it carries the marker file)."""
    return (Path(folder) / EXPORT_MARKER).is_file()


def check_export_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse a target that holds anything but an earlier export (that one only with `overwrite`).

    Exporting replaces only what an export wrote, so a mistyped folder never loses user files.
    """
    check_output_folder(out_dir, overwrite, EXPORT_MARKER, "export")


def export_checkpoint(ckpt: Path, out_dir: Path, overwrite: bool = False, base: Path | str | None = None) -> Path:
    """Write a plain HF model folder (merged weights + tokenizer) that any tool can load.

    `base`: the model a LoRA adapter is merged into, for an adapter folder without the trainer
    state that names it (a kept adapter: `prompt_r1.models.adapter`); its tokenizer is the base's
    when the folder holds none. The folder is built beside `out_dir` and renamed into place; an
    existing `out_dir` is replaced only when empty or (with `overwrite`) an earlier export, see
    `check_export_target`.
    """
    from transformers import AutoTokenizer

    ckpt, out_dir = Path(ckpt), Path(out_dir)
    adapter_only = base is not None and (ckpt / ADAPTER_CONFIG).is_file()
    if not (ckpt / STATE_FILE).is_file() and not (ckpt / "config.json").is_file() and not adapter_only:
        raise FileNotFoundError(f"{ckpt} is not a checkpoint folder (no {STATE_FILE} or config.json)")
    check_export_target(out_dir, overwrite)
    if (ckpt / STATE_FILE).is_file():
        verify_checkpoint(ckpt)  # a damaged checkpoint is named, never exported
    state = read_state(ckpt) if (ckpt / STATE_FILE).is_file() else {}
    base = base if base is not None else state.get("base_model_path")
    trained_with = training_config_file(ckpt)
    dtype = torch.bfloat16 if _saved_dtype(trained_with) == "bfloat16" else torch.float32
    model = load_merged_model(ckpt, dtype, base)
    with atomic_dir(out_dir, replace=True) as tmp:
        model.save_pretrained(tmp)
        has_tokenizer = (ckpt / "tokenizer_config.json").is_file() or base is None
        AutoTokenizer.from_pretrained(ckpt if has_tokenizer else base).save_pretrained(tmp)
        if trained_with is not None:  # the pool it was trained on travels with the agent
            shutil.copy(trained_with, tmp / TRAINING_CONFIG)
        for extra in ("generation_config.json",):
            source = Path(base if base is not None else ckpt) / extra
            if source.is_file() and not (tmp / extra).exists():
                shutil.copy(source, tmp / extra)
        (tmp / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve())}) + "\n")
        check_export_target(out_dir, overwrite)  # again: it may have changed while we built
    return out_dir


def _saved_dtype(config_file: Path | None) -> str:
    if config_file is not None:
        return (yaml.safe_load(config_file.read_text()) or {}).get("agent", {}).get("dtype", "float32")
    return "float32"
