"""The MLflow model registry of trained agents: register a version (champion when it validates
better), find a registered version's local folder, and let the library's agent resolver take
`models:/...` specs. Apart from `runs`, which logs runs, because a registered agent is
a product users load, not a record of a run.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from prompt_r1.config.experiment import Config, runs_home
from prompt_r1.core.fsutil import atomic_dir
from tasks.tracking.runs import tracking_uri

MODEL_NAME = "prompt-r1-agent"
CHAMPION = "champion"


def register_agent(run_id: str, checkpoint: Path, val_score: float | None,
                   cfg: Config | None = None) -> tuple[str, bool]:
    """Register an agent folder as a new `prompt-r1-agent` version, an MLflow pyfunc model (see
    `tasks.agent_model`) logged in run `run_id`; make it `champion` when its validation score
    beats the current champion's (or there is none). Returns (version, became_champion).

    `cfg` is the config the agent answers with when loaded from the registry (default: the
    `config.yaml` of the run's newest checkpoint)."""
    import tempfile

    import yaml

    from tasks.agent_model import log_agent_model

    client = MlflowClient()
    config_text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False) if cfg else _run_config_text(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        config_yaml = Path(tmp) / "config.yaml"
        config_yaml.write_text(config_text)
        active = mlflow.active_run()
        in_run = active is not None and active.info.run_id == run_id
        with contextlib.nullcontext() if in_run else mlflow.start_run(run_id=run_id, nested=active is not None):
            info = log_agent_model(checkpoint, config_yaml, registered_model_name=MODEL_NAME)
    version = str(info.registered_model_version)
    tags = {"val_score": "" if val_score is None else f"{val_score:.6f}", "checkpoint": str(checkpoint)}
    for key, value in tags.items():
        client.set_model_version_tag(MODEL_NAME, version, key, value)
    try:
        current = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
        current_score = float(current.tags.get("val_score") or "-inf")
    except mlflow.exceptions.MlflowException:
        current_score = float("-inf")
    champion = (val_score is not None and val_score > current_score) or current_score == float("-inf")
    if champion:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION, version)
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


def registry_agent_path(uri: str) -> Path | None:
    """Local HF folder of a registered agent (`models:/NAME@alias` or `models:/NAME/VERSION`),
    downloaded once under `runs/registry/`; None when the registry has no such version."""
    name, _, ref = uri[len("models:/"):].partition("@")
    alias = ref or None
    if alias is None:
        name, _, version_ref = name.partition("/")
    db = runs_home() / "mlflow.db"
    if not db.is_file():  # no registry yet: do not create one by looking
        return None
    client = MlflowClient(tracking_uri=tracking_uri(), registry_uri=tracking_uri())
    try:
        version = (client.get_model_version_by_alias(name, alias) if alias
                   else client.get_model_version(name, version_ref))
    except mlflow.exceptions.MlflowException:
        return None
    target = runs_home() / "registry" / name / f"v{version.version}"
    if not (target / "agent" / "config.json").exists():
        import shutil

        # a folder left without its agent (an older, interrupted download) is replaced
        with atomic_dir(target, replace=True) as tmp:
            mlflow.set_tracking_uri(tracking_uri())
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version.version}",
                                                             dst_path=str(tmp / "download")))
            agent = _agent_artifact(local)
            if not (agent / "config.json").is_file():
                raise FileNotFoundError(f"{uri} (version {version.version}) holds no agent model folder")
            agent.rename(tmp / "agent")
            shutil.rmtree(tmp / "download", ignore_errors=True)
    return target / "agent"


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

