"""`prompt-r1` commands that use a trained agent: `ask`, `serve`, `export`.

They sit on the same typer `app` as the data / train / evaluate commands of `prompt_r1.cli`
(which imports this module, so every entry point lists them); an agent is named by one spec,
resolved by `prompt_r1.models.resolver` (`_agent_folder`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from prompt_r1.cli.common import (
    ConfigOpt, SetOpt, _agent_folder, fail, fail_environment, load, app, console, err_console,
)
from prompt_r1.config.run_home import logs_dir

AgentSpecOpt = typer.Option(None, "--agent", help="Agent: a bundled model name, a folder, a training run id, or "
                             "models:/NAME@champion (default: this config's champion, models:/prompt-r1-<config name>@champion or "
                             "tracking.registered_model's, when there is one, else the config's agent.model).")


def escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@app.command("export")
def export(
    checkpoint: Path = typer.Argument(..., help="Checkpoint folder (runs/.../checkpoints/step-N)."),
    out_dir: Path = typer.Argument(..., help="Folder for the plain HF model: new or empty, or an earlier export (with --overwrite)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT_DIR when it holds an earlier export. "
                                   "A non-empty folder that is not an export is always refused, never emptied."),
    adapter_only: bool = typer.Option(False, "--adapter-only", help="Keep a LoRA checkpoint's adapter alone (a few "
                                      "MiB) with its training config and its base named portably; `--agent` merges "
                                      "it into that base on any machine."),
    rank: Optional[int] = typer.Option(None, "--rank", min=1, help="With --adapter-only, for an agent trained with "
                                       "full weights (an exported agent folder): keep each linear layer's change "
                                       "from the base it was trained from, cut to this rank, as a LoRA adapter "
                                       "(an approximation: measure it as an agent of its own)."),
) -> None:
    """Export a checkpoint as a plain HF model folder (LoRA merged, tokenizer included), or its LoRA
    adapter alone (--adapter-only; --rank R extracts one from a full-weight agent).

    The export is built beside OUT_DIR and renamed into place, and carries a small marker file
    (.prompt-r1-export.json) so that a later export may replace it; nothing else is ever deleted.
    """
    from prompt_r1.models.export import export_checkpoint
    from prompt_r1.models.adapter import export_adapter

    if rank is not None:
        from prompt_r1.models.adapter_extract import extract_adapter

        if not adapter_only:
            fail("--rank extracts an adapter: pass it with --adapter-only")
        try:
            kept = extract_adapter(checkpoint, out_dir, rank)
        except (FileNotFoundError, FileExistsError, ValueError, OSError) as err:
            fail(f"cannot extract an adapter from {checkpoint}: {err}")
        console.print(f"extracted a rank-{rank} adapter of {checkpoint} (base {kept['base']}) -> {out_dir}: it keeps "
                      f"{kept['kept_share']:.1%} of the {kept['modules']} linear layers' change; "
                      f"{kept['left_out_share']:.1%} of the whole change (embeddings, norms) is left out")
        return
    try:
        folder = (export_adapter if adapter_only else export_checkpoint)(checkpoint, out_dir, overwrite=overwrite)
    except (FileNotFoundError, FileExistsError, ValueError, OSError) as err:
        fail(f"cannot export {checkpoint}: {err}")
    console.print(f"exported {checkpoint} -> {folder}")


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question for the agent."),
    config: Path = ConfigOpt,
    agent: Optional[str] = AgentSpecOpt,
    env: Optional[str] = typer.Option(None, "--env", help="Environment name from the config: a `train.environments` "
                                      "member, `environment` or an `eval.environments` entry (default: the training "
                                      "environment, the first of a pool)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole episode as JSON (turns, token ids, "
                                 "environment calls, tokens, cost) instead of the turns as they happen. Stdout "
                                 "holds only that JSON; a failure is a JSON object with `error` and `exit_code`."),
    trace: bool = typer.Option(False, "--trace", help="Log the episode as an MLflow trace in the config's "
                               "experiment (runs/mlflow.db)."),
    set_: list[str] = SetOpt,
) -> None:
    """Ask a trained agent one question: it prompts the environment LLM, then answers.

    Exit 2 for bad input (a question that is empty, not UTF-8 or longer than data.max_question_chars; config,
    agent, environment name), 3 when an environment call failed
    (the episode is still printed, with its `error`)."""
    from prompt_r1 import api
    from prompt_r1.core.failures import EnvironmentFailure
    from prompt_r1.serving.service import check_question, pick_environment

    cfg = load(config, set_)
    check_question(question, cfg.data.max_question_chars)  # before the agent and the environment are loaded
    try:
        env_cfg = pick_environment(cfg, env)
    except KeyError as err:
        fail(f"{config}: {err.args[0]}")
    folder = _agent_folder(agent, cfg)
    if not as_json:
        console.print(f"agent {folder}; environment {env_cfg.name} ({env_cfg.model})", highlight=False)

    def show(kind: str, text: str) -> None:
        label = "[bold cyan]agent ->[/]" if kind == "interaction" else f"[bold green]{env_cfg.name} ->[/]"
        console.print(f"{label} {escape_markup(text.strip() or '(empty)')}", soft_wrap=True, highlight=False)

    reply = api.Agent(folder, cfg).ask(question, env_cfg.name, on_event=None if as_json else show)
    if trace:
        from prompt_r1.serving.observers import report_episode

        report_episode("ask", cfg, env_cfg, question, reply.trajectory)
    failure = (EnvironmentFailure(f"environment {env_cfg.name!r} failed: {reply.error}", env_cfg.name,
                                  reply.error, 1.0) if reply.error else None)
    _print_reply(reply, failure, as_json)
    if failure is not None:
        fail_environment(failure, recorded=False)


def _print_reply(reply, failure, as_json: bool) -> None:
    """The episode on stdout: as the one JSON object (`--json`; a failure adds `exit_code` and exits
    with it here), or the answer and a line of counts, tokens and cost."""
    from prompt_r1.core.failures import EXIT_CODE

    report = reply.report(tokens=True)
    if as_json:  # the episode, failed or not, is the one JSON object on stdout
        if failure is not None:
            report["exit_code"] = EXIT_CODE
        print(json.dumps(report, indent=2), flush=True)
        if failure is not None:
            err_console.print(f"[bold red]environment failure:[/] {escape_markup(str(failure))}",
                              soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_CODE)
        return
    usage = report["usage"]
    traj = reply.trajectory
    console.print(f"[bold]answer:[/] {escape_markup(reply.answer)}", soft_wrap=True, highlight=False)
    console.print(f"{len(traj.agent_turns)} agent turns, {len(traj.env_calls)} environment calls, stop "
                  f"{traj.stop_reason}; tokens: agent {usage['agent_prompt_tokens']}+"
                  f"{usage['agent_completion_tokens']}, environment {usage['env_prompt_tokens']}+"
                  f"{usage['env_completion_tokens']}; cost ${report['cost_usd']:.6f}", highlight=False)


@app.command()
def serve(
    config: Path = ConfigOpt,
    agent: Optional[str] = AgentSpecOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    max_concurrent: int = typer.Option(64, "--max-concurrent", min=1, help="Episodes running at once."),
    trace: bool = typer.Option(False, "--trace", help="Log each request's episode as an MLflow trace in the "
                               "config's experiment (runs/mlflow.db)."),
    set_: list[str] = SetOpt,
) -> None:
    """Serve the agent as an OpenAI-compatible API: one model `prompt-r1:<env>` per environment."""
    from prompt_r1.serving.service import config_environments
    from prompt_r1.serving.http import ServeConfig, serve_agent

    cfg = load(config, set_)
    folder = _agent_folder(agent, cfg)
    models = ", ".join(f"prompt-r1:{name}" for name in config_environments(cfg))
    console.print(f"agent {folder}; models {models}; http://{host}:{port}/v1 (Ctrl-C stops)", highlight=False)
    try:
        # the question limit is the config's data.max_question_chars, as for ingested questions
        limits = ServeConfig(max_concurrent=max_concurrent, max_question_chars=cfg.data.max_question_chars,
                             trace=trace)
        serve_agent(cfg, folder, host, port, limits, log_dir=logs_dir())
    except KeyboardInterrupt:
        pass
