"""The Python API: load a config, train an agent, evaluate it, and ask it questions.

Four calls cover what the command line does, for a notebook or a script; the CLI's `train`,
`evaluate` and `ask` are thin wrappers over them. Nothing here needs Prefect or MLflow (the
flows add those on top of the same library):

    import prompt_r1
    cfg = prompt_r1.load_config("configs/smoke.yaml", {"train.steps": 1})
    run = prompt_r1.train(cfg)                      # GRPO: rollout -> reward -> update
    print(run.validation_before, "->", run.validation_after, run.agent)
    agent = prompt_r1.load_agent(str(run.agent), cfg)
    print(agent.ask("What is the capital of France?").answer)
    report = prompt_r1.evaluate(cfg, agents={"trained": str(run.agent)})

Errors for bad input are `ConfigError`, `AgentSpecError`, `ResumeError`, `EvalError` (all
`ValueError`s naming what to change); an environment that fails too often raises
`EnvironmentFailure`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.config.experiment import Config, load_config as _load_yaml, parse_overrides
from prompt_r1.config.run_home import default_db_path, logs_dir, new_run_id, run_dir, runs_home

if TYPE_CHECKING:
    from prompt_r1.data.pool import TrainingPool
    from prompt_r1.config.env import EnvConfig
    from prompt_r1.core.trajectory import Trajectory
    from prompt_r1.evaluation.evaluate import EvalOutcome
    from prompt_r1.training.hooks import TrainingHooks
    from warehouse.store import Warehouse


def load_config(path: str | Path, overrides: Mapping[str, Any] | Sequence[str] | None = None) -> Config:
    """A validated experiment config from YAML; `overrides` are dotted keys, as a mapping
    (`{"train.steps": 3}`) or `--set` strings (`["train.steps=3"]`). Raises `ConfigError`."""
    if overrides is not None and not isinstance(overrides, Mapping):
        overrides = parse_overrides(list(overrides))
    return _load_yaml(path, dict(overrides or {}))


@contextmanager
def open_warehouse(path: str | Path | None = None, read_only: bool = False) -> Iterator["Warehouse"]:
    """The DuckDB warehouse (default `$PROMPT_R1_HOME/warehouse.duckdb`), closed on exit."""
    from warehouse.store import Warehouse

    with Warehouse(Path(path) if path else default_db_path(), read_only=read_only) as wh:
        yield wh


def _ingest_sources(wh: "Warehouse", cfg: Config) -> None:
    """Every command that reads questions ingests the config's `data.sources` first, so an edited file,
    a new mapping or a changed scorer is what it uses (an unchanged source costs one hash lookup)."""
    from prompt_r1.data.ingest import ingest

    ingest(wh, cfg.data.sources, cfg.data.max_question_chars)


@dataclass
class TrainResult:
    """One finished training run: its id and folder, the exported agent, validation before/after."""

    run_id: str
    folder: Path
    agent: Path | None
    validation_before: dict[str, float]
    validation_after: dict[str, float]


def resumable_run(cfg: Config, questions: "TrainingPool") -> str:
    """The newest unfinished run of this config and training pool, or `ResumeError` saying why none."""
    from prompt_r1.training.run_folder import ResumeError, find_resumable

    pool = questions.hash
    run_id, skipped = find_resumable(runs_home() / cfg.name, cfg.hash(), pool)
    if run_id is None:
        passed = "".join(f"\n  passed over {reason}" for reason in skipped)
        raise ResumeError(
            f"--resume: no unfinished run of `{cfg.name}` with config hash {cfg.hash()} and this training pool "
            f"({pool}) under {runs_home() / cfg.name}.{passed}\nStart a new run (drop --resume), or continue a run "
            "by id under the new config with --run-id ID --resume --force")
    return run_id


def train(cfg: Config, *, run_id: str | None = None, resume: bool = False, force: bool = False,
          warehouse: str | Path | None = None, hooks: "TrainingHooks | None" = None,
          on_start: Callable[[str, Path], None] | None = None) -> TrainResult:
    """GRPO training as configured: ingest `data.sources`, then validate -> (rollout -> reward ->
    update -> broadcast -> checkpoint) x `train.steps` -> export. `resume` continues `run_id`, or
    the newest unfinished run of this config; `force` continues it under a changed config.
    `on_start(run_id, folder)` is called once the run is known."""
    from prompt_r1.data.pool import TrainingPool
    from prompt_r1.training.run_folder import ResumeError
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession

    if force and not resume:
        raise ResumeError("--force only applies to --resume (it continues a run under a changed config)")
    if run_id is not None:
        run_dir(cfg.name, run_id)  # the one run-name rule, before any work
    with open_warehouse(warehouse) as wh:
        _ingest_sources(wh, cfg)
        questions = TrainingPool.load(wh, cfg)  # built once: the run choice and the session read it
        if resume and not run_id:
            run_id = resumable_run(cfg, questions)
        elif resume and not run_dir(cfg.name, run_id).is_dir():
            raise ResumeError(f"--resume: no run {run_id!r} under {runs_home() / cfg.name}")
        run_id = run_id or new_run_id()
        folder = run_dir(cfg.name, run_id)
        if on_start:
            on_start(run_id, folder)
        with TrainingSession(cfg, wh, run_id, folder, resume=resume, force=force, questions=questions) as session:
            outcome = session.run(hooks or TrainingHooks(cfg.train.steps))
            session.mark_finished()
    return TrainResult(run_id, folder, outcome.agent, outcome.validation_before, outcome.validation)


@dataclass
class EvalResult:
    """One evaluation: its id, the report folder and files, and the rows behind them."""

    run_id: str
    folder: Path
    files: dict[str, Path]
    outcome: "EvalOutcome"

    @property
    def results(self) -> list[dict[str, Any]]:
        """One row per (environment, dataset, method) cell: scores, intervals, errors, cost."""
        return self.outcome.results

    def table(self) -> str:
        """The wide Markdown table the report opens with."""
        from prompt_r1.evaluation.report import markdown_table

        return markdown_table(self.outcome.results)


def evaluate(cfg: Config, *, agents: Mapping[str, str] | Sequence[str] = (), run_id: str | None = None,
             out: str | Path | None = None, warehouse: str | Path | None = None,
             concurrent: bool = True, overwrite: bool = False) -> EvalResult:
    """Evaluate `eval.methods` x `eval.suites` x environments and write the report. `agents` maps
    labels to specs (`{"trained": "runs/smoke/RUN_ID"}`) or lists `LABEL=SPEC` / `SPEC` strings;
    the labels of `eval.agent_checkpoints` are resolved as the CLI's `--agent` does. An `out`
    folder must be new, empty or an earlier report (that one only with `overwrite`), as `export`'s."""
    from prompt_r1.evaluation.evaluate import evaluate as run_evaluation
    from prompt_r1.evaluation.report import check_report_folder, mark_report_folder, write_report
    from prompt_r1.models.resolver import parse_labelled_specs, resolve_agents

    if run_id is not None:
        run_dir(cfg.name, run_id)  # the one run-name rule, before any agent is built
    if out is not None:
        check_report_folder(Path(out), overwrite)  # before any work: never over a user's files
    given = dict(agents) if isinstance(agents, Mapping) else parse_labelled_specs(list(agents))
    folders = resolve_agents(cfg, given)
    from prompt_r1.evaluation.heldout import environment_split

    split = environment_split(cfg, folders)  # reads agent:trained's training config: a bad one fails before any work
    run_id = run_id or new_run_id()
    folder = Path(out) if out else run_dir(cfg.name, run_id) / "eval"
    if out is not None:
        mark_report_folder(folder)  # ours from here on: a failed run can be rerun into it with `overwrite`
    with open_warehouse(warehouse) as wh:
        _ingest_sources(wh, cfg)
        outcome = run_evaluation(cfg, wh, run_id, folders, log_dir=folder / "logs", concurrent=concurrent)
    files = write_report(outcome.results, outcome.examples, folder, outcome.seconds, outcome.predictions,
                         outcome.baselines, split, outcome.suites, outcome.turns)
    return EvalResult(run_id, folder, files, outcome)


