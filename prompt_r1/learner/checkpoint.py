"""Checkpoints that resume a run exactly (their export to a plain HF model: `models.export`).

A checkpoint is a folder `ckpt_dir/step-000N/` holding:
- the weights in HF format: the full model (`save_pretrained`) or, under LoRA, the adapter
  (`adapter_config.json` + `adapter_model.safetensors`, whose base is the run's model path);
- the tokenizer, the resolved `config.yaml` (an export carries it too, as the resolver's
  `TRAINING_CONFIG`: evaluation reads the training pool from it);
- `optimizer/`: the AdamW state as torch.distributed.checkpoint writes it (parameters by name,
  each rank writing its own shards under FSDP, one copy of what ranks share under DDP);
- `trainer_state.pt`: lr scheduler, RNG states (python, numpy, torch), the step and the data
  position (checkpoints written before `optimizer/` existed hold the whole optimiser state here,
  keyed by parameter index; they still load);
- `manifest.json`: the size and CRC-32 of every other file, written last.
It is written to a hidden temp folder and renamed into place, so a crash never leaves a
half-written `step-*` folder; only the newest `keep_checkpoints` are kept. A disk that fills
while writing one ends the run with `DiskFullError` (the folder, the last checkpoint, and that
`--resume` continues from it) and the partial folder removed.

A checkpoint damaged later (a truncated copy, a full disk while syncing, bit rot) fails
`verify_checkpoint`, which names the folder and the file: a resume (`resume_checkpoint`) then
warns and falls back to the newest intact checkpoint, and fails with `CheckpointError` only when
none is intact. Checkpoints written before the manifest existed are checked by reading them.

A checkpoint does not depend on the learner's world size: a learner group (`train.world_size`
> 1) gathers the full weights to rank 0, which writes them in this same layout, and
torch.distributed.checkpoint reshards the optimiser state to whatever world size loads it. On
resume rank 0 alone reads the weights (others receive them, `collectives.Ranks.load_state_dict`)
and each rank reads only its own part of the optimiser state: no rank holds the whole optimiser
state at any time. So a run saved with N ranks resumes with M, under ddp or fsdp alike (on a
cluster of several machines the run folder must be on storage every learner node sees: every
rank writes into it).

An export (`models.export.export_checkpoint`) carries a marker file; exporting again replaces only such a folder or an empty one,
never a folder holding anything else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml

from prompt_r1.config.experiment import Config
from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import atomic_dir
from prompt_r1.models.export import STATE_FILE, CheckpointError, read_state, verify_checkpoint, write_manifest
from prompt_r1.models.agent_files import ADAPTER_CONFIG

if TYPE_CHECKING:
    from prompt_r1.learner.grpo_learner import GRPOLearner

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d+)$")
OPTIMIZER_DIR = "optimizer"  # torch.distributed.checkpoint's folder of the optimiser state
DISK_FULL_SLACK = 16 * 2**20  # free bytes below which a failed write counts as a full disk (`disk_full`)


class DiskFullError(UserError, OSError):
    """Writing a checkpoint ran out of disk; the message names the folder and says `--resume` continues."""


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


def resume_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest intact checkpoint in `ckpt_dir` (None when there is none). Each newer damaged
    one is named in a warning and passed over; when every checkpoint is damaged, `CheckpointError`
    names them all (a resume must not silently start over)."""
    ckpt_dir = Path(ckpt_dir)
    folders = sorted((int(m.group(1)), child) for child in (ckpt_dir.iterdir() if ckpt_dir.is_dir() else [])
                     if (m := STEP_DIR.match(child.name)) and child.is_dir())
    damaged: list[str] = []
    for _, folder in reversed(folders):
        try:
            verify_checkpoint(folder)
        except CheckpointError as err:
            log.warning("%s", err)
            damaged.append(folder.name)
            continue
        if damaged:
            log.warning("resuming from %s, the newest intact checkpoint; passed over the corrupted %s "
                        "(the steps after it are trained again)", folder.name, ", ".join(damaged))
        return folder
    if damaged:
        raise CheckpointError(f"every checkpoint in {ckpt_dir} is corrupted ({', '.join(damaged)}; see the "
                              "warnings above): nothing to resume from. Start a new run (drop --resume)")
    return None


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
        # one state per device the saver saw; a rank sees its node's rank GPUs (`rank_gpus`), which a
        # resume at another world size may make fewer
        for index, device_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def save_checkpoint(learner: GRPOLearner, ckpt_dir: Path, step: int, data_position: dict[str, Any],
                    config: Config) -> Path:
    """Write `ckpt_dir/step-N/` atomically and prune old ones; returns the folder.

    Every rank of a learner group calls it (gathering the weights and saving the optimiser state
    are collectives); rank 0 writes the rest and renames the folder into place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / step_dir_name(step)
    ranks = learner.ranks
    weights = ranks.full_state_dict(learner.model)  # None: this process holds all weights
    with contextlib.ExitStack() as stack:
        tmp = None
        if ranks.rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            # re-saving a step (forced final save) replaces it
            tmp = stack.enter_context(atomic_dir(final, replace=True))
        tmp = Path(ranks.broadcast_object(None if tmp is None else str(tmp)))
        try:
            # each rank writes its part (its shards under FSDP); rank 0 returns once all are written
            with _one_process_quiet():
                dcp.save({"optimizer": get_optimizer_state_dict(learner.model, learner.optimizer)},
                         checkpoint_id=tmp / OPTIMIZER_DIR)
            if ranks.rank != 0:
                return final
            _write_checkpoint(learner, tmp, weights, step, data_position, config)
        except (Exception, dcp.api.CheckpointException) as err:  # judged here, while the partial folder fills the disk
            full = disk_full(err, tmp)
            if full is None:
                raise
            raise DiskFullError(
                f"the disk is full: writing checkpoint {final} failed with {full}; nothing of this "
                f"checkpoint was kept ({_last_intact(ckpt_dir)}). Free space on that disk, then "
                "continue the run with `--resume`: it restarts from the last checkpoint") from err
    for _, stale in list_checkpoints(ckpt_dir)[:-config.train.keep_checkpoints]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _write_checkpoint(learner: GRPOLearner, tmp: Path, weights: dict[str, Any] | None,
                      step: int, data_position: dict[str, Any], config: Config) -> None:
    # full model, or the adapter under LoRA
    learner.model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
    learner.tokenizer.save_pretrained(tmp)
    (tmp / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    torch.save({
        "step": step,
        "data_position": dict(data_position),
        "scheduler": learner.scheduler.state_dict(),
        "rng": rng_state(),
        "base_model_path": learner.model_path,
        "lora": learner.use_lora,
    }, tmp / STATE_FILE)
    write_manifest(tmp)


def disk_full(err: BaseException, folder: Path) -> str | None:
    """How the disk of `folder` is full, when `err` (a failed write into it) came from that;
    None for any other error. An errno says so (ENOSPC, EDQUOT); writers that lose the errno
    (torch's zip writer: `RuntimeError: [enforce fail at inline_container.cc] ... unexpected
    pos`, safetensors) are judged by the free space left, never by their text: a write that ran
    out of space has filled the disk, so less than `DISK_FULL_SLACK` remains."""
    # torch.distributed.checkpoint wraps each rank's error (a BaseException with `failures`)
    causes = [err, *getattr(err, "failures", {}).values()]
    code = next((c.errno for c in causes if getattr(c, "errno", None) in (errno.ENOSPC, errno.EDQUOT)), None)
    if code is not None:
        return f"{os.strerror(code)} ({type(err).__name__})"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < DISK_FULL_SLACK:
        return f"{type(err).__name__} with {free / 2**20:.1f} MiB left on the device"
    return None


def _last_intact(ckpt_dir: Path) -> str:
    saved = list_checkpoints(ckpt_dir)
    return f"the last checkpoint is {saved[-1][1].name}" if saved else "there is no earlier checkpoint"


@torch.no_grad()
def load_checkpoint(learner: GRPOLearner, path: Path) -> tuple[int, dict[str, Any]]:
    """Restore weights, optimiser, scheduler and RNG into `learner`; returns (step, data_position).
    Every rank of a learner group calls it: rank 0 reads the weights, each rank its own part of
    the optimiser state (older checkpoints, with the whole state in `trainer_state.pt`: every rank
    reads all of it)."""
    path = Path(path)
    state = read_state(path)
    legacy = "optimizer" in state
    if not legacy and not (path / OPTIMIZER_DIR).is_dir():
        raise CheckpointError(f"checkpoint {path} is corrupted: it has neither {OPTIMIZER_DIR}/ nor an optimiser "
                              f"state in {STATE_FILE}; delete the folder (older checkpoints of the run stay usable)")
    is_adapter = (path / ADAPTER_CONFIG).is_file()
    if is_adapter != learner.use_lora:
        raise CheckpointError(f"checkpoint {path} is {'a LoRA adapter' if is_adapter else 'a full model'} but "
                         f"the config has agent.lora.enabled={learner.use_lora}; use the run's config")
    if is_adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(learner.model, load_file(str(path / "adapter_model.safetensors")))
    else:
        from transformers import AutoModelForCausalLM

        saved = ({} if learner.ranks.rank != 0 else  # rank 0 reads, the others receive
                 AutoModelForCausalLM.from_pretrained(path, dtype=next(learner.model.parameters()).dtype).state_dict())
        learner.ranks.load_state_dict(learner.model, saved)
        del saved
    if legacy:
        learner.ranks.load_optimizer_state(learner.model, learner.optimizer, learner.param_names, state["optimizer"])
    else:
        _load_optimizer(learner, path / OPTIMIZER_DIR)
    learner.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return int(state["step"]), dict(state["data_position"])


def _load_optimizer(learner: GRPOLearner, folder: Path) -> None:
    """Each rank reads its part of a torch.distributed.checkpoint optimiser state, resharded to this
    world size (the template's tensors, laid out as this rank holds them, say which part)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    # the template: AdamW's state exists only after a step; get_optimizer_state_dict makes it with
    # a zero-lr step (the weights do not move)
    state = {"optimizer": get_optimizer_state_dict(learner.model, learner.optimizer)}
    try:
        with _one_process_quiet():
            dcp.load(state, checkpoint_id=folder)
    except Exception as err:  # a damaged or foreign folder (a resume's manifest check passed it)
        raise CheckpointError(f"checkpoint {folder.parent}: the optimiser state in {folder.name}/ cannot be read "
                              f"({type(err).__name__}: {' '.join(str(err).split())[:300]}); use the run's config, "
                              "or delete the folder") from None
    set_optimizer_state_dict(learner.model, learner.optimizer, state["optimizer"])
    # hyperparameters come back rebuilt (AdamW's betas tuple becomes a list): keep the saved values,
    # so that saving again writes what was loaded
    for group, saved in zip(learner.optimizer.param_groups, state["optimizer"]["param_groups"]):
        group.update({key: value for key, value in saved.items() if key != "params"})


@contextlib.contextmanager
def _one_process_quiet():
    """torch.distributed.checkpoint warns at every call of a learner alone (no process group) that
    it saves "in a single process": that is the intent, not news."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
