"""Which code a scorer is: a short hash of the source file its import path names.

A dataset's scorer and a task's turn scorer are named in the config by import path only, so the
spec stays the same when the code behind it is rewritten; a resumed run would then train its later
steps on another reward than its first, and an evaluation's rows would not say which scorer made
them. The fingerprint is what changes with the code: recorded in `run.json` (a resume compares it,
`training.run_folder.open_run`) and in a mapped source's content hash (so a rewritten scorer is a
new version of the source in the warehouse and in the data hashes MLflow records).

The file named is hashed without importing it (ingest reads it for every source); a module's
other files are not followed, so a scorer that delegates to a helper module changes its
fingerprint only when its own file changes.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path


def source_file(spec: str) -> Path | None:
    """The file of a `path/to/file.py:function` or `package.module:function` spec, or None when it
    cannot be found without running code (a module that is not installed: loading it says why).

    >>> source_file("prompt_r1.core.scorer_code:source_file").name
    'scorer_code.py'
    >>> source_file("no_such_module_here:f") is None
    True
    """
    module, _, _ = spec.rpartition(":")
    if module.endswith(".py"):
        path = Path(module).expanduser().resolve()
        return path if path.is_file() else None
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    return Path(origin) if origin and Path(origin).is_file() else None


def files_fingerprint(files: list[Path]) -> str:
    """A short hash of the files' contents (in the order given)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def code_fingerprint(spec: str) -> str | None:
    """A short hash of the source file `spec` names (None when there is none to read).

    >>> code_fingerprint("prompt_r1.core.scorer_code:code_fingerprint") == code_fingerprint(
    ...     "prompt_r1.core.scorer_code:source_file")
    True
    """
    path = source_file(spec)
    return files_fingerprint([path]) if path is not None else None
