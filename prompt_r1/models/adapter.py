"""A LoRA adapter folder is an agent: kept alone (a few MiB) where it was trained, merged into its
base wherever it is used.

A run with `agent.lora.enabled` checkpoints the adapter alone; its export (`run_dir/agent`) is the
merged model, hundreds of MiB, too large to keep in a repository. `export_adapter` keeps the
adapter instead: its `adapter_config.json` and weights, the training config (evaluation reads the
training pool from it) and the export marker, with the base recorded so that another machine can
find it (`portable_base`: a bundled model by its name, since its folder's path means nothing
elsewhere). `merged_agent` is what the resolver does with such a folder (or a LoRA checkpoint):
the base found by `adapter_base`, merged by the one export of `models.export`, cached under
the models home. The rule for the base is stated in `prompt_r1.models.resolver`'s docstring.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import yaml

from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import atomic_dir, file_lock
from prompt_r1.models.bundled import (BUILD_LOCK_TIMEOUT_S, BUNDLED_NAMES, bundled_folder, check_model_source,
                                      models_dir, resolve_model)
from prompt_r1.models.agent_files import (ADAPTER_CONFIG, HUB_ID, TRAINING_CONFIG, AgentSpecError,
                                          training_config_file)

log = logging.getLogger(__name__)

BASE_FIELD = "base_model_name_or_path"  # PEFT's field in adapter_config.json naming the base model
MERGED_DIR = "merged-adapters"  # under the models home: one merged agent per adapter and base


def adapter_files(folder: Path) -> list[Path]:
    """The adapter's own files: its config and its weights (`adapter_model.safetensors`)."""
    return [folder / ADAPTER_CONFIG, *sorted(folder.glob("adapter_model.*"))]


def recorded_base(folder: Path) -> str | None:
    """The base model an adapter folder names (its `base_model_name_or_path`); None when it has no
    `adapter_config.json` or the field is unset. An `adapter_config.json` that cannot be read is an
    `AgentSpecError` saying so, not as "names no base model", which would send users to a field
    the file may well have)."""
    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise AgentSpecError(f"{path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                             "it must be the JSON object PEFT writes: copy it again from where the adapter was "
                             "trained") from None
    if not isinstance(config, dict):
        raise AgentSpecError(f"{path} is not a JSON object (it holds {type(config).__name__}); copy it again from "
                             "where the adapter was trained")
    base = config.get(BASE_FIELD)
    return base if isinstance(base, str) and base else None


def trained_base(folder: Path) -> str | None:
    """The `agent.model` of the training config an adapter folder carries (None without one)."""
    carried = training_config_file(folder)
    if carried is None:
        return None
    try:
        model = ((yaml.safe_load(carried.read_text()) or {}).get("agent") or {}).get("model")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return model if isinstance(model, str) and model else None


def portable_base(trained_from: str, training_config: Path | None = None) -> str:
    """The name of the base that another machine can resolve: the bundled model's name when the
    run trained from a bundled model (the training config's `agent.model`, or the path of a bundled
    model's folder under this models home), else `trained_from` as it is (a hub id, a folder).

    >>> portable_base("Qwen/Qwen3-4B"), portable_base("tiny")
    ('Qwen/Qwen3-4B', 'tiny')
    >>> portable_base(str(bundled_folder("tiny-protocol")))
    'tiny-protocol'
    """
    model = None
    if training_config is not None:
        model = ((yaml.safe_load(training_config.read_text()) or {}).get("agent") or {}).get("model")
    if model in BUNDLED_NAMES:
        return model
    if trained_from in BUNDLED_NAMES:
        return trained_from
    here = Path(trained_from).expanduser().resolve()
    return next((name for name in BUNDLED_NAMES if bundled_folder(name).resolve() == here), trained_from)


def export_adapter(ckpt: Path, out_dir: Path, overwrite: bool = False) -> Path:
    """Keep the LoRA adapter of checkpoint `ckpt` alone in `out_dir`: `adapter_config.json` (its
    base rewritten by `portable_base`), the adapter weights, the training config as the export's
    `TRAINING_CONFIG`, and the export marker. `out_dir` follows `export_checkpoint`'s rule (new,
    empty, or an earlier export with `overwrite`) and is built beside it, then renamed into place."""
    from prompt_r1.models.export import EXPORT_MARKER, STATE_FILE, check_export_target, verify_checkpoint

    ckpt, out_dir = Path(ckpt), Path(out_dir)
    if not ckpt.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {ckpt}: name a folder under a run's checkpoints/ "
                                "(e.g. runs/NAME/RUN_ID/checkpoints/step-000004)")
    trained_from = recorded_base(ckpt)
    if trained_from is None:
        raise FileNotFoundError(f"{ckpt} holds no LoRA adapter ({ADAPTER_CONFIG} naming its base): a run without "
                                "agent.lora.enabled checkpoints the whole model; export it whole (no --adapter-only)")
    check_export_target(out_dir, overwrite)
    if (ckpt / STATE_FILE).is_file():
        verify_checkpoint(ckpt)  # a damaged checkpoint is named, never kept
    trained_with = training_config_file(ckpt)
    config = json.loads((ckpt / ADAPTER_CONFIG).read_text())
    config[BASE_FIELD] = portable_base(trained_from, trained_with)
    with atomic_dir(out_dir, replace=True) as tmp:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for weights in adapter_files(ckpt)[1:]:
            shutil.copy(weights, tmp / weights.name)
        if trained_with is not None:
            shutil.copy(trained_with, tmp / TRAINING_CONFIG)
        (tmp / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve()), "adapter_only": True}) + "\n")
        check_export_target(out_dir, overwrite)  # again: it may have changed while we built
    return out_dir


