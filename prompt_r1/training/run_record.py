"""The identity of a training run, kept in its folder, so resuming continues only the same run.

`run_dir/run.json` records the config hash, a hash of the training pool's question ids (train
and validation, in order: the data position is an index into them), when the run started and
when it finished. A resume compares them with the current config and pool: a changed config
or pool is refused unless forced (and then logged loudly and recorded in the file), and a
finished run is never continued. Every entry point picks the run to resume from these records
(`find_resumable`); the Prefect flow also keeps the same hashes as MLflow tags.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import atomic_write_text

if TYPE_CHECKING:
    from prompt_r1.config.experiment import Config

log = logging.getLogger(__name__)

RUN_FILE = "run.json"


class ResumeError(UserError, ValueError):
    """A run that must not be continued (changed config, finished, or already present)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")  # orders runs


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ResumeError(f"{path} is not valid JSON ({err}); fix or remove the run folder") from None


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Write `run.json` atomically (a crash leaves the old or the new file, never half of one)."""
    atomic_write_text(Path(run_dir) / RUN_FILE, json.dumps(record, indent=2) + "\n")


def _has_checkpoint(run_dir: Path) -> bool:
    from prompt_r1.learner.checkpoint import latest_checkpoint

    return latest_checkpoint(Path(run_dir) / "checkpoints") is not None


def changed_settings(run_dir: Path, config: Config) -> list[str]:
    """`key: old -> new` for each setting in which `config` differs from the config the run's newest
    checkpoint was written with (its `config.yaml`), so a refused resume names what changed, not
    two hashes. Left out, as from the hash: the learner's layout (`LAYOUT_KEYS`), where evaluation's
    engines run, and keys the checkpoint's config does not have (added to the project after it).
    Empty when there is no readable checkpoint config."""
    import yaml

    from prompt_r1.config.experiment import LAYOUT_KEYS, flatten
    from prompt_r1.learner.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
    try:
        old = flatten(yaml.safe_load((ckpt / "config.yaml").read_text()) or {}) if ckpt is not None else {}
    except (OSError, yaml.YAMLError, AttributeError):
        return []
    new = config.flat()
    skipped = {f"train.{key}" for key in LAYOUT_KEYS}
    return [f"{key}: {old[key]!r} -> {new.get(key)!r}" for key in sorted(old)
            if key not in skipped and not key.startswith("eval.agent_placement") and old[key] != new.get(key)]


def mismatches(record: dict[str, Any], config_hash: str, pool: str, settings: list[str] | None = None) -> list[str]:
    """What differs between a run's record and the current settings (empty = the same run);
    `settings` (`changed_settings`) say which keys made the config hash differ.

    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "a", "p")
    []
    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "b", "q")
    ['config hash a -> b', 'training pool hash p -> q']
    >>> mismatches({"config_hash": "a", "pool_hash": "p"}, "b", "p", ["train.lr: 1e-06 -> 1e-05"])
    ['config hash a -> b (changed: train.lr: 1e-06 -> 1e-05)']
    """
    diffs = []
    if record.get("config_hash") != config_hash:
        shown = f" (changed: {', '.join(settings[:8])}{', ...' if len(settings) > 8 else ''})" if settings else ""
        diffs.append(f"config hash {record.get('config_hash')} -> {config_hash}{shown}")
    if record.get("pool_hash") != pool:
        diffs.append(f"training pool hash {record.get('pool_hash')} -> {pool}")
    return diffs


def open_run(run_dir: Path, config_name: str, config_hash: str, pool: str, resume: bool,
             force: bool = False, config: Config | None = None) -> dict[str, Any]:
    """Start a new run in `run_dir` or check that resuming it is allowed; returns its record.

    Raises ResumeError for: an existing run without `resume`; a finished run; a run whose
    config or pool changed (unless `force`; with `config`, the message names the changed keys);
    checkpoints with no record (unless `force`).
    """
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    if record is None and not _has_checkpoint(run_dir):
        record = {"config_name": config_name, "config_hash": config_hash, "pool_hash": pool,
                  "started_at": _now(), "finished_at": None, "forced": []}
        write_record(run_dir, record)
        return record
    if not resume:
        raise ResumeError(f"run folder {run_dir} already holds a run; resume it (--resume) or "
                          "choose another run id")
    if record is None:
        record = {"config_name": config_name, "config_hash": None, "pool_hash": None,
                  "started_at": _now(), "finished_at": None, "forced": []}
        diffs = [f"no {RUN_FILE} records which config and pool its checkpoints were trained with"]
    else:
        changed = record.get("config_hash") != config_hash and config is not None
        diffs = mismatches(record, config_hash, pool, changed_settings(run_dir, config) if changed else None)
    if record.get("finished_at"):
        raise ResumeError(f"run {run_dir.name} finished at {record['finished_at']}; a finished run is "
                          "never resumed: start a new run (drop --resume / choose another run id)")
    if diffs and not force:
        raise ResumeError(f"refusing to resume run {run_dir.name} under a changed config: "
                          f"{'; '.join(diffs)}. Start a new run (drop --resume), or pass --force to "
                          "continue its checkpoints under the new settings")
    if diffs:
        log.warning("FORCED RESUME of run %s under changed settings (%s): its checkpoints were "
                    "trained with the old ones", run_dir.name, "; ".join(diffs))
        record["forced"] = [*record.get("forced", []), {"at": _now(), "from_config_hash": record.get("config_hash"),
                                                        "from_pool_hash": record.get("pool_hash")}]
        record.update(config_hash=config_hash, pool_hash=pool)
        write_record(run_dir, record)
    return record


def mark_finished(run_dir: Path) -> None:
    """Record that the run reached its last step and exported its agent: never resumed again."""
    record = read_record(run_dir) or {}
    record["finished_at"] = _now()
    write_record(run_dir, record)


def find_resumable(runs_root: Path, config_hash: str, pool: str,
                   accept: Callable[[str], str | None] | None = None) -> tuple[str | None, list[str]]:
    """The newest unfinished run under `runs_root` (one config name's folder) with this config
    and pool, and why each newer or other candidate was passed over: the one rule for which run
    continues, used by `prompt-r1 train --resume`, `prompt_r1.train` and the train flow. `accept`
    (run id -> a reason to pass it over, or None) lets a caller add its own condition (the flow:
    the run is an unfinished MLflow training run)."""
    runs_root = Path(runs_root)
    candidates = []
    for folder in runs_root.iterdir() if runs_root.is_dir() else []:
        if not folder.is_dir():
            continue
        record = read_record(folder)
        if record is None:
            if _has_checkpoint(folder):
                candidates.append(("", folder.name, f"{folder.name}: no {RUN_FILE} (run of an older version)"))
            continue
        if record.get("finished_at"):
            reason = f"{folder.name}: finished at {record['finished_at']}"
        else:
            diffs = mismatches(record, config_hash, pool)
            if not diffs and accept is not None and (refused := accept(folder.name)):
                diffs = [refused]
            reason = f"{folder.name}: {'; '.join(diffs)}" if diffs else ""
        candidates.append((record.get("started_at") or "", folder.name, reason))
    skipped = []
    for _, name, reason in sorted(candidates, reverse=True):
        if not reason:
            return name, skipped
        skipped.append(reason)
    return None, skipped
