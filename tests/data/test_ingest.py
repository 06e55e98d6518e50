"""Ingestion into a real DuckDB file: Prompt-R1 Parquet, JSONL, HF datasets, and bad input."""

import json
import shutil
import subprocess
import sys

import duckdb
import pytest

from prompt_r1.data.ingest import ingest, ingest_hf
from prompt_r1.data.rows import IN_DOMAIN, OOD, IngestError
from prompt_r1.core.protocol import INSTRUCTION_MARKER

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_all_shared_files(warehouse, shared_data):
    reports = ingest(warehouse, [shared_data])
    assert len(reports) == 13 and not any(r.skipped for r in reports)
    summary = {(r["dataset"], r["split"]): r for r in warehouse.question_summary()}
    for name in IN_DOMAIN:
        assert summary[(name, "test")]["n"] >= 120
    for name in OOD:
        assert summary[(name, "ood")]["n"] == 128
    assert summary[("validation", "train")]["task_family"] == "math"
    # one question per source row: BookSum's 2 repeated texts with other references stay separate
    assert warehouse.table_counts()["questions"] == 3584
    booksum = warehouse.questions(datasets=["BookSum"])
    assert len(booksum) == 128 and len({q.question for q in booksum}) == 126
    assert all(len(q.golds) == 1 for q in booksum)
    assert not any(r.inserted for r in ingest(warehouse, [shared_data]))
    assert warehouse.table_counts()["questions"] == 3584
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


# -- one question per source row, corrections in place ---------------------------------------

