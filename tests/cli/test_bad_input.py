"""Bad input that used to pass silently or crash (issue 34): each is now refused with one message
naming what is wrong, before any work starts, or reported as the failure it is.

Runs the CLI in process through typer's CliRunner, on the same app as the `prompt-r1` entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["-c", "configs/smoke.yaml"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _no_ray_before():
    """These tests check that their own command starts no Ray: one that an earlier test of this
    worker left running (seen once under xdist, not reproduced alone) is stopped first."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _refused(args: list[str], *words: str, code: int = 2) -> str:
    """Run a command that must stop with `error: ...` naming `words`; return its output."""
    result = CliRunner().invoke(app, args)
    text = " ".join(result.output.split())
    assert isinstance(result.exception, SystemExit), f"{result.exception!r} escaped: {text[-2000:]}"
    assert result.exit_code == code, text[-2000:]
    assert "Traceback" not in result.output and "error:" in text, text[-2000:]
    for word in words:
        assert word in text, (word, text[-2000:])
    return text


# -- config files -------------------------------------------------------------------------------------
def test_check_config_refuses_a_duplicated_key(home, tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text((ROOT / "configs" / "smoke.yaml").read_text() + "\ntrain:\n  steps: 9\n")
    first = next(i for i, line in enumerate(dup.read_text().splitlines(), 1) if line.startswith("train:"))
    _refused(["check-config", "-c", str(dup)], str(dup), "`train`", f"line {first} and line")


@pytest.mark.parametrize("item, key", [("train.lr=true", "train.lr"), ("train.steps=false", "train.steps")])
def test_check_config_refuses_a_bool_for_a_number(home, item, key):
    _refused(["check-config", *SMOKE, "--set", item], f"`{key}`", "boolean")


# -- ask and rollout: nothing to ask, or nothing answered ---------------------------------------------
@pytest.mark.parametrize("question", ["", "   \n\t"])
def test_ask_refuses_an_empty_question(home, question):
    _refused(["ask", question, *SMOKE], "question is empty")
    result = CliRunner().invoke(app, ["ask", question, *SMOKE, "--json"])
    assert result.exit_code == 2 and '"exit_code": 2' in result.output and "question is empty" in result.output


@pytest.mark.parametrize("question", ["caf" + chr(0xDCE9), chr(0xDCFF) + chr(0xDCFE), "ok " + chr(0xD800) + " ok",
                                      "Who wrote " + chr(0xDFFF) + "?"])
def test_ask_refuses_a_question_that_is_not_utf8(home, question):
    """Bytes that are not UTF-8 reach Python's argv as lone surrogates; refused before any model loads,
    with a message that prints (it was a UnicodeEncodeError traceback)."""
    _refused(["ask", question, *SMOKE], "not valid UTF-8", "character")
    result = CliRunner().invoke(app, ["ask", question, *SMOKE, "--json"])
    assert result.exit_code == 2 and '"exit_code": 2' in result.output and "not valid UTF-8" in result.output


def test_ask_with_bytes_that_are_not_utf8_in_a_real_process_prints_one_line(home):
    import subprocess
    import sys

    for as_json in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-m", "prompt_r1.cli", "ask", b"caf\xe9 \xff?", *SMOKE, *as_json],
                              capture_output=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2, done.stderr.decode(errors="replace")[-2000:]
        both = (done.stdout + done.stderr).decode(errors="replace")
        assert "Traceback" not in both and "not valid UTF-8" in both and "character 4" in both, both[-2000:]


@pytest.mark.parametrize("limit, length", [(None, 20_001), (None, 100_000), (10, 11), (500, 501)])
def test_ask_refuses_a_question_longer_than_max_question_chars_before_the_agent_loads(home, limit, length):
    """The limit ingest and `serve` apply; `ask` answered a 100,000-character question with nothing, after 48 s."""
    args = ["--set", f"data.max_question_chars={limit}"] if limit else []
    text = _refused(["ask", "why " * (length // 4) + "x" * (length % 4), *SMOKE, *args],
                    f"{length} characters", f"limit is {limit or 20_000}", "data.max_question_chars")
    assert "agent " not in text.split("error:")[0]  # refused before the agent was resolved


def test_a_question_at_the_limit_is_asked():
    from prompt_r1.serving.service import QuestionError, check_question

    for limit in (1, 10, 20_000):
        assert check_question("x" * limit, limit) == "x" * limit
        with pytest.raises(QuestionError, match=f"{limit + 1} characters"):
            check_question("x" * (limit + 1), limit)


def test_rollout_whose_environment_calls_all_failed_exits_3_and_says_so(home):
    import socket

    import ray

    from warehouse.store import Warehouse

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    dead = ["environment.kind=openai", f"environment.base_url=http://127.0.0.1:{port}/v1",
            "environment.model=nobody-home", "environment.max_retries=0", "environment.timeout_s=5"]
    try:  # the command runs in this process: the Ray instance it started must not outlive the test
        text = _refused(["rollout", *SMOKE, "--run-id", "dead", "--workers", "1",
                         *[arg for item in dead for arg in ("--set", item)]], "environment `tiny-env`",
                        "calls failed in the rollout", "first error:", code=3)
    finally:
        ray.shutdown()
    assert "error:" in text
    with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:  # the failed calls are recorded
        calls = wh.query("SELECT error FROM env_calls WHERE run_id = 'dead'")
    assert calls and all(e for (e,) in calls)


@pytest.mark.parametrize("workers", ["-1", "0"])
def test_rollout_workers_below_one_refused_before_ray_starts(home, workers):
    import ray

    assert not ray.is_initialized()
    _refused(["rollout", *SMOKE, "--workers", workers], "--workers", "1 or more", f"got {workers}",
             "rollout.num_workers (1)")
    assert not ray.is_initialized()


# -- plan: a config.json that is no model config --------------------------------------------------------
@pytest.mark.parametrize("content, words", [
    pytest.param("[1, 2]", ["holds a JSON list"], id="a-list"),
    pytest.param('{"vocab_size": "32k", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, '
                 '"num_attention_heads": 2}', ["`vocab_size`", "'32k'"], id="string-vocab-size"),
    pytest.param('{"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": true, "intermediate_size": 128, '
                 '"num_attention_heads": 2}', ["`num_hidden_layers`", "True"], id="bool-layers"),
    pytest.param('{"text_config": "x"}', ["its `text_config` holds a JSON string"], id="text-config-string"),
])
def test_plan_on_a_malformed_config_json_names_the_file_and_field(home, tmp_path, content, words):
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "config.json").write_text(content)
    _refused(["plan", *SMOKE, "--set", f"agent.model={agent}"], f"config.json of {agent}", *words, "--params")
    # what the message offers works: the count given, the plan goes on with a guessed shape
    result = CliRunner().invoke(app, ["plan", *SMOKE, "--set", f"agent.model={agent}", "--params", "2e6"])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert "guessed from --params" in result.output, result.output[-2000:]


# -- evaluate --out: a user's files are never written over ------------------------------------------------
def test_evaluate_out_never_writes_over_files_it_did_not_write(home, tmp_path):
    mine = tmp_path / "my-notes"
    mine.mkdir()
    (mine / "results.md").write_text("my own results\n")
    (mine / "results.csv").write_text("a,b\n")
    for extra in ([], ["--overwrite"]):  # --overwrite replaces an earlier report, never a user's folder
        _refused(["evaluate", *SMOKE, "--out", str(mine), *extra], str(mine), "not an earlier evaluation report",
                 "nothing was changed")
    assert (mine / "results.md").read_text() == "my own results\n" and (mine / "results.csv").read_text() == "a,b\n"
    assert sorted(p.name for p in mine.iterdir()) == ["results.csv", "results.md"]


def test_evaluate_out_replaces_an_earlier_report_only_with_overwrite(home, tmp_path):
    out = tmp_path / "report"
    args = ["evaluate", *SMOKE, "--out", str(out), "--set", 'eval.methods=["direct"]',
            "--set", "eval.limit_per_dataset=1", "--set", "eval.agent_checkpoints=[]"]
    first = CliRunner().invoke(app, [*args, "--run-id", "first"])
    assert first.exit_code == 0, first.output[-3000:]
    report = (out / "results.md").read_text()
    _refused([*args, "--run-id", "second"], str(out), "holds an earlier evaluation report", "--overwrite")
    assert (out / "results.md").read_text() == report
    again = CliRunner().invoke(app, [*args, "--run-id", "third", "--overwrite"])
    assert again.exit_code == 0 and "run id third" in " ".join(again.output.split()), again.output[-3000:]
    assert (out / "results.md").is_file()


# -- models that Ray's actors would fail to load ----------------------------------------------------
@pytest.mark.parametrize("model, says", [("no-such-org/no-such-model", "HF_HUB_OFFLINE"),
                                          ("/no/such/folder", "no such folder"),
                                          ("./missing-model", "no such folder"),
                                          ("~/missing/model/dir", "no such folder")])
def test_train_refuses_an_environment_model_that_cannot_load_before_ray(home, model, says):
    """An in-process training environment's model loads inside each rollout actor, where a failure
    was 235 lines of ActorDiedError; the one environment and a pool member alike are named first."""
    import ray

    pool = json.dumps([{"name": "a", "model": "tiny", "kind": "inprocess"},
                       {"name": "b", "model": model, "kind": "inprocess"}])
    for sets, where in ((["environment.model=" + model], "environment `tiny-env` (its `model`)"),
                        (["train.environments=" + pool], "train.environments[1] `b` (its `model`)")):
        for command in (["train"], ["run-flow", "train"]):
            args = [*command, *SMOKE, *[a for s in sets for a in ("--set", s)]]
            _refused(args, where, repr(model), says)
            assert not ray.is_initialized() and not (home / "smoke").exists()


@pytest.mark.parametrize("agent", ["no-such-org/no-such-model", "someone/some-agent"])
def test_train_refuses_an_agent_hub_id_the_offline_hub_cannot_serve_before_ray(home, agent):
    import ray

    _refused(["train", *SMOKE, "--set", f"agent.model={agent}"], "the agent", repr(agent), "HF_HUB_OFFLINE")
    assert not ray.is_initialized() and not (home / "smoke").exists()


def test_run_flow_evaluate_takes_agent_as_its_messages_say_and_other_flows_refuse_it(home, monkeypatch):
    """`run-flow evaluate` told the user to pass `--agent trained=SPEC`, an option it did not have."""
    import flows.evaluate

    seen = []
    monkeypatch.setattr(flows.evaluate, "evaluate_flow", lambda config, agents=None, **kw: seen.append(agents) or
                        {"run_id": "r", "report": "x"})
    for given, want in ((["trained=runs/smoke/abc"], {"trained": "runs/smoke/abc"}),
                        (["trained=/a/b", "tiny-protocol"], {"trained": "/a/b", "tiny-protocol": "tiny-protocol"}),
                        ([], None)):
        result = CliRunner().invoke(app, ["run-flow", "evaluate", *SMOKE, *[a for g in given for a in ("--agent", g)]])
        assert result.exit_code == 0, result.output
        assert seen.pop() == want
    for flow in ("train", "ingest", "transfer-eval"):
        _refused(["run-flow", flow, *SMOKE, "--agent", "trained=x"], "--agent is for `run-flow evaluate`", repr(flow))
    _refused(["run-flow", "evaluate", *SMOKE, "--agent", "trained="], "--agent 'trained='", "no spec")


@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_a_training_session_refuses_a_device_it_lacks_before_a_run_folder_or_ray(tmp_path, warehouse, device):
    """The Python API (`TrainingSession`, as `prompt_r1.api.train` uses it) checks as the CLI does."""
    import ray

    from prompt_r1.config.base import ConfigError
    from prompt_r1.config.experiment import load_config
    from prompt_r1.training.session import TrainingSession

    cfg = load_config("configs/smoke.yaml", {"train.device": device})
    with pytest.raises(ConfigError, match="train.device"):
        with TrainingSession(cfg, warehouse, "r", tmp_path / "run"):
            pass
    assert not (tmp_path / "run").exists() and not ray.is_initialized()


def test_train_refuses_gpu_rollouts_where_no_gpu_is_visible_before_ray(home):
    """`agent.device: cuda` on a machine whose torch sees no GPU: one message naming the settings,
    from `train` and `run-flow train` alike, before Ray or a run folder (not an error per actor)."""
    import ray
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    sets = ["agent.device=cuda", "agent.batch_invariant=false", "rollout.gpus_per_worker=0.5"]
    for command in (["train"], ["run-flow", "train"]):
        _refused([*command, *SMOKE, *[a for s in sets for a in ("--set", s)]], "agent.device",
                 "sees no CUDA GPU", "rollout.gpus_per_worker to 0")
        assert not ray.is_initialized() and not (home / "smoke").exists()
