"""A task's own scorer: a function named by import path, and the contract its answers must keep.

A dataset may bring its own answer scorer instead of the built-in metrics (EM, F1, substring,
SSim), and a task its own turn scorer (`core.turn_credit`). Both are named the same way and
resolved here, once (`load_callable`):

- `package.module:function`: an importable module (installed, or on `sys.path`);
- `path/to/file.py:function`: a Python file, e.g. `scorer.py` in a user's folder outside the
  package (a relative path is read from the working directory; ingestion stores it resolved).

An answer scorer is called as `scorer(prediction, golds, metadata)` with the stripped prediction,
the question's gold answers (a list of strings) and the row's metadata (a dict; empty when the
source had none). It returns a number in [0, 1], or a dict of named parts whose `score` entry is
that number (the primary) and whose other entries are finite numbers reported beside it.
`check_answer_score` holds it to that: anything else, or an exception, is a `ScorerError` naming
the scorer and the question. A scorer failure is never read as a 0: a score made of failures
would train and report something other than what the task defines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompt_r1.core.failures import UserError
from prompt_r1.core.scorer_deadline import call_with_deadline

PRIMARY = "score"  # the key of a dict result that holds the primary score
SPEC_PATTERN = r"^(?:[A-Za-z_][\w.]*|[^:\s][^:]*\.py):[A-Za-z_]\w*$"


class ScorerError(UserError, ValueError):
    """A scorer that cannot be loaded, or that fails or answers out of contract for a question."""


def load_callable(spec: str, setting: str, error: type[ScorerError] = ScorerError) -> Callable[..., Any]:
    """The function `spec` names (`package.module:function` or `path/to/file.py:function`), or an
    `error` naming `setting` and what to write instead.

    >>> load_callable("prompt_r1.core.metrics:f1_score", "data.sources[0].scorer").__name__
    'f1_score'
    >>> load_callable("prompt_r1.core.metrics", "s")
    Traceback (most recent call last):
    ...
    prompt_r1.core.scorer.ScorerError: s: 'prompt_r1.core.metrics' is not an import path; write `package.module:function` or `path/to/file.py:function`
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise error(f"{setting}: {spec!r} is not an import path; write `package.module:function` or "
                    "`path/to/file.py:function`")
    if module_name.endswith(".py"):
        module = _file_module(module_name, setting, error)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise error(f"{setting}: cannot import module `{module_name}` ({err}); name an importable "
                        "module as `package.module:function`") from err
        except SystemExit as err:
            raise error(_exits_on_import(setting, f"module `{module_name}`", err)) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise error(f"{setting}: module `{module_name}` has no function `{attr}`")
    return fn


