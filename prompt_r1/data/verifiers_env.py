"""verifiers environments as tasks (the optional `verifiers` extra): dataset in, rubric as scorer.

A verifiers environment (a pip package exposing `load_environment()`, as hundreds on the
Environments Hub are) is a dataset plus a rubric. `prompt-r1 ingest verifiers:<environment id>`
loads an installed one through verifiers' own loader (`vf.load_environment`, which imports the
module named like the id with `-` as `_`), ingests its `dataset` as the train split and its
`eval_dataset` as the test split, and records `verifiers:<id>` as the dataset's scorer: the rubric
then scores the agent's final answer (`RubricScorer`), inside the paper's format gate.

Only single-turn environments (`vf.SingleTurnEnv`) are tasks here: in a multi-turn environment
(tools, `env_response`) the episode is the environment's own loop, while prompt-r1's agent talks
to the environment LLM; such environments are refused with a message saying so. Rubrics with
group reward functions (plural arguments) are refused too: here each answer is scored alone.

The rubric's functions are called the way verifiers calls them (each gets the arguments its
parameter names ask for: `completion`, `answer`, `info`, `prompt`, `parser`, `state`...), but
a function that raises stops the run naming it and the question: verifiers' own `score_rollout`
would log the error and count a 0, which this project never does. The score is the weighted sum
of the reward functions (verifiers' reward), and each function's value is reported as a part.

The target is the v0 API, which verifiers 0.3 keeps under `verifiers.legacy` with its old
import paths aliased (verifiers 0.4 removed it); `scripts/setup.sh` pins the version.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from typing import Any

import pyarrow as pa

from prompt_r1.core.scorer import run_awaitable
from prompt_r1.data.rows import SCORER_METRIC, Columns, IngestError, _not_empty, build_table

PREFIX = "verifiers:"
FAMILY = "custom"
# verifiers' own bookkeeping rubrics (turn counts...), not the task's: left out of the score
_MONITOR_SUFFIX = "MonitorRubric"


class VerifiersError(IngestError):
    """A verifiers environment that cannot be loaded or used as a task; the message says why."""


def _verifiers() -> Any:
    try:
        import verifiers as vf

        vf.SingleTurnEnv  # noqa: B018  (loads the v0 surface; an incomplete install fails here)
    except (ImportError, AttributeError) as err:
        raise VerifiersError(f"the `verifiers` package is not usable here ({err}); install the extra: "
                             "`bash scripts/setup.sh` does, or `pip install 'prompt-r1[verifiers]'`") from None
    return vf


def dataset_name(env_id: str) -> str:
    """The warehouse dataset of an environment: its id, `-` and `/` as `_`.

    >>> dataset_name("owner/my-env@0.1")
    'my_env'
    """
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_")


@functools.cache
def load_env(env_id: str) -> Any:
    """The installed environment `env_id`, checked to be usable as a task (once per process)."""
    vf = _verifiers()
    try:
        env = vf.load_environment(env_id)
    except Exception as err:  # verifiers wraps import and load failures in several types
        raise VerifiersError(f"{PREFIX}{env_id}: cannot load the environment ({type(err).__name__}: {err}); install "
                             "its package (e.g. `prime env install`, or pip) into this environment") from None
    if not isinstance(env, vf.SingleTurnEnv):
        raise VerifiersError(
            f"{PREFIX}{env_id}: a {type(env).__name__} is a multi-turn environment whose episode is its own loop "
            "(tools or environment responses); here the agent's other party is the environment LLM, so only "
            "single-turn environments (vf.SingleTurnEnv: a dataset and a rubric) can be tasks")
    funcs = rubric_functions(env)
    if not funcs:
        raise VerifiersError(f"{PREFIX}{env_id}: its rubric has no reward function to score answers with")
    for _, func, _ in funcs:
        if _is_group(func):
            raise VerifiersError(f"{PREFIX}{env_id}: reward function `{_name(func)}` scores a group of rollouts "
                                 "(plural arguments); prompt-r1 scores each answer alone, so group rubrics are refused")
    return env


def rubric_functions(env: Any) -> list[tuple[Any, Any, float]]:
    """(rubric, function, weight) of every reward function of the environment's rubric (a
    `RubricGroup` flattened), verifiers' monitor rubrics left out."""
    out = []
    stack = [env.rubric]
    while stack:
        rubric = stack.pop(0)
        if hasattr(rubric, "rubrics"):
            stack[:0] = list(rubric.rubrics)
            continue
        if type(rubric).__name__.endswith(_MONITOR_SUFFIX):
            continue
        out += [(rubric, f, float(w)) for f, w in zip(rubric.funcs, rubric.weights)]
    return out


def _name(func: Any) -> str:
    return getattr(func, "__name__", repr(func))


