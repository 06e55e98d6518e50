"""`train` flow: per step rollout -> reward -> GRPO update -> broadcast -> checkpoint, in MLflow.

The schedule is the library's (`TrainingSession.run`, the same loop as `prompt-r1 train`); the
flow adds run bookkeeping: which MLflow run to continue, metrics, and the agent's registration.

A crashed or cancelled run is continued by running the flow again with the same config, by the
rule every entry point uses (`run_folder.find_resumable`): the newest unfinished run folder of this
config hash and training pool; the flow continues the MLflow run of that id, loads its last
checkpoint and goes on. Unfinished runs under other settings are left alone (and the log says
why): a new run starts. A scheduled run that crashed and is retried (`tasks.recovery`) continues
its own training run, whatever `resume` says, and never another scheduled run's. Metrics are flushed to MLflow at checkpoints only, so the redone steps are
never logged twice. The training pool is built once (`TrainingPool.load`) and handed to the run
choice, the dataset record and the session.
"""

from __future__ import annotations

from typing import Any

import mlflow
from prefect import flow

from prompt_r1 import load_config
from prompt_r1.config.experiment import Config
from prompt_r1.config.run_home import default_db_path, run_dir
from prompt_r1.core.failures import EnvironmentFailure
from prompt_r1.data.pool import TrainingPool
from prompt_r1.training.rollout_traces import RolloutTracer
from prompt_r1.training.session import TrainingSession
from tasks.artifacts import publish_training_metrics
from tasks.recovery import RESUMES_TAG, ScheduledRun, add_resume, check_attempts, scheduled_run
from tasks.stages import FlowTrainingHooks, ingest_sources, registration_score
from tasks.tracking.registry import register_agent
from tasks.tracking.runs import MetricBuffer, log_datasets, log_run_identity, open_training_run, setup_mlflow
from warehouse.store import Warehouse


@flow(name="train", log_prints=True)
def train_flow(config: str = "configs/smoke.yaml", overrides: dict[str, Any] | None = None,
               resume: bool = True, parent_run_id: str | None = None, ingest: bool = True) -> dict[str, Any]:
    """Train the agent with GRPO; returns the MLflow run id, final checkpoint and validation.
    `ingest=False`: the caller has ingested `data.sources` already (the pipeline, once per run)."""
    scheduled = scheduled_run()
    check_attempts(scheduled)
    cfg = load_config(config, overrides)
    exp_id = setup_mlflow(cfg.name, cfg.tracking.uri)
    db = str(default_db_path())
    if ingest:
        ingest_sources(list(cfg.data.sources), db, cfg.data.max_question_chars)
    with Warehouse(db) as wh:
        questions = TrainingPool.load(wh, cfg)
        run, continued = open_training_run(exp_id, cfg, questions, resume, parent_run_id, scheduled)
        with run:
            outcome, version, champion = _train(cfg, config, wh, run.info.run_id, questions, logged=continued,
                                                scheduled=scheduled)
    final, val = outcome.agent, outcome.validation
    return {"run_id": run.info.run_id, "checkpoint": str(final) if final else None, "validation": val,
            "validation_before": outcome.validation_before,
            "model_version": version, "champion": champion}


def rollout_tracer(cfg: Config, questions: TrainingPool) -> RolloutTracer | None:
    """`tracking.trace_rollouts` trajectories a step as traces (None when 0), shown with their questions."""
    if not cfg.tracking.trace_rollouts:
        return None
    return RolloutTracer(cfg, cfg.tracking.trace_rollouts, {q.question_id: q for q in questions.train})


def _train(cfg: Config, config: str, wh: Warehouse, run_id: str, questions: TrainingPool, logged: bool,
           scheduled: ScheduledRun | None = None):
    """The session inside the active MLflow run: identity and datasets (once per run), metrics,
    and the agent's registration; a continued run records the attempt and the step it resumed at
    (`RESUMES_TAG`). Returns (outcome, registered version, became champion)."""
    if not logged:
        log_run_identity(cfg, "train", wh.source_hashes(), config)
        log_datasets(wh, cfg, "training", pool=questions)
    buffer = MetricBuffer(run_id)
    with TrainingSession(cfg, wh, run_id, run_dir(cfg.name, run_id), resume=True, questions=questions) as session:
        buffer.recover(session.ckpt_dir / f"metrics-{session.step:05d}.json")
        if logged:
            previous = mlflow.get_run(run_id).data.tags.get(RESUMES_TAG)
            mlflow.set_tag(RESUMES_TAG, add_resume(previous, scheduled.attempt if scheduled else 0, session.step))
        try:
            environments = cfg.training_environments() if cfg.train.environments else []  # per-env metrics
            hooks = FlowTrainingHooks(cfg.train.steps, buffer, session.ckpt_dir, environments, cfg.reward.format_cap,
                                      tracer=rollout_tracer(cfg, questions))
            outcome = session.run(hooks)
        except EnvironmentFailure as err:  # the flow and MLflow run fail; nothing is registered
            mlflow.set_tag("env_failure", str(err)[:5000])
            raise
    if hooks.history:
        publish_training_metrics(hooks.history)
    # never registered (or promoted) on a score computed from failures
    final = outcome.agent
    version, champion = (register_agent(run_id, final, registration_score(outcome.validation, bool(questions.validation)),
                                        model_name=cfg.registered_model())
                         if final else (None, False))
    mlflow.set_tags({"registered_model": cfg.registered_model(), "registered_version": str(version),
                     "champion": str(champion)})
    session.mark_finished()
    return outcome, version, champion
