"""Ingestion into a real DuckDB file: Prompt-R1 Parquet, JSONL, HF datasets, and bad input."""

import json
import shutil
import subprocess
import sys

import duckdb
import pytest

from prompt_r1.ingest import IN_DOMAIN, OOD, IngestError, ingest, ingest_hf
from prompt_r1.protocol import INSTRUCTION_MARKER

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_all_shared_files(warehouse, shared_data):
    reports = ingest(warehouse, [shared_data])
    assert len(reports) == 13 and not any(r.skipped for r in reports)
    summary = {(r["dataset"], r["split"]): r for r in warehouse.question_summary()}
    for name in IN_DOMAIN:
        assert summary[(name, "test")]["n"] >= 120
    for name in OOD:
        assert summary[(name, "ood")]["n"] == 128
    assert summary[("validation", "train")]["task_family"] == "math"
    # BookSum repeats 2 questions with other reference texts: one row each, both references kept
    booksum = warehouse.questions(datasets=["BookSum"])
    assert len(booksum) == 126 and sum(len(q.golds) for q in booksum) == 128
    fam = {k[0]: (v["task_family"], v["primary_metric"]) for k, v in summary.items()}
    assert fam["hotpot"] == ("multihop_qa", "f1") and fam["PopQA"] == ("standard_qa", "f1")
    assert fam["gsm8k"] == ("math", "em") and fam["triviaqa_ood"] == ("standard_qa", "em")
    assert fam["BookSum"] == ("generation", "ssim") and fam["Xsum_ood"] == ("generation", "ssim")
    # the instruction template is stripped and the golds are lists
    q = warehouse.questions(datasets=["gsm8k"], limit_per_dataset=3)
    assert len(q) == 3 and all(INSTRUCTION_MARKER not in x.question for x in q)
    assert not q[0].question.startswith("Question:") and q[0].golds == ["30"]


def test_reingest_is_noop_and_ids_stable(warehouse, shared_data):
    first = ingest(warehouse, [shared_data / "eval" / "hotpot.parquet"])
    ids = [q.question_id for q in warehouse.questions(datasets=["hotpot"])]
    again = ingest(warehouse, [shared_data / "eval" / "hotpot.parquet"])
    assert first[0].inserted == 128 and again[0].skipped
    assert [q.question_id for q in warehouse.questions(datasets=["hotpot"])] == ids
    assert warehouse.table_counts()["questions"] == 128


def test_sample_data(warehouse):
    ingest(warehouse, [ROOT / "data" / "sample"])
    rows = warehouse.question_summary()
    families = {r["task_family"] for r in rows if r["split"] == "test"}
    assert families == {"multihop_qa", "standard_qa", "math", "generation"}
    assert sum(r["n"] for r in rows if r["split"] == "train") == 24


def test_bad_row_rolls_back_source_and_keeps_earlier(warehouse, tmp_path):
    good = tmp_path / "a_good.jsonl"
    good.write_text(json.dumps({"question": "Q1?", "answers": ["A"], "task_family": "standard_qa"}) + "\n")
    bad = tmp_path / "b_bad.jsonl"
    bad.write_text(
        json.dumps({"question": "Q2?", "answers": ["B"], "task_family": "standard_qa"}) + "\n"
        + json.dumps({"question": "Q3?", "task_family": "standard_qa"}) + "\n"
    )
    with pytest.raises(IngestError) as err:
        ingest(warehouse, [tmp_path])
    assert "b_bad.jsonl line 2" in str(err.value) and "answers" in str(err.value)
    assert [q.question for q in warehouse.questions()] == ["Q1?"]  # first file kept, second rolled back


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"question": "", "answers": ["a"], "task_family": "math"}), "empty or missing question"),
        (json.dumps({"question": "q", "answers": [], "task_family": "math"}), "no gold answer"),
        (json.dumps({"question": "q", "answers": ["a"], "task_family": "poetry"}), "task_family"),
    ],
)
def test_bad_jsonl_rows_name_the_row(warehouse, tmp_path, line, message):
    f = tmp_path / "x.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(IngestError, match=message) as err:
        ingest(warehouse, [f])
    assert "x.jsonl line 1" in str(err.value)
    assert warehouse.table_counts()["questions"] == 0


def test_corrupt_parquet_and_unknown_names(warehouse, tmp_path, shared_data):
    corrupt = tmp_path / "hotpot.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(IngestError, match="not a readable"):
        ingest(warehouse, [corrupt])
    renamed = tmp_path / "mystery.parquet"
    shutil.copy(shared_data / "eval" / "hotpot.parquet", renamed)
    with pytest.raises(IngestError, match="unknown Prompt-R1 file name"):
        ingest(warehouse, [renamed])
    with pytest.raises(IngestError, match="no such file"):
        ingest(warehouse, [tmp_path / "missing"])


def test_bad_parquet_row(warehouse, tmp_path):
    path = tmp_path / "gsm8k.parquet"
    duckdb.connect().execute(
        "COPY (SELECT 'x' AS data_source, [{'content': 'Question: ok?', 'role': 'user'}] AS prompt, "
        "'math' AS ability, {'ground_truth': ['1'], 'style': 'rule'} AS reward_model "
        "UNION ALL SELECT 'x', [{'content': 'Question: no gold', 'role': 'user'}], 'math', "
        "{'ground_truth': []::VARCHAR[], 'style': 'rule'}) TO ? (FORMAT parquet)", [str(path)])
    with pytest.raises(IngestError, match=r"gsm8k.parquet row 1 field reward_model.ground_truth"):
        ingest(warehouse, [path])
    assert warehouse.table_counts()["questions"] == 0


def test_hf_dataset_from_local_files(warehouse, tmp_path):
    data = tmp_path / "myqa"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(
        json.dumps({"q": f"Question {i}?", "a": [f"ans{i}"]}) for i in range(5)) + "\n")
    report = ingest_hf(warehouse, str(data), question_col="q", answers_col="a", task_family="standard_qa")
    assert report.inserted == 5 and report.dataset == "myqa"
    assert ingest_hf(warehouse, str(data), question_col="q", answers_col="a", task_family="standard_qa").skipped
    with pytest.raises(IngestError, match="no column `question`"):
        ingest_hf(warehouse, str(data), question_col="question", answers_col="a", task_family="standard_qa")


def test_cli_ingest_and_error_exit(home, tmp_path):
    exe = [sys.executable, "-m", "prompt_r1.cli"]
    ok = subprocess.run(exe + ["ingest", "data/sample"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "sample_math" in ok.stdout and (home / "warehouse.duckdb").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    fail = subprocess.run(exe + ["ingest", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert fail.returncode == 2
    assert "bad.jsonl line 1" in fail.stdout and "answers" in fail.stdout