def _is_group(func: Any) -> bool:
    params = set(inspect.signature(func).parameters)
    return bool(params & {"states", "prompts", "completions", "answers", "tasks", "infos"})


def _question_text(row: dict[str, Any]) -> str | None:
    """The question of a row: the last user message of `prompt` (the env's system prompt is its
    own instruction, not the question), else its `question` column."""
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return row.get("question")


def read_verifiers(env_id: str, max_question_chars: int) -> list[tuple[str, str, pa.Table]]:
    """(source label, content hash, questions) per split of the environment: `dataset` -> train,
    `eval_dataset` -> test."""
    import verifiers

    env = load_env(env_id)
    name = dataset_name(env_id)
    out = []
    for split, ds in (("train", getattr(env, "dataset", None)), ("test", getattr(env, "eval_dataset", None))):
        if ds is None:
            continue
        label = f"{PREFIX}{env_id}:{split}"
        rows = ds.to_list()
        where = lambda i, label=label: f"{label} row {i}"  # noqa: E731
        for i, row in enumerate(rows):
            if not isinstance(_question_text(row), str):
                raise VerifiersError(f"{where(i)} field prompt: no user message with text (and no `question`)")
        answers = [row.get("answer") for row in rows]
        cols = Columns(
            [_question_text(row) for row in rows], [[a] if isinstance(a, str) and a.strip() else [] for a in answers],
            name, split, FAMILY, SCORER_METRIC,
            [str(row["example_id"]) for row in rows] if all("example_id" in r for r in rows) else None,
            label, "answer",
            metadata=[{"answer": a, "info": row.get("info") or {}} for a, row in zip(answers, rows)],
            scorer=f"{PREFIX}{env_id}", golds_optional=True)
        fingerprint = getattr(ds, "_fingerprint", None) or hashlib.sha256(
            json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
        mapping = json.dumps([verifiers.__version__, env_id, split, name])
        content_hash = hashlib.sha256(f"{fingerprint}{mapping}".encode()).hexdigest()
        out.append((label, content_hash, build_table(_not_empty(cols, label), where, max_question_chars)))
    if not out:
        raise VerifiersError(f"{PREFIX}{env_id}: the environment has neither a `dataset` nor an `eval_dataset`")
    return out


def weighted_score(values: list[float], weights: list[float]) -> float:
    """The rubric's weighted sum, mapped onto [0, 1] when its weights reach outside it.

    verifiers' own examples weigh a right answer 1.0 and a format check 0.2, so a right answer
    scores 1.2, and a negative weight (a penalty) can make a total below 0; a score in prompt-r1 is
    in [0, 1]. With every function in [0, 1] the reachable totals run from the sum of the negative
    weights to the sum of the positive ones, and that range is mapped onto [0, 1] (the order of
    answers is kept). A rubric whose weights already keep it inside [0, 1] scores its plain sum.

    >>> weighted_score([1.0, 1.0], [1.0, 0.2]), weighted_score([1.0, 0.0], [0.75, 0.25])
    (1.0, 0.75)
    >>> round(weighted_score([1.0, 0.0], [1.0, 0.2]), 4), weighted_score([0.0, 1.0], [1.0, -0.5])
    (0.8333, 0.0)
    """
    total = sum(w * v for w, v in zip(weights, values, strict=True))
    low = sum(w for w in weights if w < 0)
    high = sum(w for w in weights if w > 0)
    if (low >= 0 and high <= 1) or high == low:
        return total
    return (total - low) / (high - low)


class RubricScorer:
    """An environment's rubric as a dataset scorer: `scorer(prediction, golds, metadata)` ->
    {"score": weighted sum of the reward functions, <function name>: value, ...}."""

    def __init__(self, env_id: str):
        self.env_id = env_id
        self.functions = rubric_functions(load_env(env_id))

    def __call__(self, prediction: str, golds: list[str], metadata: dict[str, Any]) -> dict[str, float]:
        answer = metadata.get("answer", golds[0] if golds else "")
        state: dict[str, Any] = {
            "prompt": [], "completion": [{"role": "assistant", "content": prediction}],
            "answer": answer if answer is not None else "", "info": metadata.get("info") or {},
        }
        parts: dict[str, float] = {}
        values: list[float] = []
        for rubric, func, weight in self.functions:
            objects = rubric.score_objects(state)
            params = inspect.signature(func).parameters
            takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
            kwargs = objects if takes_all else {k: v for k, v in objects.items() if k in params}
            try:
                value = float(run_awaitable(func(**kwargs)))
            except Exception as err:
                raise RuntimeError(f"rubric function `{_name(func)}` raised {type(err).__name__}: {err}") from err
            parts[_name(func)] = value
            values.append(value)
        return {"score": weighted_score(values, [weight for _, _, weight in self.functions]), **parts}