def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _random_records(rng, n):
    """Rows drawn from a small pool of texts, so many rows repeat another row's question."""
    texts = [f"Question {k}?" for k in range(max(1, n // 3))]
    return [{"question": rng.choice(texts) + rng.choice(["", " ", "\t"]),
             "answers": [f"a{rng.randrange(5)}" for _ in range(rng.randint(1, 3))],
             "task_family": rng.choice(["standard_qa", "math"]),
             "dataset": rng.choice(["d1", "d2"])} for _ in range(n)]


def test_each_row_is_one_question_and_reingest_adds_none(warehouse, tmp_path):
    import random

    rng = random.Random(0)
    for case in range(25):
        records = _random_records(rng, rng.randint(1, 30))
        path = _jsonl(tmp_path / f"case{case}.jsonl", records)
        report = ingest(warehouse, [path])[0]
        assert report.inserted == len(records) and not report.updated
        stored = [q for q in warehouse.questions() if q.source_file == str(path)]
        # an independent statement of the rule: row i of the file is stored as row i, as written
        assert sorted((q.row_index, q.dataset, q.question, q.golds) for q in stored) == [
            (i, r["dataset"], r["question"].strip(), r["answers"]) for i, r in enumerate(records)]
        assert ingest(warehouse, [path])[0].skipped
    assert warehouse.table_counts()["questions"] == warehouse.query("SELECT sum(n_questions) FROM sources")[0][0]


def test_corrected_file_updates_golds_in_place(warehouse, tmp_path):
    import random

    rng = random.Random(1)
    path = tmp_path / "qa.jsonl"
    records = _random_records(rng, 40)
    _jsonl(path, records)
    ingest(warehouse, [path])
    ids = {q.row_index: q.question_id for q in warehouse.questions()}
    for _ in range(10):
        fixed = [dict(r) for r in records]
        changed = rng.sample(range(len(fixed)), rng.randint(1, 10))
        for i in changed:
            fixed[i]["answers"] = fixed[i]["answers"] + [f"fix{rng.random()}"]
        _jsonl(path, fixed)
        report = ingest(warehouse, [path])[0]
        # a row whose text is its own keeps its id; a repeated text is told apart by its golds, so its
        # corrected row is re-keyed (everything that referred to it follows), never new or removed
        assert (report.inserted, report.updated + report.rekeyed, report.removed) == (0, len(changed), 0)
        assert "updated" in report.describe() or "re-keyed" in report.describe()
        stored = {q.row_index: q for q in warehouse.questions()}
        key = lambda r: (r["dataset"], r["question"].strip())  # noqa: E731
        counts = {k: [key(r) for r in fixed].count(k) for k in map(key, fixed)}
        alone = [i for i, r in enumerate(fixed) if counts[key(r)] == 1]
        assert {i: stored[i].question_id for i in alone} == {i: ids[i] for i in alone}
        assert [stored[i].golds for i in range(len(fixed))] == [r["answers"] for r in fixed]
        ids = {i: q.question_id for i, q in stored.items()}
        records = fixed
    _jsonl(path, records[:30])  # a release with fewer rows drops the others
    report = ingest(warehouse, [path])[0]
    assert (report.inserted, report.updated, report.removed) == (0, 0, 10)
    assert warehouse.table_counts()["questions"] == 30
    assert warehouse.table_counts()["sources"] == 1  # the file's latest version only


def test_own_id_column_keys_rows(warehouse, tmp_path):
    recs = [{"id": f"x{i}", "question": "Same?", "answers": [str(i)], "task_family": "math"} for i in range(5)]
    ingest(warehouse, [_jsonl(tmp_path / "ids.jsonl", recs)])
    before = {q.golds[0]: q.question_id for q in warehouse.questions()}
    ingest(warehouse, [_jsonl(tmp_path / "ids.jsonl", recs[::-1])])  # reordered: same ids
    assert {q.golds[0]: q.question_id for q in warehouse.questions()} == before
    dup = _jsonl(tmp_path / "dup.jsonl", recs + [recs[1]])
    with pytest.raises(IngestError, match=r"dup.jsonl line 6: `id` 'x1' repeats .*dup.jsonl line 2"):
        ingest(warehouse, [dup])


# -- bad input names file and row -------------------------------------------------------------

def test_non_utf8_jsonl_names_the_line(warehouse, tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"question": "ok?", "answers": ["a"], "task_family": "math"})
    path.write_bytes(good.encode() + b"\n\n" + '{"question": "caf\xe9?", "answers": ["a"], "task_family": "math"}\n'
                     .encode("latin-1"))
    with pytest.raises(IngestError, match=r"latin1.jsonl line 3: not UTF-8 text \(byte 0xe9"):
        ingest(warehouse, [path])
    assert warehouse.table_counts()["sources"] == 0


def test_non_utf8_parquet_names_the_row(warehouse, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [b"Question: fine?", b"Question: caf\xe9?"]
    offsets = pa.py_buffer(pa.array([0, len(texts[0]), len(texts[0]) + len(texts[1])], pa.int32()).buffers()[1])
    content = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"".join(texts))])
    message = pa.StructArray.from_arrays([content, pa.array(["user", "user"])], names=["content", "role"])
    prompt = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), message)
    reward = pa.array([{"ground_truth": ["1"], "style": "rule"}] * 2)
    pq.write_table(pa.table({"prompt": prompt, "reward_model": reward}), tmp_path / "gsm8k.parquet")
    with pytest.raises(IngestError, match=r"gsm8k.parquet row 1 field prompt: text is not UTF-8"):
        ingest(warehouse, [tmp_path / "gsm8k.parquet"])


def test_reward_model_not_a_struct(warehouse, tmp_path):
    path = tmp_path / "hotpot.parquet"
    duckdb.connect().execute(
        "COPY (SELECT [{'content': 'Question: ok?', 'role': 'user'}] AS prompt, "
        "'{\"ground_truth\": [\"1\"]}' AS reward_model) TO ? (FORMAT parquet)", [str(path)])
    with pytest.raises(IngestError, match=r"hotpot.parquet row 0 field reward_model: expected a struct"):
        ingest(warehouse, [path])


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_files_are_errors_not_sources(warehouse, tmp_path, content):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text(content)
        with pytest.raises(IngestError, match=rf"{name}: no rows \(empty file\)"):
            ingest(warehouse, [tmp_path / name])
    assert warehouse.table_counts()["sources"] == 0


def test_unknown_split_is_an_error(warehouse, tmp_path):
    recs = [{"question": "q?", "answers": ["a"], "task_family": "math", "split": s} for s in ("train", "dev")]
    with pytest.raises(IngestError, match=r"s.jsonl line 2: split 'dev' is not one of train, test, ood"):
        ingest(warehouse, [_jsonl(tmp_path / "s.jsonl", recs)])
    assert warehouse.table_counts()["questions"] == 0


