"""What every `prompt-r1` command shares: the typer app, the common options, config loading with
`--set` overrides, and the two ways a command fails (exit 2 for the user's input, exit 3 for an
environment that failed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from prompt_r1.config.experiment import default_db_path, load_config, parse_overrides
from prompt_r1.config.base import ConfigError
from prompt_r1.core.signals import install_sigterm_interrupt
from prompt_r1.cli.logging_setup import setup_logging

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

    from prompt_r1.core.failures import EXIT_CODE

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


def _load(config: Path, overrides: list[str] | None = None):
    try:
        return load_config(config, parse_overrides(overrides))
    except ConfigError as err:
        _fail(str(err))


def _agent_folder(spec: Optional[str], cfg) -> Path | str:
    """The agent folder `spec` names (`prompt_r1.models.resolver`), or exit 2 saying which forms it takes."""
    from prompt_r1.models.resolver import AgentSpecError, resolve_agent

    try:
        return resolve_agent(spec, default_model=cfg.agent.model, config_name=cfg.name)
    except (AgentSpecError, FileNotFoundError) as err:
        _fail(str(err))


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    setup_logging("DEBUG" if verbose else None)
    # SIGTERM (a process manager, `kill`) stops a command as Ctrl-C does: `finally` blocks and context
    # managers run, so managed servers and Ray actors stop, instead of Python dying at once
    # (`prompt_r1.core.signals`; `init_ray` hands SIGTERM back after Ray takes it over).
    install_sigterm_interrupt()  # main thread only: Python handles signals there only
