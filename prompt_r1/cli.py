"""`prompt-r1` command line: thin typer commands over the library (no logic of its own).

Every command takes `--config FILE` where it needs settings; errors in user input end with a
one-paragraph message naming the file, row or key, and exit code 2. A run stopped because too
many environment calls failed ends with exit code 3 and a message naming the environment and
its first error. This module holds the shared helpers and the data / train / evaluate
commands; those that use a trained agent (ask, serve, export) are in `prompt_r1.cli_use`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from prompt_r1.config import DataConfig, default_db_path, load_config
from prompt_r1.config_base import ConfigError
from prompt_r1.logging_setup import setup_logging

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train a small agent LLM with GRPO to prompt a large environment LLM.")
console = Console()
ConfigOpt = typer.Option(..., "--config", "-c", help="YAML experiment config (see configs/).")
DbOpt = typer.Option(None, "--db", help="Warehouse file (default: $PROMPT_R1_HOME/warehouse.duckdb).")
SetOpt = typer.Option([], "--set", help="Override a config key: KEY=VALUE (repeatable).")


def _fail(message: str) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


def _fail_environment(err: Exception) -> None:
    """A run stopped by environment failures (`EnvironmentFailure`): its message and exit 3."""
    from rich.markup import escape

    from prompt_r1.failures import EXIT_CODE

    console.print(f"[bold red]environment failure:[/] {escape(str(err))}", soft_wrap=True, highlight=False)
    console.print("The failed calls are recorded in the warehouse (env_calls / eval_predictions .error); "
                  "nothing was scored from them and no agent was exported.", highlight=False)
    raise typer.Exit(EXIT_CODE)


def _open_db(db: Optional[Path], read_only: bool = False, wait_s: Optional[float] = None):
    """The warehouse, or exit 2 with a message naming the file (and the process holding it)."""
    from warehouse.store import LOCK_WAIT_S, Warehouse, WarehouseError

    try:
        return Warehouse(db or default_db_path(), read_only=read_only,
                         wait_s=LOCK_WAIT_S if wait_s is None else wait_s)
    except WarehouseError as err:
        _fail(str(err))


LockWaitOpt = typer.Option(None, "--lock-wait", min=0.0, help="Seconds to wait while another process holds "
                           "the warehouse before giving up (default 30).")


def parse_overrides(items: list[str] | None) -> dict:
    """`--set key.path=value` pairs; values are read as JSON when they parse, else as strings.

    >>> parse_overrides(["train.steps=3", 'eval.suites=["ood"]', "name=demo"])
    {'train.steps': 3, 'eval.suites': ['ood'], 'name': 'demo'}
    """
    parsed: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            _fail(f"--set expects KEY=VALUE, got {item!r}")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


def _load(config: Path, overrides: list[str] | None = None):
    try:
        return load_config(config, parse_overrides(overrides))
    except ConfigError as err:
        _fail(str(err))


def _agent_folder(spec: Optional[str], cfg) -> Path | str:
    """The agent folder `spec` names (`prompt_r1.agent_resolver`), or exit 2 saying which forms it takes."""
    from prompt_r1.agent_resolver import AgentSpecError, resolve_agent

    try:
        return resolve_agent(spec, default_model=cfg.agent.model, config_name=cfg.name)
    except (AgentSpecError, FileNotFoundError) as err:
        _fail(str(err))


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a process manager, `kill`) stops a command as Ctrl-C does: `finally` blocks and
    context managers run, so managed servers and Ray actors stop, instead of Python dying at once."""
    raise KeyboardInterrupt(f"signal {signum}")


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    import signal
    import threading

    setup_logging("DEBUG" if verbose else None)
    if threading.current_thread() is threading.main_thread():  # Python handles signals there only
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


