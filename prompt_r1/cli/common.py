"""What every `prompt-r1` command shares: the typer app, the common options, config loading with
`--set` overrides, and the two ways a command fails (exit 2 for the user's input, exit 3 for an
environment that failed).

The app's command group turns those failures into one message wherever a command raises them:
a `UserError` (bad input or a missing resource: `ConfigError`, `AgentSpecError`, `ResumeError`,
`CheckpointError`, `WarehouseError`, `RayWaitError`, ...) ends as `error: <message>` and exit 2,
an `EnvironmentFailure` as its message and exit 3. Any other exception is a bug and keeps its
traceback. `--verbose` also logs the traceback of a user error. Under `ask --json` and
`plan --json` a failure is a JSON object on stdout (`{"error": ..., "exit_code": ...}`), the human
message goes to stderr, and logs always go to stderr, so stdout holds nothing but the JSON.
"""

from __future__ import annotations

import contextvars
import json
import logging
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from prompt_r1.config.experiment import load_config, parse_overrides
from prompt_r1.config.run_home import default_db_path
from prompt_r1.config.base import ConfigError
from prompt_r1.core.signals import install_sigterm_interrupt
from prompt_r1.cli.logging_setup import setup_logging

log = logging.getLogger(__name__)
# True while a command runs whose stdout is JSON only (`ask --json`, `plan --json`)
_json_stdout: contextvars.ContextVar[bool] = contextvars.ContextVar("json_stdout", default=False)


class _Commands(TyperGroup):
    """The app's command group: the one place a command's failure becomes its exit status."""

    def invoke(self, ctx: typer.Context) -> Any:
        from prompt_r1.core.failures import EnvironmentFailure, ProcessesDied, UserError

        # `ask` and `plan` have --json; knowing it before the command parses its options makes
        # even a usage error (a missing --config) a JSON object.
        token = _json_stdout.set("--json" in ctx.args)
        try:
            return super().invoke(ctx)
        except EnvironmentFailure as err:
            log.debug("environment failure", exc_info=True)
            fail_environment(err)
        except UserError as err:
            log.debug("user error", exc_info=True)
            fail(str(err))
        except ProcessesDied as err:
            log.debug("processes died", exc_info=True)
            fail_processes(err)
        except (typer.Exit, typer.Abort):
            raise
        except typer.TyperException as err:  # usage errors: click prints them (stderr) and exits 2
            if _json_output():
                _print_json_error(getattr(err, "format_message", err.__str__)(), getattr(err, "exit_code", 2))
            raise
        except Exception as err:  # a bug: the traceback follows (stderr); stdout stays JSON
            if _json_output():
                _print_json_error(f"internal error {type(err).__name__}: {err}", 1)
            raise
        finally:
            _json_stdout.reset(token)


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  help="Train a small agent LLM with GRPO to prompt a large environment LLM.")
# No emoji codes: the label `hf:squad::train` must print as typed, not as `hf:squad:` and an emoji.
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
ConfigOpt = typer.Option(..., "--config", "-c", help="YAML experiment config (see configs/).")
DbOpt = typer.Option(None, "--db", help="Warehouse file (default: $PROMPT_R1_HOME/warehouse.duckdb).")
SetOpt = typer.Option([], "--set", help="Override a config key: KEY=VALUE (repeatable).")


def _json_output() -> bool:
    """True while a command runs that prints JSON on stdout (`ask --json`, `plan --json`)."""
    return _json_stdout.get()


def _print_json_error(message: str, exit_code: int, **extra: Any) -> None:
    print(json.dumps({"error": message, "exit_code": exit_code, **extra}), flush=True)


def fail(message: str, **json_extra: Any) -> None:
    """Exit 2 with `error: <message>`. Under `--json` that line goes to stderr, and stdout gets a
    JSON object of the message, the exit code and `json_extra`."""
    from rich.markup import escape

    from prompt_r1.core.failures import USER_ERROR_EXIT_CODE

    if _json_output():
        _print_json_error(message, USER_ERROR_EXIT_CODE, **json_extra)
    (err_console if _json_output() else console).print(f"[bold red]error:[/] {escape(message)}",
                                                        soft_wrap=True, highlight=False)
    raise typer.Exit(USER_ERROR_EXIT_CODE)


def fail_environment(err: Exception, recorded: bool = True) -> None:
    """A run stopped by environment failures (`EnvironmentFailure`): its message and exit 3
    (`recorded`: the failed calls are in the warehouse, as in training and evaluation)."""
    from rich.markup import escape

    from prompt_r1.core.failures import EXIT_CODE

    if _json_output():
        _print_json_error(str(err), EXIT_CODE, environment=getattr(err, "env_name", None))
    out = err_console if _json_output() else console
    out.print(f"[bold red]environment failure:[/] {escape(str(err))}", soft_wrap=True, highlight=False)
    if recorded:
        out.print("The failed calls are recorded in the warehouse (env_calls / eval_predictions .error); "
                  "nothing was scored from them and no agent was exported.", highlight=False)
    raise typer.Exit(EXIT_CODE)


def fail_processes(err: Exception) -> None:
    """A run stopped because its processes were killed from outside (`ProcessesDied`): its message and
    exit 3, no traceback."""
    from rich.markup import escape

    from prompt_r1.core.failures import EXIT_CODE

    if _json_output():
        _print_json_error(str(err), EXIT_CODE)
    out = err_console if _json_output() else console
    out.print(f"[bold red]processes died:[/] {escape(str(err))}", soft_wrap=True, highlight=False)
    raise typer.Exit(EXIT_CODE)


def _open_db(db: Optional[Path], read_only: bool = False, wait_s: Optional[float] = None):
    """The warehouse, or exit 2 with a message naming the file (and the process holding it)."""
    from warehouse.store import LOCK_WAIT_S, Warehouse, WarehouseError

    try:
        return Warehouse(db or default_db_path(), read_only=read_only,
                         wait_s=LOCK_WAIT_S if wait_s is None else wait_s)
    except WarehouseError as err:
        fail(str(err))


LockWaitOpt = typer.Option(None, "--lock-wait", min=0.0, help="Seconds to wait while another process holds "
                           "the warehouse before giving up (default 30).")


def load(config: Path, overrides: list[str] | None = None):
    try:
        return load_config(config, parse_overrides(overrides))
    except ConfigError as err:
        fail(str(err))


def _agent_folder(spec: Optional[str], cfg) -> Path | str:
    """The agent folder `spec` names (`prompt_r1.models.resolver`), or exit 2 saying which forms it takes."""
    from prompt_r1.models.resolver import AgentSpecError, resolve_agent

    try:
        return resolve_agent(spec, default_model=cfg.agent.model, cfg=cfg)
    except (AgentSpecError, FileNotFoundError) as err:
        fail(str(err))


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    setup_logging("DEBUG" if verbose else None)
    # SIGTERM (a process manager, `kill`) stops a command as Ctrl-C does: `finally` blocks and context
    # managers run, so managed servers and Ray actors stop, instead of Python dying at once
    # (`prompt_r1.core.signals`; `init_ray` hands SIGTERM back after Ray takes it over).
    install_sigterm_interrupt()  # main thread only: Python handles signals there only
