"""A Hugging Face dataset as a `data.sources` entry (`path: hf:NAME`), the same in a config as in
`prompt-r1 ingest hf:NAME`.

Hub datasets rarely have the flat `question` / `answers` columns the benchmark files have: SQuAD's
gold answers sit in a struct (`answers.text`), GSM8K needs its configuration (`main`), and a
dataset's `train` split must be filed as training questions, not test ones. So an `hf:` entry is a
`DataSource` like a user's own file (`prompt_r1.data.mapped`): `config` and `hf_split` pick what to
load, `columns` map it (a dotted path walks into struct columns, and into each element of a list of
structs), `split` files it (default: `train` for the `train` split, `test` for any other), `scorer`
scores it. `NAME` is a hub id or a local folder written by `datasets`' `save_to_disk` (or any
folder `load_dataset` reads), so the same entry works offline.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from prompt_r1.config.sampling import HF_PREFIX, DataSource
from prompt_r1.core.scorer import resolved_spec
from prompt_r1.data.rows import DEFAULT_METRIC, INGEST_FORMAT, SCORER_METRIC, Columns, IngestError, _not_empty, build_table

DEFAULT_HF_SPLIT = "train"


def hf_name(source: DataSource) -> str:
    return source.path[len(HF_PREFIX):]


def _load(name: str, config: str | None, hf_split: str, setting: str):
    """The `hf_split` split of dataset `name`: a `save_to_disk` folder through `load_from_disk`,
    anything else through `load_dataset` (the hub, or a data folder)."""
    import datasets

    folder = Path(name).expanduser()
    try:
        if folder.is_dir() and any((folder / f).is_file() for f in ("dataset_dict.json", "state.json")):
            loaded = datasets.load_from_disk(str(folder))
            if isinstance(loaded, datasets.DatasetDict):
                if hf_split not in loaded:
                    raise IngestError(f"{setting}.hf_split: {HF_PREFIX}{name} has no split {hf_split!r} "
                                      f"(its splits: {', '.join(loaded)})")
                return loaded[hf_split]
            return loaded
        return datasets.load_dataset(name, config, split=hf_split)
    except IngestError:
        raise
    except Exception as err:  # datasets raises many types; name the source and the keys either way
        raise IngestError(f"{setting}: cannot load {HF_PREFIX}{name} (config {config!r}, split {hf_split!r}): "
                          f"{type(err).__name__}: {err}") from None


def _walk(value: Any, parts: list[str]) -> Any:
    """`value` at dotted path `parts`: into a dict by key, into each element of a list.

    >>> _walk({"text": ["Paris"], "answer_start": [3]}, ["text"])
    ['Paris']
    >>> _walk([{"text": "a"}, {"text": "b"}], ["text"]), _walk(None, ["text"])
    (['a', 'b'], None)
    """
    for part in parts:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list):
            value = [v.get(part) if isinstance(v, dict) else None for v in value]
        else:
            return None
    return value


def _column(ds, dotted: str, key: str, name: str, setting: str) -> list:
    top, *rest = dotted.split(".")
    if top not in ds.column_names:
        raise IngestError(f"{HF_PREFIX}{name} column `{dotted}`: no column `{top}` (its columns: "
                          f"{', '.join(ds.column_names)}); fix {setting}.columns.{key}")
    values = ds.select_columns([top]).with_format("arrow")[:].column(top).to_pylist()
    if rest and values and all(not isinstance(v, (dict, list)) for v in values if v is not None):
        raise IngestError(f"{HF_PREFIX}{name} column `{dotted}`: `{top}` is not a struct column; "
                          f"fix {setting}.columns.{key}")
    return [_walk(v, rest) for v in values] if rest else values


def default_split(hf_split: str) -> str:
    """The split a loaded split's questions are filed under when `split` is unset.

    >>> default_split("train"), default_split("validation"), default_split("test")
    ('train', 'test', 'test')
    """
    return "train" if hf_split == "train" else "test"


def read_hf_source(source: DataSource, setting: str, max_question_chars: int) -> tuple[str, str, pa.Table]:
    """(source label, content hash, checked question table) of an `hf:` entry; the hash covers the
    dataset's fingerprint and the mapping, so an unchanged dataset with an unchanged entry is a no-op."""
    name = hf_name(source)
    hf_split = source.hf_split or DEFAULT_HF_SPLIT
    ds = _load(name, source.config, hf_split, setting)
    cols = source.columns
    needed = {"question": cols.question, "answers": cols.answers}
    needed |= {key: value for key, value in (("id", cols.id), ("split", cols.split)) if value}
    needed |= {f"metadata[{i}]": value for i, value in enumerate(cols.metadata)}
    values = {dotted: _column(ds, dotted, key, name, setting) for key, dotted in needed.items()}
    where = lambda i: f"{HF_PREFIX}{name} ({hf_split}) row {i}"  # noqa: E731
    questions = values[cols.question]
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise IngestError(f"{where(i)} column `{cols.question}`: empty or missing question text; "
                              f"fix {setting}.columns.question or the dataset")
    split = source.split or default_split(hf_split)
    splits = [s if s is not None else split for s in values[cols.split]] if cols.split else split
    answers = values[cols.answers]
    if source.answers_separator:
        answers = [[p.strip() for p in a.split(source.answers_separator)] if isinstance(a, str) else a for a in answers]
    ids = values[cols.id] if cols.id else None
    metadata = ([{dotted: values[dotted][i] for dotted in cols.metadata} for i in range(len(questions))]
                if cols.metadata else None)
    scorer = resolved_spec(source.scorer) if source.scorer else None
    dataset = source.dataset or re.sub(r"[^A-Za-z0-9._-]", "_", Path(name.rstrip("/")).name).lstrip("._-") or "hf"
    label = f"{HF_PREFIX}{name}:{source.config or ''}:{hf_split}"
    table_cols = Columns(
        questions, answers, dataset, splits, source.task_family,
        SCORER_METRIC if scorer else (source.primary_metric or DEFAULT_METRIC.get(source.task_family, "f1")),
        None if ids is None else [None if v is None else str(v) for v in ids], label, f"`{cols.answers}`",
        metadata=metadata, scorer=scorer)
    mapping = source.model_dump(mode="json")
    if scorer:
        mapping["scorer"] = scorer
    fingerprint = getattr(ds, "_fingerprint", "") or ""
    content_hash = hashlib.sha256(f"{INGEST_FORMAT}{fingerprint}{json.dumps(mapping, sort_keys=True)}".encode()).hexdigest()
    return label, content_hash, build_table(_not_empty(table_cols, label), where, max_question_chars)