def adapter_base(folder: Path, spec: str) -> str:
    """The base of adapter folder `folder` as `resolve_model` takes it: a bundled name, an existing
    folder, or a hub id; `AgentSpecError` when it names none of these here."""
    base = recorded_base(folder)
    if base is None:
        raise AgentSpecError(f"agent {spec!r}: adapter folder {folder} names no base model ({BASE_FIELD} in its "
                             f"{ADAPTER_CONFIG}); set it to a bundled model ({', '.join(BUNDLED_NAMES)}), a local HF "
                             "model folder or a hub id (org/name)")
    if len(adapter_files(folder)) < 2:
        raise AgentSpecError(f"agent {spec!r}: adapter folder {folder} has no adapter weights (adapter_model.safetensors "
                             f"or adapter_model.bin beside its {ADAPTER_CONFIG}); copy them there from where the "
                             "adapter was trained")
    path = Path(base).expanduser()
    if base in BUNDLED_NAMES or path.is_dir() or (HUB_ID.match(base) and not path.is_absolute()):
        check_trained_base(folder, base, spec)  # found here: is it the one the adapter was trained on?
        return base
    looks_like = next((f" (it looks like bundled model {name!r} built under another models home: if it is, "
                       f"set {BASE_FIELD} to {name!r})" for name in BUNDLED_NAMES
                       if bundled_folder(name).name == path.name), "")
    raise AgentSpecError(
        f"agent {spec!r}: adapter folder {folder} needs its base model {base!r} ({BASE_FIELD} in its "
        f"{ADAPTER_CONFIG}), which is not on this machine{looks_like}; put that model there, or set {BASE_FIELD} "
        f"to a bundled model ({', '.join(BUNDLED_NAMES)}), a local HF model folder or a hub id (org/name). "
        "`prompt-r1 export --adapter-only` records a bundled base by its name")


def check_trained_base(folder: Path, base: str, spec: str) -> None:
    """The base an adapter names against the model its carried training config trained: another base
    of the same shape merges without an error and gives another agent. Two different bundled models
    are refused (`AgentSpecError` naming both); other differences (a folder moved, a hub id written
    another way) are logged, as they may be the same model."""
    trained = trained_base(folder)
    if trained is None or portable_base(base) == portable_base(trained):
        return
    if base in BUNDLED_NAMES or trained in BUNDLED_NAMES or portable_base(base) in BUNDLED_NAMES:
        raise AgentSpecError(
            f"agent {spec!r}: adapter folder {folder} names base {base!r} ({BASE_FIELD} in its {ADAPTER_CONFIG}), "
            f"but it was trained on {trained!r} (agent.model in the training config it carries); merged into "
            f"another base it is another agent. Set {BASE_FIELD} to {portable_base(trained)!r}")
    log.warning("adapter folder %s names base %r but its training config trained %r: merging into %r; if these "
                "are not the same model, set %s", folder, base, trained, base, BASE_FIELD)


def check_adapter(folder: Path, spec: str) -> Path:
    """`folder` when its base can be found (a hub base: the hub can serve it now), without building a
    bundled base or merging: the resolver's quick check."""
    base = adapter_base(folder, spec)
    if base not in BUNDLED_NAMES and not Path(base).expanduser().is_dir():
        check_model_source(base, f"the base model of adapter folder {folder}")
    return folder.resolve()


def _identity(folder: Path, base: Path | str) -> str:
    """A hash of what the merged agent is made of: the adapter's files and carried training config
    (their bytes), and the base (its path and each file's size and modification time; a hub id as is)."""
    digest = hashlib.sha256()
    carried = training_config_file(folder)
    for file in [*adapter_files(folder), *([carried] if carried else [])]:
        digest.update(f"{file.name}\0".encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    digest.update(f"base\0{base}\0".encode())
    if Path(base).is_dir():
        for file in sorted(p for p in Path(base).iterdir() if p.is_file()):
            stat = file.stat()
            digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def merged_folder(folder: Path, base: Path | str) -> Path:
    """Where the merged agent of adapter `folder` on `base` is cached (it may not exist yet)."""
    name = re.sub(r"[^\w.-]", "_", Path(folder).resolve().name)[:64]
    return models_dir() / MERGED_DIR / f"{name}-{_identity(Path(folder), base)[:16]}"


def merged_agent(folder: Path, spec: str) -> Path:
    """The HF folder of adapter `folder` merged into its base (built once; a bundled base is built
    first if needed). A cached folder is used only when it is a finished export (it carries the
    export marker, written last); anything else under its name is built again."""
    from safetensors import SafetensorError

    from prompt_r1.models.export import export_checkpoint, is_export

    folder = Path(folder).resolve()
    base = resolve_model(adapter_base(folder, spec))
    out = merged_folder(folder, base)
    if is_export(out):
        return out
    # one builder per merged agent: a second process waits, then finds it built
    with file_lock(out.with_name(out.name + ".lock"), wait_s=BUILD_LOCK_TIMEOUT_S):
        if is_export(out):
            return out
        if out.exists():  # not an export: never ours to use
            log.warning("removing %s: not a finished merged agent (no export marker); merging again", out)
            shutil.rmtree(out)
        log.info("merging adapter %s into its base %s -> %s", folder, base, out)
        try:
            return export_checkpoint(folder, out, base=base)
        except UserError:
            raise
        except (OSError, RuntimeError, ValueError, SafetensorError) as err:  # a damaged adapter, or one of another base
            reason = " ".join(str(err).split())[:300]
            raise AgentSpecError(f"agent {spec!r}: adapter folder {folder} cannot be merged into its base {base}: "
                                 f"{type(err).__name__}: {reason}. Pass an intact adapter folder with the base it "
                                 f"was trained on, or another agent") from err