@app.command()
def ingest(
    sources: list[str] = typer.Argument(..., help="Files/folders (Parquet, JSONL) or hf:NAME."),
    db: Optional[Path] = DbOpt,
    question_col: str = typer.Option("question", help="hf: column with the question."),
    answers_col: str = typer.Option("answers", help="hf: column with the gold answer(s)."),
    task_family: str = typer.Option("standard_qa", help="hf: task family of the dataset."),
    split: str = typer.Option("test", help="hf: split to record (train / test / ood)."),
    hf_split: str = typer.Option("train", help="hf: split of the HF dataset to load."),
    max_question_chars: int = typer.Option(
        DataConfig.model_fields["max_question_chars"].default, min=1,
        help="Longest question accepted (characters); a longer row is an error naming it."),
    lock_wait: Optional[float] = LockWaitOpt,
) -> None:
    """Ingest datasets into the warehouse: one question per source row. Re-ingesting an unchanged
    source is a no-op; a changed one updates its questions in place and says how many."""
    from prompt_r1.ingest import IngestError, ingest as ingest_paths, ingest_hf

    with _open_db(db, wait_s=lock_wait) as wh:
        reports = []
        try:
            for source in sources:
                if source.startswith("hf:"):
                    reports.append(ingest_hf(wh, source[3:], max_question_chars, question_col=question_col,
                                             answers_col=answers_col, task_family=task_family,
                                             split=split, hf_split=hf_split))
                else:
                    reports.extend(ingest_paths(wh, [source], max_question_chars))
        except IngestError as err:
            for r in reports:
                console.print(f"kept: {r.source} ({r.inserted} questions)")
            _fail(f"{err}\nNothing from that source was written; sources before it are kept.")
        for r in reports:
            console.print(f"{r.source}: {r.describe()}", highlight=False, soft_wrap=True)
        print_summary(wh)


def print_summary(wh) -> None:
    table = Table(title=f"warehouse {wh.path}")
    for col in ("dataset", "split", "task_family", "primary_metric", "n"):
        table.add_column(col, justify="right" if col == "n" else "left")
    for row in wh.question_summary():
        table.add_row(*(str(row[c]) for c in ("dataset", "split", "task_family", "primary_metric", "n")))
    console.print(table)


@app.command()
def summary(db: Optional[Path] = DbOpt, lock_wait: Optional[float] = LockWaitOpt) -> None:
    """Print what the warehouse holds (opens it read-only: readers never block each other)."""
    with _open_db(db, read_only=True, wait_s=lock_wait) as wh:
        print_summary(wh)
        console.print(wh.table_counts())


@app.command("check-config")
def check_config(config: Path = ConfigOpt) -> None:
    """Validate a config file and print its hash."""
    cfg = _load(config)
    console.print(f"{config}: ok (name={cfg.name}, hash={cfg.hash()})")


# -- commands added by later modules go below ----------------------------------------------


@app.command("serve-env")
def serve_env(
    config: Path = ConfigOpt,
    env: Optional[str] = typer.Option(None, "--env", help="Name of an `eval.environments` entry (default: `environment`)."),
) -> None:
    """Start the managed vLLM server of an environment, print its URL, and serve until Ctrl-C or SIGTERM."""
    import signal
    import time

    # A process started in the background by a non-interactive shell inherits SIGINT ignored, and
    # Python then never raises KeyboardInterrupt; this command promises that Ctrl-C and SIGTERM stop it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    from prompt_r1.config import runs_home
    from prompt_r1.env.vllm_server import VLLMServerError, managed_vllm_server

    cfg = _load(config)
    candidates = [cfg.environment, *cfg.eval.environments]
    if env is None:
        env_cfg = cfg.environment
    else:
        named = [e for e in candidates if e.name == env]
        if not named:
            _fail(f"{config}: no environment named {env!r}; known: {sorted({e.name for e in candidates})}")
        env_cfg = named[0]
    if env_cfg.kind != "vllm":
        _fail(f"{config}: environment {env_cfg.name!r} has kind={env_cfg.kind}; serve-env starts managed "
              "vLLM servers only (kind: vllm)")
    log_dir = runs_home() / "logs"
    console.print(f"starting vLLM for {env_cfg.model} (log under {log_dir}); this takes a minute on CPU ...")
    try:
        with managed_vllm_server(env_cfg, log_dir) as base_url:
            body = json.dumps({"model": env_cfg.model, "max_tokens": 32,
                               "messages": [{"role": "user", "content": "Say hello."}]})
            console.print(f"environment {env_cfg.name!r} serving {env_cfg.model} at {base_url}", highlight=False)
            console.print(f"try: curl {base_url}/chat/completions -H 'Content-Type: application/json' "
                          f"-d '{body}'", highlight=False, soft_wrap=True)
            console.print("Ctrl-C stops the server.")
            while True:
                time.sleep(3600)
    except VLLMServerError as err:
        _fail(str(err))
    except KeyboardInterrupt:
        pass
    console.print("server stopped")


