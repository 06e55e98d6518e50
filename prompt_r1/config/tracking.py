"""The `tracking` config section: where a run is tracked and which registered model its agent joins.

The library itself never talks to a tracking server (the orchestration shell, `tasks.tracking`,
does); this section only carries what a config decides about tracking, so that a config is the whole
description of a run: the tracking URI (`tracking.uri`, else `MLFLOW_TRACKING_URI`, else the run
home's local store) and the registered model its agents are registered as, whose `champion` alias
`ask`, `serve` and `transfer-eval` take when no agent is named, and how many training rollouts
a step shows as traces. None changes what a run computes, so none is part of the run's identity
(`Config.hash`).

A config file is shared (committed, logged as MLflow params): a URI holding a password is refused
here; credentials go in `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD` or in
`MLFLOW_TRACKING_URI`, which is never logged unscrubbed (`core.urls.redact_url`).
"""

from __future__ import annotations


from pydantic import Field, field_validator

from prompt_r1.core.urls import redact_url
from prompt_r1.config.base import SafeName, StrictModel

REGISTERED_MODEL_PREFIX = "prompt-r1-"
CHAMPION_ALIAS = "champion"


def default_registered_model(config_name: str) -> str:
    """The registered model of a config that names none.

    >>> default_registered_model("demo")
    'prompt-r1-demo'
    """
    return f"{REGISTERED_MODEL_PREFIX}{config_name}"


def champion_uri(registered_model: str) -> str:
    """The registry URI of a registered model's champion.

    >>> champion_uri("prompt-r1-demo")
    'models:/prompt-r1-demo@champion'
    """
    return f"models:/{registered_model}@{CHAMPION_ALIAS}"


class TrackingConfig(StrictModel):
    uri: str | None = Field(
        None,
        description="MLflow tracking and registry URI of this config's runs, models and traces (e.g. "
        "http://mlflow.team:5000). Unset: `MLFLOW_TRACKING_URI` when set, else the run home's "
        "`mlflow.db`. No password here: use MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.",
    )
    registered_model: SafeName | None = Field(
        None,
        description="Registered model this config's trained agents join; its `champion` alias is the agent "
        "`ask`, `serve` and `transfer-eval` take without --agent. Unset: `prompt-r1-<name>`.",
    )
    trace_rollouts: int = Field(
        4, ge=0,
        description="Training trajectories logged as MLflow traces per step (in the train run, at each "
        "checkpoint), picked evenly over the step's batch by environment and question, tagged `step`, "
        "`reward`, `advantage` and `environment`; 0 = none. Every trajectory stays in the warehouse either way.",
    )

    @field_validator("uri")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("empty; leave tracking.uri out to use MLFLOW_TRACKING_URI or the local store")
        if redact_url(value) != value:
            raise ValueError("holds a password, and a config is logged and shared: put the user name and password "
                             "in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or the whole URI in "
                             "MLFLOW_TRACKING_URI")
        return value
