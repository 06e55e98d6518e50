"""A user's mistake ends as one message and exit 2 (3 for an environment that failed), never a traceback.

Every command runs with bad input, and its message must name the key, file or resource at fault.
The table runs in process through typer's CliRunner, on the same app object as the `prompt-r1`
entry point (an exception that escapes a command shows there as `result.exception`); the tests
whose point is the real process (no traceback from the entry point, stdout kept JSON under
`ask --json`, a damaged checkpoint on `train --resume`) run as subprocesses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["-c", "configs/smoke.yaml"]
NO_AGENT = "no-such-agent"

# (arguments, exit code, words the message must hold); `{home}` is the test's PROMPT_R1_HOME.
CASES = [
    pytest.param(["check-config", "-c", "configs/nope.yaml"], 2, ["configs/nope.yaml", "not found"],
                 id="config-file-missing"),
    pytest.param(["check-config", *SMOKE, "--set", "seed.x=1"], 2, ["seed.x", "configs/smoke.yaml", "seed=VALUE"],
                 id="set-under-a-scalar"),
    pytest.param(["train", *SMOKE, "--set", "nokey=1"], 2, ["nokey", "configs/smoke.yaml"], id="set-unknown-key"),
    pytest.param(["train", *SMOKE, "--set", "foo"], 2, ["KEY=VALUE", "'foo'"], id="set-without-value"),
    pytest.param(["train", *SMOKE, "--set", f"agent.model={NO_AGENT}"], 2, [NO_AGENT, "bundled model"],
                 id="train-agent-model-no-agent"),
    pytest.param(["train", *SMOKE, "--run-id", "../x"], 2, ["--run-id", "'../x'"], id="train-unsafe-run-id"),
    pytest.param(["train", *SMOKE, "--set", "rollout.num_workers=8", "--set", "rollout.ray_num_cpus=2"], 2,
                 ["8 actors", "rollout.num_workers", "rollout.ray_num_cpus"], id="train-more-actors-than-cpus"),
    pytest.param(["train", *SMOKE, "--resume", "--run-id", "nope"], 2, ["--resume", "'nope'"],
                 id="train-resume-no-run"),
    pytest.param(["train", *SMOKE, "--set", "train.pack_tokens=257"], 2,
                 ["train.pack_tokens 257 cannot hold question", "agent.max_response_tokens 256", "at least"],
                 id="train-pack-holds-a-response-not-a-prompt"),
    pytest.param(["pipeline", *SMOKE, "--set", "train.pack_tokens=300", "--set", "agent.describe_environment=true"], 2,
                 ["train.pack_tokens 300 cannot hold question", "at least"], id="pipeline-pack-too-small"),
    pytest.param(["train", *SMOKE, "--force"], 2, ["--force", "--resume"], id="train-force-without-resume"),
    pytest.param(["evaluate", *SMOKE, "--run-id", "../x"], 2, ["--run-id", "'../x'"], id="evaluate-unsafe-run-id"),
    pytest.param(["evaluate", *SMOKE, "--agent", NO_AGENT], 2, [NO_AGENT, "bundled model"], id="evaluate-no-agent"),
    pytest.param(["rollout", *SMOKE, "--run-id", "../x"], 2, ["'../x'", "--run-id"], id="rollout-unsafe-run-id"),
    pytest.param(["rollout", *SMOKE, "--workers", "8", "--set", "rollout.ray_num_cpus=2"], 2, ["8 actors", "rollout.num_workers", "--workers"],
                 id="rollout-more-actors-than-cpus"),
    pytest.param(["rollout", *SMOKE, "--set", f"agent.model={NO_AGENT}"], 2, [NO_AGENT], id="rollout-no-agent"),
    pytest.param(["ask", "Who wrote Hamlet?", *SMOKE, "--agent", NO_AGENT], 2, [NO_AGENT, "bundled model"],
                 id="ask-no-agent"),
    pytest.param(["ask", "Who wrote Hamlet?", *SMOKE, "--env", "nope"], 2, ["'nope'", "tiny-env"], id="ask-no-env"),
    pytest.param(["ask", "Who wrote Hamlet?", *SMOKE, "--agent", "no-such-org/no-such-model"], 2,
                 ["'no-such-org/no-such-model'", "hub id"], id="ask-hub-id-offline"),
    pytest.param(["ask", "Who wrote Hamlet?", *SMOKE, "--set", "environment.model=no-such-env-model"], 2,
                 ["environment `tiny-env`", "'no-such-env-model'"], id="ask-environment-model-missing"),
    pytest.param(["serve", *SMOKE, "--agent", NO_AGENT], 2, [NO_AGENT], id="serve-no-agent"),
    pytest.param(["serve-env", *SMOKE, "--env", "nope"], 2, ["'nope'", "tiny-env"], id="serve-env-no-env"),
    pytest.param(["export", "{home}/no-checkpoint", "{home}/out"], 2, ["no-checkpoint", "not a checkpoint"],
                 id="export-no-checkpoint"),
    pytest.param(["ingest", "{home}/no-such.jsonl", "--db", "{home}/w.duckdb"], 2, ["no-such.jsonl"],
                 id="ingest-no-file"),
    pytest.param(["summary", "--db", "{home}/none.duckdb"], 2, ["none.duckdb", "ingest"], id="summary-no-warehouse"),
    pytest.param(["run-flow", "nope", *SMOKE], 2, ["'nope'", "ingest, train"], id="run-flow-unknown"),
    pytest.param(["pipeline", "-c", "configs/nope.yaml"], 2, ["configs/nope.yaml"], id="pipeline-config-missing"),
    pytest.param(["pipeline", *SMOKE, "--set", "rollout.num_workers=9", "--set", "rollout.ray_num_cpus=2"], 2,
                 ["9 actors", "rollout.num_workers"],
                 id="pipeline-more-actors-than-cpus"),
    pytest.param(["run-flow", "train", *SMOKE, "--set", f"agent.model={NO_AGENT}"], 2, [NO_AGENT],
                 id="run-flow-train-no-agent"),
    pytest.param(["rerun", "no-such-run"], 2, ["no-such-run", "mlflow.db"], id="rerun-unknown-id"),
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id fails at once instead of retrying for a minute


@pytest.mark.parametrize("args, code, words", CASES)
def test_a_mistake_is_one_message_naming_it_and_exit_2(home, args, code, words):
    result = CliRunner().invoke(app, [a.format(home=home) for a in args])
    text = " ".join(result.output.split())
    assert isinstance(result.exception, SystemExit), f"{result.exception!r} escaped: {text[-2000:]}"
    assert result.exit_code == code, text[-2000:]
    assert "Traceback" not in result.output
    assert "error:" in text
    for word in words:
        assert word in text, (word, text[-2000:])
    if args[0] == "rerun":  # looking a run up must not create an empty tracking store
        assert not (home / "mlflow.db").exists()


def _cli(home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # COLUMNS: rich wraps log lines at the terminal width (80 in a pipe), which splits long paths
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "1000"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, words", [
    pytest.param(["train", *SMOKE, "--set", f"agent.model={NO_AGENT}"], [NO_AGENT], id="train-no-agent"),
    pytest.param(["rollout", *SMOKE, "--run-id", "../x"], ["'../x'"], id="rollout-unsafe-run-id"),
])
def test_the_entry_point_prints_one_line_not_a_traceback(home, args, words):
    proc = _cli(home, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out  # neither a plain nor a rich one
    error = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and all(w in " ".join(proc.stdout.split()) for w in words), proc.stdout


# -- ask --json: stdout holds one JSON object, also when it fails --------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ask_json_failures_are_a_json_object_on_stdout(home):
    bad_env = _cli(home, "ask", "Who wrote Hamlet?", *SMOKE, "--json", "--env", "nope")
    assert bad_env.returncode == 2, bad_env.stderr[-2000:]
    failure = json.loads(bad_env.stdout)
    assert failure["exit_code"] == 2 and "'nope'" in failure["error"] and "tiny-env" in failure["error"]
    assert "error:" in bad_env.stderr  # the human message, on stderr

    usage = _cli(home, "ask", "Who wrote Hamlet?", "--json")  # --config missing: a usage error
    assert usage.returncode == 2
    assert json.loads(usage.stdout)["error"] == "Missing option '--config' / '-c'."


def test_ask_json_against_a_dead_environment_is_the_episode_with_its_error_and_exit_3(home):
    dead = ["environment.kind=openai", f"environment.base_url=http://127.0.0.1:{_closed_port()}/v1",
            "environment.model=nobody-home", "environment.max_retries=0", "environment.timeout_s=5"]
    # the tiny agent's greedy first turn asks the environment
    proc = _cli(home, "ask", "What is the capital of France?", *SMOKE, "--json",
                *[arg for item in dead for arg in ("--set", item)])
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # nothing but the JSON: logs and progress bars are on stderr
    assert report["exit_code"] == 3 and report["stop_reason"] == "env_error"
    assert "onnect" in report["error"] and report["environment"] == "tiny-env"
    assert "environment failure: environment 'tiny-env' failed" in " ".join(proc.stderr.split())


# -- train --resume over a damaged checkpoint ----------------------------------------------------------
def test_resume_passes_over_a_corrupted_newest_checkpoint_and_says_so(home):
    """A run stopped after its step-2 checkpoint, whose weights file was then truncated: the
    resume names that checkpoint, continues from step 1, and finishes the run."""
    from prompt_r1.config.experiment import load_config
    from prompt_r1.config.run_home import run_dir
    from prompt_r1.models.resolver import resolve_agent
    from prompt_r1.learner.checkpoint import save_checkpoint
    from prompt_r1.models.export import MANIFEST
    from prompt_r1.learner.grpo_learner import GRPOLearner
    from prompt_r1.training.run_folder import open_run
    from prompt_r1.data.pool import TrainingPool
    from warehouse.store import Warehouse

    cfg = load_config("configs/smoke.yaml")
    folder = run_dir(cfg.name, "damaged")
    with Warehouse(home / "warehouse.duckdb") as wh:
        from prompt_r1.data.ingest import ingest

        ingest(wh, cfg.data.sources)
        open_run(folder, cfg.name, cfg.hash(), TrainingPool.load(wh, cfg).hash, resume=False)
    learner = GRPOLearner(cfg, resolve_agent(cfg.agent.model))
    for step in (1, 2):
        save_checkpoint(learner, folder / "checkpoints", step, {"position": step}, cfg)
    weights = folder / "checkpoints" / "step-000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert (weights.parent / MANIFEST).is_file()

    proc = _cli(home, "train", *SMOKE, "--run-id", "damaged", "--resume", timeout=900)
    log = " ".join(proc.stderr.split())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"checkpoint {folder / 'checkpoints' / 'step-000002'} is corrupted: model.safetensors has" in log
    assert "resuming from step-000001, the newest intact checkpoint" in log
    assert "next step 1" in log
    assert (folder / "agent" / "config.json").is_file()
