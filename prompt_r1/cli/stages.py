"""The commands for the pipeline's stages: `ingest`, `summary`, `check-config`, `plan`,
`serve-env`, `train`, `evaluate` and `rollout`, each a thin typer wrapper over the library's API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from prompt_r1.cli.common import (
    ConfigOpt, DbOpt, LockWaitOpt, SetOpt, _agent_folder, fail, load, _open_db, app, console,
)
from prompt_r1.config.experiment import DataConfig
from prompt_r1.planning.memory import DEFAULT_PROMPT_TOKENS


@app.command()
def ingest(
    sources: list[str] = typer.Argument(..., help="Files/folders (Parquet, JSONL), hf:NAME, or verifiers:ENV_ID "
                                        "(an installed verifiers environment; its rubric scores the dataset)."),
    db: Optional[Path] = DbOpt,
    question_col: str = typer.Option("question", help="hf: column with the question (a dotted path walks into a "
                                     "struct column)."),
    answers_col: str = typer.Option("answers", help="hf: column with the gold answer(s), e.g. answers.text."),
    task_family: str = typer.Option("standard_qa", help="hf: task family of the dataset."),
    split: Optional[str] = typer.Option(None, help="hf: split to file the questions under (train / test / ood); "
                                        "default: train for the train split, test for any other."),
    hf_split: str = typer.Option("train", help="hf: split of the HF dataset to load."),
    hf_config: Optional[str] = typer.Option(None, "--hf-config", help="hf: the dataset's configuration (gsm8k's main)."),
    max_question_chars: int = typer.Option(
        DataConfig.model_fields["max_question_chars"].default, min=1,
        help="Longest question accepted (characters); a longer row is an error naming it."),
    lock_wait: Optional[float] = LockWaitOpt,
) -> None:
    """Ingest datasets into the warehouse: one question per source row. Re-ingesting an unchanged
    source is a no-op; a changed one updates its questions in place and says how many."""
    from pydantic import ValidationError

    from prompt_r1.config.sampling import DataSource
    from prompt_r1.data.ingest import ingest as ingest_paths, ingest_hf_source
    from prompt_r1.data.rows import IngestError

    with _open_db(db, wait_s=lock_wait) as wh:
        reports = []
        try:
            for source in sources:
                if source.startswith("hf:"):  # the same entry a config's data.sources takes
                    try:
                        entry = DataSource(path=source, config=hf_config, hf_split=hf_split, split=split,
                                           task_family=task_family,
                                           columns={"question": question_col, "answers": answers_col})
                    except ValidationError as err:
                        fail(f"{source}: {'; '.join(e['msg'] for e in err.errors())}")
                    reports.append(ingest_hf_source(wh, entry, source, max_question_chars))
                else:
                    reports.extend(ingest_paths(wh, [source], max_question_chars))
        except IngestError as err:
            for r in reports:
                console.print(f"kept: {escape(r.source)} ({r.inserted} questions)", highlight=False)
            fail(f"{err}\nNothing from that source was written; sources before it are kept.")
        for r in reports:
            console.print(f"{escape(r.source)}: {r.describe()}", highlight=False, soft_wrap=True)
        print_summary(wh)


def print_summary(wh) -> None:
    table = Table(title=f"warehouse {wh.path}")
    for col in ("dataset", "split", "task_family", "primary_metric", "n"):
        table.add_column(col, justify="right" if col == "n" else "left")
    for row in wh.question_summary():
        table.add_row(*(escape(str(row[c])) for c in ("dataset", "split", "task_family", "primary_metric", "n")))
    console.print(table)


@app.command()
def summary(db: Optional[Path] = DbOpt, lock_wait: Optional[float] = LockWaitOpt) -> None:
    """Print what the warehouse holds (opens it read-only: readers never block each other)."""
    with _open_db(db, read_only=True, wait_s=lock_wait) as wh:
        print_summary(wh)
        console.print(wh.table_counts())


@app.command("check-config")
def check_config(config: Path = ConfigOpt, set_: list[str] = SetOpt) -> None:
    """Validate a config file (with its `--set` overrides) and print its hash."""
    cfg = load(config, set_)
    console.print(f"{config}: ok (name={cfg.name}, hash={cfg.hash()})")


@app.command()
def plan(
    config: Path = ConfigOpt,
    set_: list[str] = SetOpt,
    nodes: int = typer.Option(1, "--nodes", min=1, help="Nodes, all alike."),
    gpus_per_node: Optional[int] = typer.Option(
        None, "--gpus-per-node", min=0, help="GPUs per node (default: as many as this machine has; 0 = plan "
        "for host memory)."),
    gpu_memory_gib: Optional[float] = typer.Option(
        None, "--gpu-memory-gib", min=0.1, help="Memory of one GPU in GiB (default: this machine's GPUs', else 80)."),
    host_memory_gib: Optional[float] = typer.Option(
        None, "--host-memory-gib", min=0.1, help="RAM of one node in GiB (default: this machine's)."),
    params: Optional[float] = typer.Option(
        None, "--params", min=1e6, help="The agent's parameter count (e.g. 4e9), for a model without a "
        "config.json here; with one, it overrides the count computed from it."),
    prompt_tokens: int = typer.Option(
        DEFAULT_PROMPT_TOKENS, "--prompt-tokens", min=1,
        help="Prompt tokens per trajectory (the instruction template and a question; an estimate)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the plan, as JSON."),
) -> None:
    """Whether a config fits the machines, before any model loads: memory per GPU and where each
    learner rank and rollout engine goes (exit 0), or what does not fit and the setting to change (exit 2)."""
    from prompt_r1.planning.plan import make_plan
    from prompt_r1.planning.machine import agent_architecture, check_train_device, check_train_device_on, local_machine

    cfg = load(config, set_)
    if gpus_per_node is None:  # planned for this machine: its GPUs must hold train.device, as train checks
        check_train_device(cfg)
    arch = agent_architecture(cfg, params)
    machine = local_machine(nodes, gpus_per_node, gpu_memory_gib, host_memory_gib)
    check_train_device_on(cfg, machine)  # the planned node must hold train.device's index too
    result = make_plan(cfg, arch, machine, prompt_tokens, source=str(config))
    if as_json and result.fits:
        print(json.dumps(result.to_dict(), indent=2))
    elif not as_json:
        console.print(result.render(), markup=False, highlight=False, soft_wrap=True)
    if not result.fits:
        fail(result.error(), plan=result.to_dict())


# -- commands added by later modules go below ----------------------------------------------


@app.command("serve-env")
def serve_env(
    config: Path = ConfigOpt,
    env: Optional[str] = typer.Option(None, "--env", help="Name of a `train.environments` or `eval.environments` entry (default: `environment`)."),
) -> None:
    """Start the managed vLLM server of an environment, print its URL, and serve until Ctrl-C or SIGTERM."""
    import time

    from prompt_r1.config.run_home import logs_dir
    from prompt_r1.env.vllm_server import VLLMServerError, managed_vllm_server

    cfg = load(config)
    candidates = [cfg.environment, *cfg.training_environments(), *cfg.eval.environments]
    if env is None:
        env_cfg = cfg.environment
    else:
        named = [e for e in candidates if e.name == env]
        if not named:
            fail(f"{config}: no environment named {env!r}; known: {sorted({e.name for e in candidates})}")
        env_cfg = named[0]
    if env_cfg.kind != "vllm":
        fail(f"{config}: environment {env_cfg.name!r} has kind={env_cfg.kind}; serve-env starts managed "
              "vLLM servers only (kind: vllm)")
    log_dir = logs_dir()
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
        fail(str(err))
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
    from prompt_r1 import api
    from prompt_r1.training.checks import check_run_settings

    cfg = load(config, set_)
    check_run_settings(cfg)  # before "starting run" is printed (the session checks again, with the rest)

    def started(run_id: str, folder: Path) -> None:
        console.print(f"{'resuming' if resume else 'starting'} run {run_id} ({folder}; config hash {cfg.hash()})",
                      highlight=False)

    # A user error (ConfigError, ResumeError, CheckpointError, ...) ends as one line and exit 2, an
    # EnvironmentFailure as exit 3: the app's command group does that for every command (common.py).
    run = api.train(cfg, run_id=run_id, resume=resume, force=force, warehouse=db, on_start=started)
    shown = lambda v: f"{v['val_reward']:.3f}" if "val_reward" in v else "n/a"  # noqa: E731
    console.print(f"run {run.run_id}: {cfg.train.steps} steps; validation reward {shown(run.validation_before)} "
                  f"before -> {shown(run.validation_after)} after; trained agent (plain HF folder): {run.agent}",
                  highlight=False)


@app.command()
def evaluate(
    config: Path = ConfigOpt,
    db: Optional[Path] = DbOpt,
    agent: list[str] = typer.Option([], "--agent", help="LABEL=SPEC or SPEC (repeatable): a bundled model, a folder, a training run id or a models:/ URI, e.g. trained=runs/smoke/RUN_ID; labels `base` (the config's agent.model) and `champion` (the registry's) need no SPEC: list them in eval.agent_checkpoints."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder (default: the run folder): new or "
                                       "empty, or an earlier report (with --overwrite)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over the earlier report in --out. A non-empty "
                                   "folder that holds no report is always refused, never written into."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id for the warehouse rows."),
    sequential: bool = typer.Option(False, help="One environment call at a time (for timing)."),
    set_: list[str] = SetOpt,
) -> None:
    """Evaluate methods x suites x environments; writes warehouse rows, tables and plots."""
    from prompt_r1 import api

    cfg = load(config, set_)
    result = api.evaluate(cfg, agents=agent, run_id=run_id, out=out, warehouse=db, concurrent=not sequential,
                          overwrite=overwrite)
    console.print(result.table())
    console.print(f"run id {result.run_id}; report: {result.files['markdown']}; plots in {result.folder}")


@app.command()
def rollout(
    config: Path = ConfigOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="Write one JSON trajectory per line here."),
    db: Optional[Path] = DbOpt,
    workers: Optional[int] = typer.Option(None, "--workers", help="Ray rollout actors, 1 or more (default: rollout.num_workers)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Id for the warehouse rows (step 0)."),
    set_: list[str] = SetOpt,
) -> None:
    """Sample one rollout batch of training questions through Ray actors; store and summarise it.

    Exit 3 (after storing the batch) when the share of failed environment calls passes
    its environment's `max_error_rate` (each environment of a `train.environments` pool against its own),
    as a training step would stop."""
    from prompt_r1.config.run_home import new_run_id, run_dir
    from prompt_r1.data.ingest import ingest as ingest_paths
    from prompt_r1.data.pool import TrainingPool
    from prompt_r1.cluster.connect import check_local_cpus, cpus_needed, init_ray
    from prompt_r1.rollout.pool import RolloutPool, actor_environments
    from collections import Counter

    from prompt_r1.core.failures import check_pool_error_rates
    from prompt_r1.core.trajectory import env_call_records, rollout_stats

    cfg = load(config, set_)
    run_id = run_id or new_run_id()
    # Mistakes fail before Ray starts: a run id that names no folder (ConfigError), more actors than
    # local CPUs (RayWaitError), an agent.model that is no agent (AgentSpecError).
    folder = run_dir(cfg.name, run_id)
    check_local_cpus(cfg.rollout, workers)
    agent = _agent_folder(cfg.agent.model, cfg)
    with _open_db(db) as wh:
        ingest_paths(wh, cfg.data.sources, cfg.data.max_question_chars)  # as train does: always current
        # the questions a training run with this config trains on, in its pool's order
        questions = TrainingPool.load(wh, cfg).train[: cfg.rollout.batch_questions]
        init_ray(cfg.rollout, cpus_needed(cfg, workers, learner=False))
        with actor_environments(cfg, folder / "logs") as actor_cfg:
            with RolloutPool(actor_cfg, agent, workers) as pool:
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
    # As a training step would: failed calls past max_error_rate make the batch an outage, not a sample (exit 3).
    check_pool_error_rates(cfg.training_environments(), trajectories, "the rollout")


