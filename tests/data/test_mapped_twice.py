"""One file mapped by several `data.sources` entries (issue 62 item 12): each entry is its own source,
so no ingest removes another entry's questions; two entries mapping one file to one dataset are
refused when the config loads."""

from __future__ import annotations

import json
import random

import pytest

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import parse_config
from prompt_r1.data.ingest import _store, ingest, mapped_label
from prompt_r1.data.mapped import read_mapped, source_path


def _file(path, n: int) -> str:
    path.write_text("".join(json.dumps({"q": f"capital {i}?", "a": f"c{i}", "strict": f"C{i}"}) + "\n"
                            for i in range(n)))
    return str(path)


def _entry(path: str, dataset: str, answers: str = "a") -> dict:
    return {"path": path, "dataset": dataset, "split": "train", "columns": {"question": "q", "answers": answers}}


@pytest.mark.parametrize("seed", range(4))
def test_entries_that_share_a_file_keep_each_others_questions(warehouse, tmp_path, seed) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    path = _file(tmp_path / "caps.jsonl", n)
    names = [f"caps{i}" for i in range(rng.randint(2, 4))]
    cfg = parse_config({"data": {"sources": [_entry(path, d, rng.choice(["a", "strict"])) for d in names]}})
    for round_ in range(3):
        reports = ingest(warehouse, cfg.data.sources)
        assert all(r.removed == 0 for r in reports), [r.describe() for r in reports]
        assert all(r.skipped for r in reports) == (round_ > 0)
        counts = {d: len(warehouse.questions(datasets=[d])) for d in names}
        assert counts == dict.fromkeys(names, n)
    n2 = n + rng.randint(1, 3)  # the file grows: every entry gets the new rows, none loses any
    _file(tmp_path / "caps.jsonl", n2)
    reports = ingest(warehouse, cfg.data.sources)
    assert [r.inserted for r in reports] == [n2 - n] * len(names) and all(r.removed == 0 for r in reports)


def test_a_mapping_stored_under_its_path_alone_is_adopted_not_removed(warehouse, tmp_path) -> None:
    """A warehouse of the earlier version keyed a mapped source by its path: its questions move to the
    new key in place (same ids), and the trajectories that refer to them keep them."""
    path = _file(tmp_path / "caps.jsonl", 4)
    cfg = parse_config({"data": {"sources": [_entry(path, "caps")]}})
    source = cfg.data.sources[0]
    _store(warehouse, str(source_path(source)), "old-hash", read_mapped(source, "data.sources[0]", 20_000))
    ids = {q.question_id for q in warehouse.questions()}
    _file(tmp_path / "caps.jsonl", 5)  # then edited: a new version, keyed by path and dataset
    (report,) = ingest(warehouse, cfg.data.sources)
    assert (report.inserted, report.removed) == (1, 0)
    stored = warehouse.questions()
    assert ids < {q.question_id for q in stored}
    assert {q.source_file for q in stored} == {mapped_label(source_path(source), "caps")}
    assert warehouse.query("SELECT source_file FROM sources") == [(mapped_label(source_path(source), "caps"),)]


@pytest.mark.parametrize("same", ["explicit", "stem", "relative"])
def test_two_entries_mapping_one_file_to_one_dataset_are_refused(tmp_path, monkeypatch, same) -> None:
    path = _file(tmp_path / "caps.jsonl", 2)
    monkeypatch.chdir(tmp_path)
    first = _entry(path, "caps")
    second = {"explicit": _entry(path, "caps", "strict"), "stem": {**_entry(path, "x"), "dataset": None},
              "relative": _entry("./caps.jsonl", "caps")}[same]
    with pytest.raises(ConfigError, match=r"data.sources\[1\] maps .*caps.jsonl to dataset `caps`, as data.sources\[0\]"):
        parse_config({"data": {"sources": [first, second]}})
