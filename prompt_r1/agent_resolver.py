"""The one place that turns an agent spec (what a user types after `--agent`) into a model folder.

A spec is, in this order:
- a registry URI `models:/NAME@alias` or `models:/NAME/VERSION`: resolved by the function a
  higher layer installed with `register_scheme("models", fn)`. The library knows nothing of
  MLflow, so the tracking layer (`tasks.tracking.install_registry_resolver`, called by the
  `prompt-r1` entry point) plugs it in; imports stay downward (flows -> tasks -> prompt_r1);
- a bundled model name from `prompt_r1.models` (`tiny-protocol`, `smollm2-135m-protocol`, ...);
- a folder: a HF model folder (config.json), or a training run folder (its exported `agent/`);
- a training run id: the run folder `runs_home()/<config>/<run_id>/`, then as above.

`resolve_agent(None, default_model=...)` is the default agent: the registry's champion
(`DEFAULT_REGISTRY_URI`) when a registry is installed and holds one, else `default_model`
(usually the config's `agent.model`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prompt_r1.config import SAFE_NAME, runs_home

DEFAULT_REGISTRY_URI = "models:/prompt-r1-agent@champion"
BUNDLED = ("tiny", "tiny-protocol", "tiny-smollm2", "smollm2-135m-instruct", "smollm2-135m-protocol", "gemma3-270m")

# scheme -> function(uri) returning the local agent folder, or None when the registry lacks it.
SchemeResolver = Callable[[str], "Path | None"]
_schemes: dict[str, SchemeResolver] = {}


class AgentSpecError(ValueError):
    """A spec that names no usable agent; the message says what was tried and what to pass."""


def register_scheme(scheme: str, resolver: SchemeResolver) -> None:
    """Let `scheme:/...` specs resolve through `resolver` (installed by a higher layer)."""
    _schemes[scheme] = resolver


def spec_scheme(spec: str) -> str | None:
    """The URI scheme of a spec, or None for names, folders and run ids.

    >>> spec_scheme("models:/prompt-r1-agent@champion"), spec_scheme("runs/smoke/x"), spec_scheme("tiny")
    ('models', None, None)
    """
    head, sep, _ = spec.partition(":/")
    return head if sep and head.isidentifier() and len(head) > 1 else None


def _model_folder(folder: Path, spec: str) -> Path:
    """The HF folder inside `folder`: itself, or a run folder's exported agent."""
    if (folder / "config.json").is_file():
        return folder.resolve()
    if (folder / "agent" / "config.json").is_file():
        return (folder / "agent").resolve()
    if (folder / "checkpoints").is_dir():
        raise AgentSpecError(
            f"agent {spec!r}: run folder {folder} has no exported agent (`agent/`); the run has not "
            f"finished. Export a checkpoint first: prompt-r1 export {folder}/checkpoints/step-N DIR")
    raise AgentSpecError(f"agent {spec!r}: folder {folder} is neither a HF model folder (no config.json) "
                         "nor a training run folder (no agent/ or checkpoints/)")


def find_run(run_id: str, config_name: str | None = None, home: Path | None = None) -> Path | None:
    """The folder of training run `run_id` under the run home (any config, or `config_name`'s)."""
    if not SAFE_NAME.match(run_id):
        return None
    home = home or runs_home()
    names = [config_name] if config_name else sorted(p.name for p in home.iterdir() if p.is_dir()) \
        if home.is_dir() else []
    found = [home / n / run_id for n in names if (home / n / run_id).is_dir()]
    if len(found) > 1:
        raise AgentSpecError(f"run id {run_id!r} exists under several configs ({', '.join(str(f) for f in found)}); "
                             "pass the run folder instead")
    return found[0] if found else None


def resolve_agent(spec: str | None, default_model: str | None = None, config_name: str | None = None) -> Path:
    """The local HF folder of the agent `spec` names (see the module docstring for the forms)."""
    if spec is None or spec == "":
        if "models" in _schemes:
            champion = _schemes["models"](DEFAULT_REGISTRY_URI)
            if champion is not None:
                return Path(champion)
        if default_model is None:
            raise AgentSpecError("no agent given and no champion registered: pass --agent SPEC")
        return resolve_agent(default_model)
    scheme = spec_scheme(spec)
    if scheme is not None:
        if scheme not in _schemes:
            raise AgentSpecError(f"agent {spec!r}: no resolver for `{scheme}:/` URIs here; use the `prompt-r1` "
                                 "command (it installs the MLflow registry) or pass a folder or run id")
        found = _schemes[scheme](spec)
        if found is None:
            raise AgentSpecError(f"agent {spec!r}: not in the registry (no such model, version or alias)")
        return Path(found)
    if spec in BUNDLED:
        from prompt_r1.models import resolve_model

        return Path(resolve_model(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _model_folder(path, spec)
    run = find_run(spec, config_name)
    if run is not None:
        return _model_folder(run, spec)
    raise AgentSpecError(
        f"agent {spec!r} is not a bundled model ({', '.join(BUNDLED)}), a folder, a training run id under "
        f"{runs_home()}, or a models:/NAME@alias URI")
