"""The MLflow model registry of trained agents: register a version (champion by the rule below),
find a registered version's local folder, and let the library's agent resolver take `models:/...`
specs. Apart from `runs`, which logs runs, because a registered agent is a product users load, not
a record of a run.

Each config registers its agents as its own model (`Config.registered_model()`:
`tracking.registered_model`, else `prompt-r1-<config name>`), so the `champion` alias is chosen
among one task's versions only; `ask`, `serve` and `transfer-eval` without `--agent` take that
config's champion. The champion rule (`champion_decision`, docs/using-an-agent.md): a version
with a validation score takes the alias from a champion with a lower score or none; a version
without one takes it only when there is no champion or the champion has no score either, and
the replacement of an unscored champion by an unscored version is logged and tagged as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from prompt_r1.config.experiment import Config
from prompt_r1.config.run_home import runs_home
from prompt_r1.config.tracking import CHAMPION_ALIAS
from prompt_r1.core.urls import redact_url
from prompt_r1.core.fsutil import atomic_dir
from tasks.tracking.runs import is_local, point_mlflow, registry_uri, tracking_uri

log = logging.getLogger(__name__)

LEGACY_MODEL_NAME = "prompt-r1-agent"  # every config's model before one model a config (docs/using-an-agent.md)
CHAMPION = CHAMPION_ALIAS


def champion_decision(new_score: float | None, current: float | None, has_champion: bool) -> tuple[bool, str]:
    """Whether a new version with validation score `new_score` becomes champion over the current
    champion (score `current`, None when unscored; `has_champion` False when there is none), and why.

    >>> champion_decision(0.4, 0.3, True)[0], champion_decision(0.3, 0.3, True)[0], champion_decision(0.2, None, True)[0]
    (True, False, True)
    >>> champion_decision(None, 0.3, True)
    (False, 'unscored (no validation): never displaces a scored champion')
    >>> champion_decision(None, None, True)
    (True, 'unscored, replacing an unscored champion: the newest unscored version is champion')
    >>> champion_decision(None, None, False)
    (True, 'first version: champion')
    """
    if not has_champion:
        return True, "first version: champion"
    if new_score is None:
        if current is not None:
            return False, "unscored (no validation): never displaces a scored champion"
        return True, "unscored, replacing an unscored champion: the newest unscored version is champion"
    if current is None:
        return True, f"scored {new_score:.6f}, replacing an unscored champion"
    if new_score > current:
        return True, f"validation score {new_score:.6f} beats the champion's {current:.6f}"
    return False, f"validation score {new_score:.6f} does not beat the champion's {current:.6f}"


def _score(tag: str | None) -> float | None:
    try:
        value = float(tag) if tag else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def register_agent(run_id: str, checkpoint: Path, val_score: float | None,
                   cfg: Config | None = None, model_name: str | None = None) -> tuple[str, bool]:
    """Register an agent folder as a new version of `model_name` (default: `cfg`'s registered
    model), an MLflow pyfunc model (see `tasks.agent_model`) logged in run `run_id`; make it
    `champion` by `champion_decision` among that model's versions. Returns (version, became_champion).

    `cfg` is the config the agent answers with when loaded from the registry (default: the
    `config.yaml` of the run's newest checkpoint)."""
    import tempfile

    import yaml

    from tasks.agent_model import log_agent_model

    if model_name is None:
        if cfg is None:
            raise ValueError("register_agent: pass cfg or model_name (the registered model of the agent's config)")
        model_name = cfg.registered_model()
    client = MlflowClient()
    config_text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False) if cfg else _run_config_text(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        config_yaml = Path(tmp) / "config.yaml"
        config_yaml.write_text(config_text)
        active = mlflow.active_run()
        in_run = active is not None and active.info.run_id == run_id
        with contextlib.nullcontext() if in_run else mlflow.start_run(run_id=run_id, nested=active is not None):
            info = log_agent_model(checkpoint, config_yaml, registered_model_name=model_name)
    version = str(info.registered_model_version)
    try:
        current = client.get_model_version_by_alias(model_name, CHAMPION)
    except mlflow.exceptions.MlflowException:
        current = None
    champion, reason = champion_decision(val_score, _score(current.tags.get("val_score")) if current else None,
                                         current is not None)
    tags = {"val_score": "" if val_score is None else f"{val_score:.6f}", "checkpoint": str(checkpoint),
            "champion_decision": reason}
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    if champion:
        client.set_registered_model_alias(model_name, CHAMPION, version)
    if champion and current is not None and val_score is None:
        log.warning("%s version %s has no validation score and replaces unscored champion version %s (%s)",
                    model_name, version, current.version, reason)
    else:
        log.info("%s version %s: %s", model_name, version, reason)
    return version, champion


def _run_config_text(agent_dir: Path) -> str:
    """The training config of an exported agent: the one it carries (`training_config_file`), or
    for an export made before exports carried it, the one beside it (`run/checkpoints/step-*/config.yaml`)."""
    from prompt_r1.models.agent_files import training_config_file

    carried = training_config_file(agent_dir)
    found = [carried] if carried is not None else sorted(Path(agent_dir).parent.glob("checkpoints/step-*/config.yaml"))
    if not found:
        raise FileNotFoundError(f"no config for agent {agent_dir}: pass cfg to register_agent")
    return found[-1].read_text()


def registry_agent_path(uri: str, tracking: str | None = None) -> Path | None:
    """Local HF folder of a registered agent (`models:/NAME@alias` or `models:/NAME/VERSION`) in
    the registry beside tracking URI `tracking` (a config's `tracking.uri`; default `tracking_uri()`),
    downloaded once under `runs/registry/`; None when the registry has no such version."""
    name, _, ref = uri[len("models:/"):].partition("@")
    alias = ref or None
    if alias is None:
        name, _, version_ref = name.partition("/")
    where = tracking_uri(tracking)
    if is_local(where) and not (runs_home() / "mlflow.db").is_file():  # no registry yet: do not create one by looking
        return None
    client = MlflowClient(tracking_uri=where, registry_uri=registry_uri(where))
    try:
        version = (client.get_model_version_by_alias(name, alias) if alias
                   else client.get_model_version(name, version_ref))
    except mlflow.exceptions.MlflowException:
        if alias == CHAMPION and name != LEGACY_MODEL_NAME:
            _legacy_hint(client, name)
        return None
    # a server's versions are cached apart from the local registry's (the same name and number differ)
    server = [] if is_local(where) else [hashlib.sha256(redact_url(where).encode()).hexdigest()[:12]]
    target = runs_home().joinpath("registry", *server, name, f"v{version.version}")
    if not (target / "agent" / "config.json").exists():
        import shutil

        # a folder left without its agent (an older, interrupted download) is replaced
        with atomic_dir(target, replace=True) as tmp:
            point_mlflow(where, registry_uri(where))
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version.version}",
                                                             dst_path=str(tmp / "download")))
            agent = _agent_artifact(local)
            if not (agent / "config.json").is_file():
                raise FileNotFoundError(f"{uri} (version {version.version}) holds no agent model folder")
            agent.rename(tmp / "agent")
            shutil.rmtree(tmp / "download", ignore_errors=True)
    return target / "agent"


