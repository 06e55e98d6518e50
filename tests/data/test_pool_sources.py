"""A run's pool holds the questions of its own `data.sources` only, whatever else a shared
warehouse holds (issue 62 item 1), and every command reads the sources as they are now (item 2)."""

from __future__ import annotations

import json
import random

import pytest

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import parse_config
from prompt_r1.data.ingest import ingest, source_datasets
from prompt_r1.data.pool import TrainingPool


def _jsonl(path, n: int, prefix: str, split: str | None = None) -> str:
    rows = [{"q": f"{prefix} question {i}?", "a": f"{prefix}{i}", **({"split": split} if split else {})}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _mapping(path: str, dataset: str, **extra) -> dict:
    return {"path": path, "dataset": dataset, "split": "train", "columns": {"question": "q", "answers": "a"}, **extra}


def _plain(folder, name: str, n: int) -> str:
    """A file in the benchmark layout (`train/NAME.jsonl`, fields question/answers/task_family)."""
    (folder / "train").mkdir(parents=True)
    rows = [{"question": f"{name} plain {i}?", "answers": [f"p{i}"], "task_family": "standard_qa"} for i in range(n)]
    (folder / "train" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


@pytest.mark.parametrize("seed", range(4))
def test_the_pool_is_the_configs_own_datasets_in_a_shared_warehouse(warehouse, tmp_path, seed) -> None:
    rng = random.Random(seed)
    others = [f"other{i}" for i in range(rng.randint(1, 3))]
    for name in others:  # another config's questions, ingested earlier into the same warehouse
        ingest(warehouse, [parse_config({"data": {"sources": [_mapping(
            _jsonl(tmp_path / f"{name}.jsonl", rng.randint(2, 30), name), name)]}}).data.sources[0]])
    mine = [_mapping(_jsonl(tmp_path / "mine.jsonl", rng.randint(3, 9), "mine"), "mine")]
    if rng.random() < 0.5:  # a plain folder beside the mapping
        mine.append(_plain(tmp_path / "plainsrc", "plainds", rng.randint(2, 6)))
    cfg = parse_config({"data": {"sources": mine, "validation_fraction": 0.25}})
    ingest(warehouse, cfg.data.sources)
    expected = {"mine"} | ({"plainds"} if len(mine) > 1 else set())
    assert set(source_datasets(warehouse, cfg.data.sources)) == expected
    pool = TrainingPool.load(warehouse, cfg)
    assert {q.dataset for q in pool.train + pool.validation} == expected
    named = parse_config({"data": {"sources": mine, "train_datasets": [others[0]]}})  # an explicit choice wins
    assert {q.dataset for q in TrainingPool.load(warehouse, named).train} == {others[0]}


def test_sources_without_a_train_split_name_the_setting(warehouse, tmp_path) -> None:
    cfg = parse_config({"data": {"sources": [_mapping(_jsonl(tmp_path / "t.jsonl", 3, "t"), "t", split="test")]}})
    ingest(warehouse, [parse_config({"data": {"sources": [_mapping(_jsonl(tmp_path / "o.jsonl", 3, "o"), "o")]}})
                       .data.sources[0]])
    ingest(warehouse, cfg.data.sources)
    with pytest.raises(ConfigError, match=r"the datasets of data.sources \(t;.*data.train_datasets"):
        TrainingPool.load(warehouse, cfg)


@pytest.mark.parametrize("change", ["scorer", "file", "new source"])
def test_evaluate_and_rollout_ingest_the_sources_as_they_are_now(warehouse, tmp_path, monkeypatch, change) -> None:
    """`_ingest_sources` (evaluate's, and the rule rollout follows) reads the config's sources even into a
    warehouse that holds questions already: an edited file, a changed scorer, a new mapping all land."""
    from prompt_r1.api import _ingest_sources

    path = _jsonl(tmp_path / "own.jsonl", 4, "own")
    first = parse_config({"data": {"sources": [_mapping(path, "own", scorer="prompt_r1.core.metrics:f1_score")]}})
    _ingest_sources(warehouse, first)
    if change == "scorer":
        entry = _mapping(path, "own", scorer="prompt_r1.core.metrics:exact_match")
        second, expect = parse_config({"data": {"sources": [entry]}}), {"own"}
    elif change == "file":
        _jsonl(tmp_path / "own.jsonl", 6, "own")
        second, expect = first, {"own"}
    else:
        extra = _mapping(_jsonl(tmp_path / "new.jsonl", 2, "new"), "new")
        second, expect = parse_config({"data": {"sources": [first.data.sources[0], extra]}}), {"own", "new"}
    _ingest_sources(warehouse, second)
    got = warehouse.questions()
    assert {q.dataset for q in got} == expect
    if change == "scorer":
        assert {q.scorer for q in got} == {"prompt_r1.core.metrics:exact_match"}
    if change == "file":
        assert len(got) == 6