@dataclass
class Answer:
    """An agent's answer to one question, with the whole episode behind it."""

    question: str
    trajectory: "Trajectory"
    env_cfg: "EnvConfig" = field(repr=False)
    agent: str
    seconds: float

    @property
    def answer(self) -> str:
        """The `<answer>` of the agent's final turn (never text the environment wrote)."""
        return self.trajectory.answer

    @property
    def environment(self) -> str:
        """The name of the environment LLM the agent prompted."""
        return self.env_cfg.name

    @property
    def error(self) -> str | None:
        """Why an environment call of this episode failed (None when all succeeded)."""
        from prompt_r1.serving.service import env_failure

        return env_failure(self.trajectory)

    def report(self, tokens: bool = False) -> dict[str, Any]:
        """The episode as `prompt-r1 ask --json` prints it: turns, environment calls, tokens, cost."""
        from prompt_r1.serving.service import episode_report

        return episode_report(self.question, self.trajectory, self.env_cfg, self.agent, self.seconds, tokens=tokens)


class Agent:
    """A loaded agent policy in front of a config's environment LLMs (`load_agent` makes one)."""

    def __init__(self, folder: Path | str, cfg: Config):
        from prompt_r1.evaluation.evaluate import eval_agent
        from prompt_r1.policy import make_policy

        self.folder, self.cfg = folder, cfg
        self.policy = make_policy(eval_agent(cfg), folder, seed=cfg.seed)

    def ask(self, question: str, environment: str | None = None,
            on_event: Callable[[str, str], None] | None = None) -> Answer:
        """One greedy episode on `question` against the environment called `environment` (the
        training one by default). `on_event(kind, text)` sees each `interaction` and `reply`.
        A failed environment call is in `Answer.error`, never in the answer."""
        from prompt_r1.env import open_environment
        from prompt_r1.serving.service import answer_question, check_question, pick_environment, watch_environment

        check_question(question, self.cfg.data.max_question_chars)  # before an environment (perhaps a server) opens
        env_cfg = pick_environment(self.cfg, environment)
        started = time.perf_counter()
        with open_environment(env_cfg, log_dir=logs_dir()) as env:
            async def run() -> "Trajectory":
                try:
                    watched = watch_environment(env, on_event) if on_event else env
                    return await answer_question(self.policy, watched, question, self.cfg)
                finally:
                    await env.aclose()

            traj = asyncio.run(run())
        return Answer(question, traj, env_cfg, str(self.folder), time.perf_counter() - started)


def load_agent(spec: str | None, cfg: Config) -> Agent:
    """The agent `spec` names (bundled name, folder, run id, `models:/` URI when a registry scheme
    is installed, hub id; None: the config's registered champion, else `agent.model`). Raises
    `AgentSpecError` naming the forms it accepts."""
    from prompt_r1.models.resolver import resolve_agent

    return Agent(resolve_agent(spec, default_model=cfg.agent.model, cfg=cfg), cfg)
