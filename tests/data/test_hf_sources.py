"""`hf:` entries of a config's `data.sources` (and of `prompt-r1 ingest`), against real local datasets.

No hub here: the datasets are made with `datasets` and written with `save_to_disk`, one shaped like
SQuAD (gold answers inside a struct column, `answers.text`; train and validation splits), one flat.
Checked: the struct column through a dotted path, the split a loaded split is filed under, a
re-ingest that is a no-op, errors that name the config key, and the CLI taking the same entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prompt_r1.config.experiment import ConfigError, load_config
from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import IngestError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def squad_like(tmp_path_factory) -> Path:
    import datasets

    def split(prefix: str, n: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict({
            "id": [f"{prefix}{i}" for i in range(n)],
            "question": [f"{prefix} question {i}: what is the capital of country {i}?" for i in range(n)],
            "context": ["..."] * n,
            "answers": [{"text": [f"City {i}", f"city{i}"], "answer_start": [0, 0]} for i in range(n)],
        })

    folder = tmp_path_factory.mktemp("hf") / "squad_like"
    datasets.DatasetDict({"train": split("t", 6), "validation": split("v", 4)}).save_to_disk(str(folder))
    return folder


@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> Path:
    import datasets

    folder = tmp_path_factory.mktemp("hf") / "flatqa"
    datasets.Dataset.from_dict({"question": ["One plus one?", "Two plus two?"], "answers": [["2"], ["4"]]}) \
        .save_to_disk(str(folder))
    return folder


def _config(sources: list) -> object:
    return load_config(ROOT / "configs" / "smoke.yaml", {"data.sources": sources})


def test_a_struct_column_and_both_splits_from_a_config(warehouse, squad_like, flat):
    cfg = _config([
        {"path": f"hf:{squad_like}", "dataset": "squadish", "columns": {"answers": "answers.text", "id": "id"}},
        {"path": f"hf:{squad_like}", "dataset": "squadish", "hf_split": "validation",
         "columns": {"answers": "answers.text", "id": "id", "metadata": ["answers.answer_start"]}},
        f"hf:{flat}",  # a bare name: the train split, question / answers columns
    ])
    reports = ingest(warehouse, cfg.data.sources)
    assert [(r.dataset, r.inserted, r.skipped) for r in reports] == [("squadish", 6, False), ("squadish", 4, False),
                                                                     ("flatqa", 2, False)]
    train = warehouse.questions(splits=["train"], datasets=["squadish"])
    test = warehouse.questions(splits=["test"], datasets=["squadish"])
    assert len(train) == 6 and len(test) == 4  # train filed as train, validation as test
    by_text = {q.question: q for q in train + test}
    assert by_text["v question 2: what is the capital of country 2?"].golds == ["City 2", "city2"]
    assert {q.split for q in warehouse.questions(datasets=["flatqa"])} == {"train"}
    assert all(r.skipped for r in ingest(warehouse, cfg.data.sources))  # unchanged: a no-op
    # where a dataset comes from is part of what a run trained on: a config with hf: entries validates
    assert cfg.hash() and cfg.data.sources[1].hf_split == "validation"


def test_split_and_scorer_keys_apply(warehouse, squad_like):
    cfg = _config([{"path": f"hf:{squad_like}", "hf_split": "validation", "split": "ood", "dataset": "held",
                    "columns": {"answers": "answers.text"}, "primary_metric": "em"}])
    (report,) = ingest(warehouse, cfg.data.sources)
    assert report.inserted == 4
    rows = warehouse.questions(datasets=["held"])
    assert {q.split for q in rows} == {"ood"} and {q.primary_metric for q in rows} == {"em"}


def test_errors_name_the_key(warehouse, squad_like):
    def fails(entry: dict, says: str) -> None:
        with pytest.raises(IngestError, match=says):
            ingest(warehouse, _config([entry]).data.sources)

    fails({"path": f"hf:{squad_like}", "columns": {"answers": "answer.text"}},
          r"column `answer.text`: no column `answer`.*fix data.sources\[0\].columns.answers")
    fails({"path": f"hf:{squad_like}", "columns": {"answers": "context.text"}},
          r"`context` is not a struct column; fix data.sources\[0\].columns.answers")
    fails({"path": f"hf:{squad_like}", "hf_split": "dev", "columns": {"answers": "answers.text"}},
          r"data.sources\[0\].hf_split: .*no split 'dev' \(its splits: train, validation\)")
    fails({"path": f"hf:{squad_like.parent / 'nothing-here'}"}, r"data.sources\[0\]: cannot load hf:")
    assert warehouse.table_counts()["questions"] == 0
    with pytest.raises(ConfigError, match=r"`config` is for Hugging Face sources"):
        _config([{"path": "data/sample/x.jsonl", "config": "main"}])


def test_cli_ingest_takes_the_same_entry(home, squad_like):
    from prompt_r1.cli import app

    result = CliRunner().invoke(app, ["ingest", f"hf:{squad_like}", "--answers-col", "answers.text",
                                      "--hf-split", "validation"])
    assert result.exit_code == 0, result.output
    from warehouse.store import Warehouse

    with Warehouse(home / "warehouse.duckdb") as wh:
        rows = wh.questions(datasets=["squad_like"])
    assert len(rows) == 4 and {q.split for q in rows} == {"test"}
    assert sorted(q.golds[0] for q in rows) == [f"City {i}" for i in range(4)]