def _legacy_hint(client: MlflowClient, name: str) -> None:
    """Say so when a config has no champion but the registry holds one of `prompt-r1-agent`, the
    model every config registered into before one model a config: its agent is not taken silently."""
    try:
        client.get_model_version_by_alias(LEGACY_MODEL_NAME, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return
    log.warning("no champion of %s yet; this registry holds %s@%s, registered by an earlier prompt-r1 for every "
                "config: pass --agent models:/%s@%s, or copy it into %s (docs/using-an-agent.md, \"Migrating\")",
                name, LEGACY_MODEL_NAME, CHAMPION, LEGACY_MODEL_NAME, CHAMPION, name)


def _agent_artifact(model_dir: Path) -> Path:
    """The agent folder inside a downloaded version: the pyfunc model's `agent` artifact, or the
    folder itself (versions registered before the agent was a pyfunc model)."""
    from mlflow.models import Model

    if (model_dir / "MLmodel").is_file():
        artifacts = Model.load(str(model_dir)).flavors.get("python_function", {}).get("artifacts", {})
        if "agent" in artifacts:
            return model_dir / artifacts["agent"]["path"]
    return model_dir


def install_registry_resolver() -> None:
    """Let the library's agent resolver take `models:/...` specs (the champion included)."""
    from prompt_r1.models.resolver import register_scheme

    register_scheme("models", registry_agent_path)

