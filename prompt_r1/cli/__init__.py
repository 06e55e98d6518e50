"""`prompt-r1` command line: thin typer commands over the library (no logic of its own).

Every command takes `--config FILE` where it needs settings; errors in user input end with a
one-paragraph message naming the file, row or key, and exit code 2. A run stopped because too
many environment calls failed ends with exit code 3 and a message naming the environment and
its first error.

Owns: `common` (the app, shared options, failure exits), `stages` (ingest, train, evaluate,
rollout, serve-env), `use` (ask, serve, export), `logging_setup`; `__main__` runs them as `python -m prompt_r1.cli`. The orchestrated commands
(`pipeline`, `run-flow`, `rerun`) are added by `flows.cli`.

Two hooks the commands rely on are installed by `flows.cli` when it is imported (the `prompt-r1`
entry point): `models.resolver.register_scheme("models", ...)`, which resolves an `--agent
models:/NAME@alias` spec (and the champion the commands take without `--agent`) from the MLflow
registry, and `serving.observers.observe_episodes(...)`, which logs the episode of `ask --trace` /
`serve --trace` as an MLflow trace. Under `python -m prompt_r1.cli` alone a `models:/` spec is
refused and `--trace` logs nothing.

Imports: every other subpackage of `prompt_r1` and `prompt_r1.api` (it is the top of the
library), never `tasks/`, `flows/`, Prefect or MLflow.
"""

from __future__ import annotations

from prompt_r1.cli import stages, use  # noqa: F401  (each registers its commands on `app`)
from prompt_r1.cli.common import app


def main() -> None:
    """Entry point of the library's commands alone (`python -m prompt_r1.cli`)."""
    app()
