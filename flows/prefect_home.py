"""Make Prefect's home usable before Prefect is imported, and keep its server quiet offline.

Prefect creates `PREFECT_HOME` itself only one level deep: with `PREFECT_HOME=/tmp/a/b` and no
`/tmp/a`, it warns, and its ephemeral API server then dies at start-up on "unable to open
database file" (a traceback per retry, then a timeout minutes later). Its server also sends
telemetry, which on a machine without internet (or a fresh home's SQLite still being created)
prints an ERROR that has nothing to do with the run. Both are settled here, from
`flows/__init__.py`, because Prefect reads its settings once, when first imported.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# Prefect's default when PREFECT_HOME is unset (prefect.settings.models.root.Settings.home)
DEFAULT_HOME = "~/.prefect"

_problem: str | None = None


def prepare_prefect_home(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Create the Prefect home (parents too) and turn server telemetry off unless the user set it.

    Returns None when the home is a usable folder, else a message that says what is wrong and
    what to do (the commands print it and stop; a library user meets Prefect's own error).

    >>> import tempfile
    >>> env = {"PREFECT_HOME": tempfile.mkdtemp() + "/a/b"}
    >>> prepare_prefect_home(env) is None, Path(env["PREFECT_HOME"]).is_dir()
    (True, True)
    >>> env["PREFECT_SERVER_ANALYTICS_ENABLED"]
    'false'
    """
    global _problem
    own = environ is None  # only the process's own home is what the commands check (`prefect_home_problem`)
    environ = os.environ if environ is None else environ
    environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    problem = _home_problem(environ.get("PREFECT_HOME") or DEFAULT_HOME)
    if own:
        _problem = problem
    return problem


def _home_problem(raw: str) -> str | None:
    """`raw` (PREFECT_HOME as set) made a folder, parents too; None when it is a usable one, else why not."""
    home = Path(raw).expanduser()
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        return (f"PREFECT_HOME={raw} is a file, not a folder: Prefect keeps its database there. "
                "Set PREFECT_HOME to a folder (it is created if missing), or move the file")
    except OSError as err:
        return (f"PREFECT_HOME={raw} cannot be created ({err.strerror or err}): Prefect keeps its "
                "database there. Set PREFECT_HOME to a folder you can write (it is created if missing)")
    if not os.access(home, os.W_OK | os.X_OK):
        return (f"PREFECT_HOME={raw} is not writable: Prefect keeps its database there. "
                "Set PREFECT_HOME to a folder you can write (it is created if missing)")
    return None


def prefect_home_problem() -> str | None:
    """What `prepare_prefect_home` found wrong when `flows` was imported (None: nothing)."""
    return _problem
