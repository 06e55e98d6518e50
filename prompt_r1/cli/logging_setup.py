"""One logging set-up for the CLI and scripts: rich handler on stderr, quiet third-party loggers.

Logs go to stderr, so a command's stdout holds only its output (`ask --json`: only JSON)."""

from __future__ import annotations

import logging
import os


def setup_logging(level: str | int | None = None) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    level = level or os.environ.get("PROMPT_R1_LOG", "INFO")
    logging.basicConfig(level=level, format="%(message)s", datefmt="[%X]",
                        handlers=[RichHandler(console=Console(stderr=True, emoji=False), rich_tracebacks=False,
                                              show_path=False, markup=False)], force=True)
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "urllib3", "filelock", "datasets", "transformers", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