def _file_module(path: str, setting: str, error: type[ScorerError]) -> Any:
    """Import a standalone `.py` file once per resolved path, under a name of its own (so two
    users' `scorer.py` never share one module); its folder goes on `sys.path` so the file may
    import its neighbours."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise error(f"{setting}: no file {resolved} (a relative path is read from the working directory "
                    f"{Path.cwd()})")
    name = f"_prompt_r1_user_{resolved.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise error(f"{setting}: cannot import {resolved} as a Python module")
    module = importlib.util.module_from_spec(spec)
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # argparse or sys.exit at import would end the whole command
        raise error(_exits_on_import(setting, str(resolved), err)) from None
    except Exception as err:  # the user's file: name it and what it raised
        raise error(f"{setting}: importing {resolved} raised {type(err).__name__}: {err}") from err
    sys.modules[name] = module
    return module


def _exits_on_import(setting: str, what: str, err: SystemExit) -> str:
    return (f"{setting}: importing {what} called sys.exit({err.code!r}): it parses command-line arguments or exits "
            "when imported; do that only under `if __name__ == \"__main__\":`")


def resolved_spec(spec: str) -> str:
    """`spec` with a file path made absolute (relative paths are read from the working directory),
    so the spec a warehouse stores means the same file from any process; `judge` (the judge named
    `judge`, `config.judge`) is stored as `judge:judge`.

    >>> resolved_spec("pkg.mod:fn"), resolved_spec("judge")
    ('pkg.mod:fn', 'judge:judge')
    >>> resolved_spec("/tmp/x/scorer.py:score")
    '/tmp/x/scorer.py:score'
    """
    if spec == "judge":
        return "judge:judge"
    module, sep, attr = spec.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{Path(module).expanduser().resolve()}:{attr}"
    return spec


@dataclass(frozen=True)
class AnswerScore:
    """A checked answer score: the primary in [0, 1], any named parts beside it, and a note (an LLM
    judge's verdict, `data.judge`) for whoever shows the score."""

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    note: str | None = field(default=None, compare=False, repr=False)


def check_answer_score(value: Any, where: str) -> AnswerScore:
    """A scorer's result held to its contract; a `ScorerError` naming `where` otherwise.

    >>> check_answer_score(1, "s"), check_answer_score({"score": 0.5, "fields": 2.0}, "s").parts
    (AnswerScore(score=1.0, parts={}), {'fields': 2.0})
    >>> check_answer_score(1.5, "scorer `f` for question 'q1'")
    Traceback (most recent call last):
    ...
    prompt_r1.core.scorer.ScorerError: scorer `f` for question 'q1' returned 1.5; return a number in [0, 1] (or a dict with a `score` entry in [0, 1])
    """
    contract = f"return a number in [0, 1] (or a dict with a `{PRIMARY}` entry in [0, 1])"
    parts: dict[str, float] = {}
    primary = value
    if isinstance(value, Mapping):
        if PRIMARY not in value:
            raise ScorerError(f"{where} returned a dict without a `{PRIMARY}` entry ({sorted(map(str, value))}); {contract}")
        primary = value[PRIMARY]
        for name, part in value.items():
            if name == PRIMARY:
                continue
            if not _finite(part):
                raise ScorerError(f"{where} returned part `{name}` = {part!r}; each part must be a finite number")
            parts[str(name)] = float(part)
    if not _finite(primary) or not 0.0 <= primary <= 1.0:
        raise ScorerError(f"{where} returned {primary!r}; {contract}")
    return AnswerScore(float(primary), parts)


def _finite(value: Any) -> bool:
    """A finite real number, of any numeric type (numpy's float32 and int64 included); never a boolean.

    >>> import numpy as np
    >>> [_finite(v) for v in (0.5, np.float32(0.43), np.int64(0), True, np.bool_(True), "1", float("nan"))]
    [True, True, True, False, False, False, False]
    """
    return is_real_number(value) and math.isfinite(value)


def is_real_number(value: Any) -> bool:
    """A real number that is not a boolean (`numbers.Real` takes numpy's scalars, and not `numpy.bool_`)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@functools.cache
def _background_loop() -> asyncio.AbstractEventLoop:
    """One event loop in a daemon thread, for async scorers called from code that may itself be
    running inside an event loop (evaluation is), where `asyncio.run` is refused."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="prompt-r1-scorers", daemon=True).start()
    return loop


def run_awaitable(value: Any) -> Any:
    """`value`, awaited on the background loop when it is awaitable (an `async def` scorer)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(wait(), _background_loop())
    return future.result()


class AnswerScorer:
    """A loaded answer scorer: `spec` names it in every error, `__call__` checks its contract."""

    def __init__(self, spec: str, fn: Callable[..., Any]):
        self.spec, self.fn = spec, fn

    def __call__(self, prediction: str, golds: Sequence[str], metadata: Mapping[str, Any] | None,
                 question_id: str) -> AnswerScore:
        """The checked score of one prediction; a blank prediction is 0 without a call, as with
        every built-in metric (there is no answer to judge)."""
        where = f"scorer `{self.spec}` for question {question_id!r}"
        if not prediction.strip():
            return AnswerScore(0.0)
        try:  # at most data.scorer_timeout_s, and never the end of the process (core.scorer_deadline)
            value = call_with_deadline(
                lambda: run_awaitable(self.fn(prediction.strip(), list(golds), dict(metadata or {}))), where, ScorerError)
        except ScorerError:
            raise
        except Exception as err:  # the task's own code: its failure stops the run, never a silent 0
            raise ScorerError(f"{where} raised {type(err).__name__}: {err}") from err
        return check_answer_score(value, where)


def load_answer_scorer(spec: str, setting: str = "scorer") -> AnswerScorer:
    """The `AnswerScorer` of an import-path spec (see `load_callable`)."""
    return AnswerScorer(spec, load_callable(spec, f"{setting} `{spec}`"))
