"""The `prompt-r1` entry point: the library's commands plus the orchestrated ones.

`prompt_r1.cli` holds the commands that need only the library; this module adds those that run
Prefect flows with MLflow tracking (`pipeline`, `run-flow`, `rerun`), keeping imports downward.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Optional

import typer

from prompt_r1.cli.common import ConfigOpt, SetOpt, app, console, fail, fail_environment, load
from prompt_r1.config.experiment import parse_overrides
from prompt_r1.models.resolver import register_scheme
from prompt_r1.serving.observers import observe_episodes
from prompt_r1.core.failures import EnvironmentFailure, UserError
from prompt_r1.training.checks import check_run
from flows.prefect_home import prefect_home_problem


def _check_prefect_home() -> None:
    """Stop before any flow starts when Prefect's home cannot be used (see flows/prefect_home.py)."""
    if problem := prefect_home_problem():
        fail(problem)


def _registry_agent(uri: str) -> Path | None:
    """`models:/NAME@alias` / `models:/NAME/VERSION` -> local agent folder (MLflow imported only when used)."""
    from tasks.tracking.registry import registry_agent_path

    return registry_agent_path(uri)


class _UserErrorsWithoutTraceback(logging.Filter):
    """Prefect logs a failed flow or task run's exception with its traceback; a `UserError` (a bad
    setting found once the run had its data or model, such as a pack budget too small for the
    longest prompt) is then printed by the command as its one `error:` line, so Prefect's record of
    it keeps the message and drops the traceback. Other exceptions keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], UserError):
            record.exc_info, record.exc_text = None, None
        return True


for _name in ("prefect.flow_runs", "prefect.task_runs"):
    logging.getLogger(_name).addFilter(_UserErrorsWithoutTraceback())


# Under this CLI the library's agent resolver takes registry URIs (and defaults to the champion);
# the flows install the same resolver with `tasks.tracking.registry.install_registry_resolver`, which
# imports MLflow at once, so the command line keeps this lazy form to start fast.
register_scheme("models", _registry_agent)


@app.command()
def pipeline(
    config: Path = typer.Option(Path("configs/demo.yaml"), "--config", "-c", help="YAML experiment config."),
    data: Optional[str] = typer.Option(None, help="Extra data folder to ingest (e.g. path/to/prompt-r1-data)."),
    set_: list[str] = SetOpt,
) -> None:
    """Run the main job as a Prefect flow: ingest -> train -> evaluate, tracked in MLflow."""
    from flows.pipeline import pipeline_flow

    check_run(load(config, set_))  # validate before starting anything
    _check_prefect_home()
    try:
        result = pipeline_flow(str(config), data, parse_overrides(set_) or None)
    except EnvironmentFailure as err:
        fail_environment(err)
    console.print(f"pipeline run {result['run_id']}; report: {result['evaluate']['report']}")


@app.command("run-flow")
def run_flow(
    name: str = typer.Argument(..., help="ingest | train | evaluate | transfer-eval"),
    config: Path = ConfigOpt,
    agent: list[str] = typer.Option([], "--agent", help="evaluate: LABEL=SPEC or SPEC (repeatable), as "
                                    "`evaluate --agent`, e.g. trained=runs/smoke/RUN_ID."),
    set_: list[str] = SetOpt,
) -> None:
    """Run one flow locally (the same code the deployments run)."""
    from prompt_r1.models.resolver import parse_labelled_specs

    cfg = load(config, set_)
    if agent and name != "evaluate":
        fail(f"--agent is for `run-flow evaluate`, not {name!r} (transfer-eval evaluates the registry's champion)")
    agents = parse_labelled_specs(agent) or None
    if name == "train":
        check_run(cfg)
    _check_prefect_home()
    overrides = parse_overrides(set_) or None
    try:
        _run_named_flow(name, config, overrides, agents)
    except EnvironmentFailure as err:
        fail_environment(err)


def _run_named_flow(name: str, config: Path, overrides: dict | None, agents: dict[str, str] | None = None) -> None:
    from flows.evaluate import evaluate_flow
    from flows.ingest import ingest_flow
    from flows.train import train_flow

    if name == "ingest":
        console.print(ingest_flow(str(config)))
    elif name == "train":
        console.print(train_flow(str(config), overrides))
    elif name in ("evaluate", "transfer-eval"):
        result = evaluate_flow(str(config), agents, use_champion=name == "transfer-eval", overrides=overrides)
        console.print(f"evaluate run {result['run_id']}; report: {result['report']}")
    else:
        fail(f"unknown flow {name!r}: use ingest, train, evaluate or transfer-eval")


@app.command()
def rerun(run_id: str = typer.Argument(..., help="MLflow run id of a pipeline, train or evaluate run.")) -> None:
    """Repeat a tracked run with its exact recorded config (evaluations reproduce exactly)."""
    result = rerun_mlflow_run(run_id)
    console.print(f"rerun of {run_id}: new run {result['run_id']}")


def rerun_mlflow_run(run_id: str) -> dict:
    """Re-execute the flow of an MLflow run from its logged resolved config and agents."""
    _check_prefect_home()
    from prompt_r1.config.run_home import runs_home
    from prompt_r1.core.urls import redact_url
    from tasks.tracking.runs import is_local, point_mlflow, registry_uri, setup_mlflow, tracking_uri

    where = tracking_uri()  # MLFLOW_TRACKING_URI, else the run home's store
    if is_local(where) and not (runs_home() / "mlflow.db").is_file():  # a look-up must not create an empty store
        fail(f"no MLflow run {run_id}: nothing has been tracked under {runs_home()} (no mlflow.db; "
              "PROMPT_R1_HOME points elsewhere, or the run is on a tracking server: set MLFLOW_TRACKING_URI). "
              "Runs are tracked by `prompt-r1 pipeline` and `run-flow`")
    import mlflow
    from mlflow import MlflowClient

    from flows.evaluate import evaluate_flow
    from flows.pipeline import pipeline_flow
    from flows.train import train_flow
    from prompt_r1.core.urls import MASK

    point_mlflow(where, registry_uri(where))
    try:
        run = MlflowClient().get_run(run_id)
    except Exception:
        shown = redact_url(where)
        fail(f"no MLflow run {run_id} in {shown}" + (f" (see `mlflow ui --backend-store-uri {shown}`)"
                                                      if is_local(where) else ""))
    flow_name = run.data.tags.get("flow")
    tmp = Path(tempfile.mkdtemp(prefix="rerun-"))
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="config/resolved_config.yaml",
                                                dst_path=str(tmp))
    if any("base_url" in line and MASK in line for line in Path(local).read_text().splitlines()):
        fail(f"run {run_id}'s logged config has an environment base_url whose credentials were redacted ({MASK}; "
             "they are never stored in MLflow): rerun it from its config file (`prompt-r1 run-flow ... -c CONFIG`)")
    setup_mlflow(run.data.tags.get("config_name", "default"))
    if flow_name == "evaluate":  # the agent folders it evaluated, resolved again by the one resolver
        agents = {k[len("eval_agent."):]: v for k, v in run.data.params.items() if k.startswith("eval_agent.")}
        result = evaluate_flow(local, agents=agents, use_champion=run.data.tags.get("use_champion") == "True")
    elif flow_name == "train":
        result = train_flow(local, resume=False)
    elif flow_name == "pipeline":
        result = pipeline_flow(local)
    else:
        fail(f"run {run_id} has no `flow` tag (pipeline/train/evaluate); it was not made by prompt-r1")
    MlflowClient().set_tag(result["run_id"], "rerun_of", run_id)
    return result


def _trace_episode(*episode) -> None:
    from tasks.tracking.traces import trace_answer  # MLflow loads only when an episode is traced

    trace_answer(*episode)


observe_episodes(_trace_episode)  # `ask --trace` / `serve --trace`: each episode an MLflow trace


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