@app.command()
def train(
    config: Path = ConfigOpt,
    db: Optional[Path] = DbOpt,
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id of a new run, or (with --resume) of the run to continue."),
    resume: bool = typer.Option(False, "--resume", help="Continue an unfinished run from its last checkpoint: the one "
                                "given by --run-id, else the newest one with this config hash and training pool. "
                                "A finished run is never resumed."),
    force: bool = typer.Option(False, "--force", help="With --resume: continue the run even though its config or "
                               "training pool changed (its checkpoints were trained under the old ones)."),
    set_: list[str] = SetOpt,
) -> None:
    """GRPO training: rollout -> reward -> update for `train.steps` (no Prefect/MLflow; see `pipeline`)."""
    from prompt_r1.config import new_run_id, run_dir, runs_home
    from prompt_r1.config_base import SAFE_NAME
    from prompt_r1.failures import EnvironmentFailure
    from prompt_r1.ingest import ingest as ingest_paths
    from prompt_r1.run_record import ResumeError, find_resumable
    from prompt_r1.train_loop import TrainingHooks, TrainingSession, training_pool_hash

    cfg = _load(config, set_)
    if force and not resume:
        _fail("--force only applies to --resume (it continues a run under a changed config)")
    if run_id is not None and not SAFE_NAME.match(run_id):
        _fail(f"--run-id {run_id!r}: use letters, digits, `.`, `_`, `-` (it becomes a folder name)")
    with _open_db(db) as wh:
        ingest_paths(wh, cfg.data.sources, cfg.data.max_question_chars)
        if resume and not run_id:
            try:
                pool = training_pool_hash(wh, cfg)
            except ValueError as err:
                _fail(str(err))
            run_id, skipped = find_resumable(runs_home() / cfg.name, cfg.hash(), pool)
            if run_id is None:
                passed = "".join(f"\n  passed over {reason}" for reason in skipped)
                _fail(f"--resume: no unfinished run of `{cfg.name}` with config hash {cfg.hash()} and this "
                      f"training pool ({pool}) under {runs_home() / cfg.name}.{passed}\nStart a new run (drop "
                      "--resume), or continue a run by id under the new config with --run-id ID --resume --force")
        elif resume and not run_dir(cfg.name, run_id).is_dir():
            _fail(f"--resume: no run {run_id!r} under {runs_home() / cfg.name}")
        run_id = run_id or new_run_id()
        folder = run_dir(cfg.name, run_id)
        console.print(f"{'resuming' if resume else 'starting'} run {run_id} ({folder}; config hash {cfg.hash()})",
                      highlight=False)
        try:
            with TrainingSession(cfg, wh, run_id, folder, resume=resume, force=force) as session:
                outcome = session.run(TrainingHooks(cfg.train.steps))
                session.mark_finished()
        except ResumeError as err:
            _fail(str(err))
        except EnvironmentFailure as err:
            _fail_environment(err)
    shown = lambda v: f"{v['val_reward']:.3f}" if "val_reward" in v else "n/a"  # noqa: E731
    console.print(f"run {run_id}: {cfg.train.steps} steps; validation reward {shown(outcome.validation_before)} "
                  f"before -> {shown(outcome.validation)} after; trained agent (plain HF folder): {outcome.agent}",
                  highlight=False)


