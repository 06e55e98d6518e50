"""A scratch home for benchmarks that train: runs, checkpoints, warehouse and server logs go to a
temporary `PROMPT_R1_HOME`, removed at the end (a few 3-step runs leave about 9 GB of checkpoints
and model copies), while built models stay in the user's cache (`runs/models`, or
`PROMPT_R1_MODELS`) so a benchmark does not build them again each time."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def scratch_home(prefix: str, keep: bool = False) -> Iterator[Path]:
    """Point `PROMPT_R1_HOME` at a new temporary folder for the block; `keep` leaves it (its path
    is printed) to inspect the runs."""
    from prompt_r1.models.bundled import models_dir

    os.environ.setdefault("PROMPT_R1_MODELS", str(models_dir()))  # resolved before the home moves
    home = Path(tempfile.mkdtemp(prefix=prefix))
    previous = os.environ.get("PROMPT_R1_HOME")
    os.environ["PROMPT_R1_HOME"] = str(home)
    try:
        yield home
    finally:
        if previous is None:
            os.environ.pop("PROMPT_R1_HOME", None)
        else:
            os.environ["PROMPT_R1_HOME"] = previous
        if keep:
            print(f"runs kept under {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