def test_question_length_cap(warehouse, tmp_path):
    from prompt_r1.config.experiment import DataConfig
    from prompt_r1.data.rows import MAX_QUESTION_CHARS

    assert MAX_QUESTION_CHARS == DataConfig().max_question_chars
    recs = [{"question": "short?", "answers": ["a"], "task_family": "math"},
            {"question": "x" * (MAX_QUESTION_CHARS + 1), "answers": ["a"], "task_family": "math"}]
    path = _jsonl(tmp_path / "long.jsonl", recs)
    with pytest.raises(IngestError, match=rf"long.jsonl line 2: question is {MAX_QUESTION_CHARS + 1:,} characters"):
        ingest(warehouse, [path])
    with pytest.raises(IngestError, match="line 1: question is 6 characters, over the limit of 5"):
        ingest(warehouse, [path], max_question_chars=5)
    assert ingest(warehouse, [path], max_question_chars=MAX_QUESTION_CHARS + 1)[0].inserted == 2


def test_cli_reports_updates(home, tmp_path):
    exe = [sys.executable, "-m", "prompt_r1.cli"]
    path = _jsonl(tmp_path / "qa.jsonl", [{"question": "q?", "answers": ["a"], "task_family": "math"}])
    assert subprocess.run(exe + ["ingest", str(path)], capture_output=True, text=True, cwd=ROOT).returncode == 0
    _jsonl(path, [{"question": "q?", "answers": ["b"], "task_family": "math"}])
    out = subprocess.run(exe + ["ingest", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "0 new, 1 updated" in out.stdout


# -- chat-layout prompts: the question is the last user turn -------------------------------------------
def _chat_parquet(path, prompts: list[list[dict]], golds: list[list[str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": prompts, "reward_model": [{"ground_truth": g} for g in golds]}), path)


def test_a_system_message_is_not_the_question(warehouse, tmp_path, caplog):
    path = tmp_path / "gsm8k.parquet"
    _chat_parquet(path, [[{"role": "system", "content": "You are a careful maths tutor."},
                          {"role": "user", "content": f"Question: What is 2+2?\n\n{INSTRUCTION_MARKER} ..."}],
                         [{"role": "user", "content": "Question: What is 3+3?"}]], [["4"], ["6"]])
    with caplog.at_level("WARNING", logger="prompt_r1.data.files"):
        ingest(warehouse, [path])
    assert sorted(q.question for q in warehouse.questions()) == ["What is 2+2?", "What is 3+3?"]
    assert "1 of 2 rows start with a system message" in caplog.text and str(path) in caplog.text


def test_the_question_is_the_last_user_message_of_any_chat(warehouse, tmp_path):
    """Random chats of system / user / assistant turns, against the rule stated again: the text of
    the last message whose role is `user`, with `Question:` and surrounding space removed."""
    import random

    rng = random.Random(3)
    prompts, expected = [], []
    for i in range(60):
        roles = [rng.choice(["system", "user", "assistant"]) for _ in range(rng.randint(0, 5))]
        roles.insert(rng.randint(0, len(roles)), "user")
        chat = [{"role": r, "content": f"{r} text {i}.{j}"} for j, r in enumerate(roles)]
        last = max(j for j, r in enumerate(roles) if r == "user")
        chat[last]["content"] = f"Question: question {i}?"
        prompts.append(chat)
        expected.append(f"question {i}?")
    path = tmp_path / "hotpot.parquet"
    _chat_parquet(path, prompts, [["a"]] * len(prompts))
    ingest(warehouse, [path])
    stored = sorted((q.row_index, q.question) for q in warehouse.questions())
    assert stored == list(enumerate(expected))


def test_a_chat_without_a_user_turn_names_the_row(warehouse, tmp_path):
    path = tmp_path / "hotpot.parquet"
    _chat_parquet(path, [[{"role": "user", "content": "Question: ok?"}],
                         [{"role": "system", "content": "Only a system prompt."}]], [["a"], ["b"]])
    with pytest.raises(IngestError, match=r"hotpot.parquet row 1: field `prompt` has no `user` message"):
        ingest(warehouse, [path])
    no_roles = tmp_path / "gsm8k.parquet"
    _chat_parquet(no_roles, [[{"content": "Question: one message?"}], [{"content": "a"}, {"content": "b"}]],
                  [["1"], ["2"]])
    with pytest.raises(IngestError, match=r"gsm8k.parquet row 1: .*without roles must hold exactly one message"):
        ingest(warehouse, [no_roles])
    assert warehouse.table_counts()["questions"] == 0