@app.command()
def evaluate(
    config: Path = ConfigOpt,
    db: Optional[Path] = DbOpt,
    agent: list[str] = typer.Option([], "--agent", help="LABEL=SPEC or SPEC (repeatable): a bundled model, a folder, a training run id or a models:/ URI, e.g. trained=runs/smoke/RUN_ID; labels `base` (the config's agent.model) and `champion` (the registry's) need no SPEC: list them in eval.agent_checkpoints."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder (default: the run folder)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id for the warehouse rows."),
    sequential: bool = typer.Option(False, help="One environment call at a time (for timing)."),
    set_: list[str] = SetOpt,
) -> None:
    """Evaluate methods x suites x environments; writes warehouse rows, tables and plots."""
    from prompt_r1.agent_resolver import AgentSpecError, parse_labelled_specs, resolve_agents
    from prompt_r1.config import new_run_id, run_dir
    from prompt_r1.eval_report import markdown_table, write_report
    from prompt_r1.evaluate import EvalError, evaluate as run_evaluation
    from prompt_r1.failures import EnvironmentFailure
    from prompt_r1.ingest import ingest as ingest_paths

    cfg = _load(config, set_)
    try:
        agents = resolve_agents(cfg, parse_labelled_specs(agent))
    except (AgentSpecError, FileNotFoundError) as err:
        _fail(str(err))
    run_id = run_id or new_run_id()
    folder = out or run_dir(cfg.name, run_id) / "eval"
    with _open_db(db) as wh:
        if not wh.question_summary():
            ingest_paths(wh, cfg.data.sources, cfg.data.max_question_chars)
        try:
            outcome = run_evaluation(cfg, wh, run_id, agents, log_dir=folder / "logs",
                                     concurrent=not sequential)
        except EvalError as err:
            _fail(str(err))
        except EnvironmentFailure as err:
            _fail_environment(err)
    files = write_report(outcome.results, outcome.examples, folder, outcome.seconds, outcome.predictions,
                         outcome.baselines)
    console.print(markdown_table(outcome.results))
    console.print(f"run id {run_id}; report: {files['markdown']}; plots in {folder}")


@app.command()
def rollout(
    config: Path = ConfigOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="Write one JSON trajectory per line here."),
    db: Optional[Path] = DbOpt,
    workers: Optional[int] = typer.Option(None, "--workers", help="Ray rollout actors (default: rollout.num_workers)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id for the warehouse rows (step 0)."),
    set_: list[str] = SetOpt,
) -> None:
    """Sample one rollout batch of training questions through Ray actors; store and summarise it."""
    import random

    from prompt_r1.config import new_run_id, run_dir
    from prompt_r1.ingest import ingest as ingest_paths
    from prompt_r1.ray_rollout import RolloutPool, actor_environment, init_ray
    from collections import Counter

    from prompt_r1.seeding import derive_seed
    from prompt_r1.trajectory import env_call_records, rollout_stats

    cfg = _load(config, set_)
    run_id = run_id or new_run_id()
    with _open_db(db) as wh:
        if not wh.questions(splits=["train"]):
            ingest_paths(wh, cfg.data.sources, cfg.data.max_question_chars)
        pool_questions = wh.questions(splits=["train"], datasets=cfg.data.train_datasets or None)
        if not pool_questions:
            _fail(f"no train-split questions in {wh.path} (sources: {cfg.data.sources}); "
                  "ingest a dataset with a train split first (`prompt-r1 ingest ...`)")
        random.Random(derive_seed("training_pool", cfg.seed)).shuffle(pool_questions)
        questions = pool_questions[: cfg.rollout.batch_questions]
        init_ray(cfg.rollout)
        with actor_environment(cfg.environment, run_dir(cfg.name, run_id) / "logs") as env_cfg:
            actor_cfg = cfg.model_copy(update={"environment": env_cfg})
            with RolloutPool(actor_cfg, _agent_folder(cfg.agent.model, cfg), workers) as pool:
                trajectories = pool.rollout(questions, step=0)
        records = [t.to_record() for t in trajectories]
        wh.replace_step(run_id, 0, records, env_call_records(trajectories))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in records))
    stats = rollout_stats(trajectories, format_cap=cfg.reward.format_cap)
    console.print(
        f"run {run_id}: {len(trajectories)} trajectories from {len(questions)} questions; "
        f"mean reward {stats['reward_mean']:.3f} (format {stats['format_mean']:.3f}, at the cap "
        f"{stats['format_valid_rate']:.0%}, answer {stats['answer_score']:.3f}); agent turns {stats['turns']:.2f}; "
        f"env calls {stats['env_calls']:.2f} per trajectory ({stats['env_error_rate']:.0%} failed); "
        f"stop reasons {dict(Counter(t.stop_reason for t in trajectories))}"
        + (f"; wrote {out}" if out else ""))


# The use-the-agent commands (ask, serve, export) register themselves on `app`.
from prompt_r1 import cli_use  # noqa: E402,F401

if __name__ == "__main__":  # pragma: no cover
    from prompt_r1.cli import app as registered  # the imported module's app, which cli_use extended

    sys.exit(registered())
