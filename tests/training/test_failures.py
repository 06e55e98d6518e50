"""Environment failures are recorded as failures: never scored, never shown to the agent.

Fast tests: the rollout ends a trajectory at a failed call (no error text in its tokens, no
reward), the learner's selection of trajectories, evaluation rows and means, the warehouse
columns (and an old warehouse file gaining them), and `prompt-r1 evaluate` / `prompt-r1 train`
against a closed port (exit 3, message naming the environment and its error, no agent).
The slow chaos test runs the smoke training and evaluation through `chaos_proxy.ChaosProxy`
in front of a real managed vLLM server at 10% and 30% fault rates.
"""

from __future__ import annotations

import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from prompt_r1.env.base import EnvReply
from prompt_r1.config.env import EnvConfig
from prompt_r1.evaluation.scoring import METRICS, Prediction, aggregate, score_predictions
from prompt_r1.core.failures import EnvironmentFailure, check_error_rate, error_rate
from prompt_r1.training.batch_stats import usable_for_update
from prompt_r1.core.trajectory import EnvCall, Trajectory
from tests.rollout.test_rollout import ASK, ANSWER, ScriptedEnv, ScriptedPolicy, question, run
from prompt_r1.core.questions import QuestionRow
from warehouse.store import Warehouse

ROOT = Path(__file__).resolve().parents[2]
FAIL_TEXT = "FAILED-CALL-TEXT"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the rollout ---------------------------------------------------------------------------------
def test_failed_call_ends_the_trajectory_without_its_text(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    count = [0]

    def reply(messages, turn):
        count[0] += 1
        if count[0] % 3 == 0:  # every third call fails, first or second turn alike
            return EnvReply(f"[environment error: {FAIL_TEXT}]", EnvCall(turn, "scripted-env", "script",
                                                                        error=f"HTTP 500: {FAIL_TEXT}"))
        return f"fine reply {turn}"

    script = lambda text, n: ASK.format(n=n, q=text[-40:].count("e")) if n < 2 else ANSWER
    qs = [question(i, f"Question number {i} about {'x' * i}?") for i in range(6)]
    trajs = run(ScriptedPolicy(tokenizer, script), ScriptedEnv(reply), qs, group=2, max_turns=3)
    failed = [t for t in trajs if t.error]
    assert failed and len(failed) < len(trajs), "the script should fail some trajectories, not all"
    for t in trajs:
        text = tokenizer.decode(t.token_ids)
        assert FAIL_TEXT not in text and all(FAIL_TEXT not in r for r in t.env_replies)
        errors = [c.error for c in t.env_calls if c.error]
        if t.error:  # ended at its one failed call, which is recorded last; nothing scored
            assert t.stop_reason == "env_error" and t.reward is None and t.answer == ""
            assert errors == [t.error] and t.env_calls[-1].error == t.error
            assert len(t.env_replies) == len(t.env_calls) - 1
        else:
            assert not errors and t.reward is not None and t.stop_reason != "env_error"


# -- the learner's share --------------------------------------------------------------------------
def test_usable_for_update_matches_an_independent_statement():
    rng = random.Random(0)
    for _ in range(300):
        trajs = [Trajectory(f"q{rng.randrange(5)}", i, [], error=rng.choice([None, None, "HTTP 500"]))
                 for i in range(rng.randrange(0, 14))]
        kept = usable_for_update(trajs)
        for t in trajs:  # kept <=> no error and at least one other error-free member of its question
            partners = [u for u in trajs if u is not t and u.question_id == t.question_id and u.error is None]
            assert (t in kept) == (t.error is None and len(partners) >= 1)
        assert kept == [t for t in trajs if t in kept]  # order kept


def test_error_rate_threshold_names_environment_and_first_error():
    rng = random.Random(1)
    for _ in range(200):
        errors = [rng.choice([None, None, None, f"HTTP {rng.randrange(400, 600)}"]) for _ in range(rng.randrange(1, 30))]
        limit = rng.choice([0.0, 0.05, 0.3, 1.0])
        failed = [e for e in errors if e]
        if len(failed) > limit * len(errors):
            with pytest.raises(EnvironmentFailure) as info:
                check_error_rate("gpt-x", errors, limit, "evaluation")
            assert "`gpt-x`" in str(info.value) and str(info.value).endswith(failed[0])
            assert info.value.first_error == failed[0]
        else:
            assert check_error_rate("gpt-x", errors, limit, "evaluation") == error_rate(errors)


# -- validation: scored over answered questions, stopped like a training step ---------------------------
class _ValidationPool:
    """Stands in for the rollout pool: question i's trajectory ended by `errors[i]` (None = answered
    in the protocol's format), after one successful call before it. Validation scores in the driver
    (`score=False` here), with the question's scorer: its answer score is the question's `r`."""

    def __init__(self, errors: list[str | None]):
        self.errors = errors
        self.restarts = 0  # `RolloutPool.restarts`: no actor died here

    def rollout(self, questions, step, greedy=False, group_size=None, score=True):
        assert greedy and group_size == 1 and not score
        out = []
        for q, err in zip(questions, self.errors):
            calls = [EnvCall(0, "tiny-env", "tiny"), EnvCall(1, "tiny-env", "tiny", error=err)]
            turns = ["<think>t</think><interaction_prompt>q</interaction_prompt>", "<think>t</think><answer>a</answer>"]
            out.append(Trajectory(q.question_id, 0, [], agent_turns=[] if err else turns, env_calls=calls, error=err,
                                  stop_reason="env_error" if err else "answered"))
        return out


def _validation(tmp_path, errors: list[str | None], rewards: list[float], max_error_rate: float) -> dict:
    import dataclasses

    from prompt_r1.config.experiment import load_config
    from prompt_r1.training.session import TrainingSession

    (tmp_path / "r_scorer.py").write_text("def score(prediction, golds, metadata):\n    return metadata['r']\n")
    spec = f"{tmp_path / 'r_scorer.py'}:score"
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"environment.max_error_rate": max_error_rate,
                                                        "train.validation_questions": len(errors)})
    session = TrainingSession(cfg, None, "val", tmp_path / "run")  # nothing starts before `with`
    session.val_questions = [dataclasses.replace(question(i, f"held-out {i}?"), metadata={"r": r}, scorer=spec)
                             for i, r in zip(range(len(errors)), rewards)]
    session.pool, session.step = _ValidationPool(errors), 2
    return session.validate()


def test_validation_whose_calls_all_failed_stops_the_run_instead_of_scoring_0(tmp_path):
    with pytest.raises(EnvironmentFailure) as info:  # 2 of 4 calls failed: 50% > 5%
        _validation(tmp_path, ["connection refused", "connection refused"], [0.0, 0.0], 0.05)
    flat = str(info.value)
    assert "environment `tiny-env`" in flat and "validation after 2 update(s)" in flat
    assert flat.endswith("first error: connection refused") and info.value.error_rate == 0.5
    # within a generous max_error_rate, failures that leave nothing to score still stop it
    with pytest.raises(EnvironmentFailure, match="every question of validation after 2 update"):
        _validation(tmp_path, ["HTTP 500", "HTTP 500"], [0.0, 0.0], 1.0)


def test_validation_scores_only_answered_questions_and_reports_the_error_rate(tmp_path):
    rewards = [0.2, 0.8, 0.5, 0.9]
    val = _validation(tmp_path, [None, "HTTP 500", None, None], rewards, 0.5)  # 1 of 8 calls failed
    assert val["val_reward"] == pytest.approx((0.2 + 0.5 + 0.9) / 3)  # the failed question is no 0
    assert val["val_env_error_rate"] == 1 / 8 and val["val_scored"] == 3 / 4
    assert _validation(tmp_path, [None] * 4, rewards, 0.0) == pytest.approx(
        {"val_reward": sum(rewards) / 4, "val_answer": sum(rewards) / 4, "val_format_valid": 1.0,
         "val_env_error_rate": 0.0, "val_scored": 1.0})


class _DyingEnv:
    """The configured in-process environment, down once the file `flag` exists: every call then
    fails as a refused connection would (after the client's retries)."""

    def __init__(self, env_cfg, flag: str):
        from prompt_r1.env.inprocess import InProcessEnvironment

        self.inner, self.flag = InProcessEnvironment(env_cfg), flag
        self.name, self.model, self.cfg = env_cfg.name, env_cfg.model, env_cfg

    async def reply(self, messages, turn=0):
        import time

        if Path(self.flag).exists():
            return self.inner.failed(turn, "connection refused (environment down)", time.perf_counter(), attempts=1)
        return await self.inner.reply(messages, turn=turn)

    async def aclose(self):
        await self.inner.aclose()


def _session_whose_environment_dies_after_training(flag: Path):
    """`TrainingSession` whose rollout actors talk to a `_DyingEnv` that goes down right after the
    last update is recorded, i.e. just before the final validation."""
    from functools import partial

    import ray

    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool
    from prompt_r1.training.session import TrainingSession

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors build _DyingEnv

    class Session(TrainingSession):
        def _start_pool(self):
            init_ray(self.cfg.rollout)
            cfg = self.actor_cfg
            factory = partial(_DyingEnv, flag=str(flag))
            return self._stack.enter_context(RolloutPool(cfg, self.model_path, 1, env_factory=factory))

        def finish_step(self, trajectories):
            super().finish_step(trajectories)
            if self.step == self.cfg.train.steps:
                flag.touch()

    return Session


def test_a_run_whose_final_validation_fails_stops_and_exports_no_agent(home, tmp_path):
    """The environment dies after the last update: the final validation does not score the agent 0,
    it stops the run (exit 3 from the CLI) before the last checkpoint, and no agent is exported."""
    import ray

    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.learner.checkpoint import step_dir_name
    from prompt_r1.training.hooks import TrainingHooks

    cfg = load_config(ROOT / "configs" / "smoke.yaml")
    validations: list[tuple[int, dict]] = []

    class Hooks(TrainingHooks):
        def on_validation(self, updates_done, metrics):
            validations.append((updates_done, metrics))

    Session = _session_whose_environment_dies_after_training(tmp_path / "env-down")
    try:
        with Warehouse(home / "warehouse.duckdb") as wh:
            ingest(wh, [ROOT / "data" / "sample"])
            with Session(cfg, wh, "dies", home / "smoke" / "dies") as session:
                with pytest.raises(EnvironmentFailure) as info:
                    session.run(Hooks(cfg.train.steps))
            assert wh.steps_recorded("dies") == [0, 1]  # training itself went through
    finally:
        ray.shutdown()
    flat = str(info.value)
    assert "environment `tiny-env`" in flat and "validation after 2 update(s)" in flat
    assert flat.endswith("first error: connection refused (environment down)")
    assert [n for n, _ in validations] == [0] and "val_reward" in validations[0][1]  # no score after training
    assert not (home / "smoke" / "dies" / "agent").exists()
    assert [p.name for p in (home / "smoke" / "dies" / "checkpoints").glob("step-*")] == [step_dir_name(1)]


@pytest.mark.slow
def test_train_flow_whose_final_validation_fails_registers_nothing(home, tmp_path, monkeypatch):
    """The issue's case under Prefect and MLflow: the environment dies before the final validation;
    the flow run fails (exit 3 from `run-flow`), the MLflow run is FAILED and tagged `env_failure`,
    and no agent is registered or made champion."""
    import mlflow
    import ray
    from mlflow import MlflowClient
    from prefect.testing.utilities import prefect_test_harness

    import flows.train
    from prompt_r1.config.experiment import load_config
    from tasks.tracking.runs import tracking_uri

    monkeypatch.setattr(flows.train, "TrainingSession", _session_whose_environment_dies_after_training(
        tmp_path / "env-down"))
    try:
        with prefect_test_harness(server_startup_timeout=180):
            with pytest.raises(EnvironmentFailure, match="validation after 2 update"):
                flows.train.train_flow("configs/smoke.yaml", resume=False)
    finally:
        ray.shutdown()
    mlflow.set_tracking_uri(tracking_uri())
    client = MlflowClient(tracking_uri=tracking_uri(), registry_uri=tracking_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("smoke").experiment_id], "tags.flow = 'train'")
    assert run.info.status == "FAILED" and "validation after 2 update" in run.data.tags["env_failure"]
    assert "registered_version" not in run.data.tags
    model = load_config("configs/smoke.yaml").registered_model()  # the config's own registered model
    assert client.search_model_versions(f"name = '{model}'") == []


def test_registration_refuses_a_validation_that_scored_nothing():
    from tasks.stages import registration_score

    assert registration_score({"val_reward": 0.0, "val_scored": 1.0}, True) == 0.0  # a real 0 is a score
    assert registration_score({}, False) is None  # no validation questions: registered unscored
    for missing in ({}, {"val_env_error_rate": 1.0}, {"val_reward": float("nan")}):
        with pytest.raises(ValueError, match="refusing to register"):
            registration_score(missing, True)


# -- evaluation rows and means --------------------------------------------------------------------
def test_failed_predictions_are_not_scored_and_means_skip_them():
    rng = random.Random(2)
    qs = [QuestionRow(f"q{i}", "nq", "test", f"q {i}?", ["Paris"], "standard_qa", "em") for i in range(20)]
    preds = [Prediction(q, "direct", rng.choice(["Paris", "London"]), 1, 5, 3,
                        error=rng.choice([None, None, "HTTP 429: slow down"])) for q in qs]
    rows = score_predictions(preds)
    for p, r in zip(preds, rows):
        if p.error:
            assert r["error"] == p.error and all(r[m] is None for m in METRICS)
        else:
            assert r["error"] is None and r["em"] == (1.0 if p.text == "Paris" else 0.0) == r["score"]
    for r in rows:
        r["env_name"] = "e"
    (cell,) = aggregate(rows, EnvConfig())
    ok = [p for p in preds if not p.error]
    assert cell["n"] == 20 and cell["errors"] == 20 - len(ok)
    assert cell["score"] == pytest.approx(sum(p.text == "Paris" for p in ok) / len(ok))
    everything_failed = [dict(r, error="x", **dict.fromkeys(METRICS)) for r in rows]
    assert all(aggregate(everything_failed, EnvConfig())[0][m] is None for m in METRICS)


def test_warehouse_keeps_errors_and_null_scores_and_upgrades_an_old_file(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))  # the tables as they were before errors were recorded
    con.execute("CREATE TABLE eval_predictions (run_id VARCHAR NOT NULL, env_name VARCHAR NOT NULL, method VARCHAR "
                "NOT NULL, dataset VARCHAR NOT NULL, question_id VARCHAR NOT NULL, prediction VARCHAR NOT NULL, "
                "primary_metric VARCHAR NOT NULL, score DOUBLE NOT NULL, em DOUBLE NOT NULL, f1 DOUBLE NOT NULL, "
                "substring DOUBLE NOT NULL, ssim DOUBLE NOT NULL, num_turns INTEGER NOT NULL, env_prompt_tokens "
                "INTEGER NOT NULL, env_completion_tokens INTEGER NOT NULL, created_at TIMESTAMP NOT NULL, "
                "PRIMARY KEY (run_id, env_name, method, dataset, question_id))")
    con.close()
    q = QuestionRow("q1", "nq", "test", "q?", ["Paris"], "standard_qa", "em")
    rows = score_predictions([Prediction(q, "direct", "Paris"), Prediction(QuestionRow(
        "q2", "nq", "test", "q2?", ["Rome"], "standard_qa", "em"), "direct", "", error="timeout after 5s")])
    for r in rows:
        r["env_name"] = "e"
    with Warehouse(path) as wh:
        wh.write_eval("run", rows, aggregate(rows, EnvConfig()))
        got = wh.query("SELECT question_id, score, error FROM eval_predictions ORDER BY question_id")
        assert got == [("q1", 1.0, None), ("q2", None, "timeout after 5s")]
        assert wh.query("SELECT n, errors, score FROM eval_results") == [(2, 1, 1.0)]
        failed = Trajectory("q2", 0, [1], token_ids=[2], loss_mask=[1], logprobs=[0.0], agent_turns=["a"],
                            env_calls=[EnvCall(0, "e", "m", error="HTTP 500")], stop_reason="env_error",
                            error="HTTP 500")
        from prompt_r1.training.batch_stats import trajectory_rows

        wh.replace_step("run", 0, *trajectory_rows([failed]))
        assert wh.query("SELECT reward_total, error, stop_reason FROM trajectories") == [(None, "HTTP 500", "env_error")]
        assert wh.query("SELECT error FROM env_calls") == [("HTTP 500",)]


# -- the CLI against a dead endpoint ---------------------------------------------------------------
def _dead_env_args(port: int) -> list[str]:
    return ["--set", "environment.kind=openai", "--set", f"environment.base_url=http://127.0.0.1:{port}/v1",
            "--set", "environment.model=nobody-home", "--set", "environment.max_retries=1",
            "--set", "environment.backoff_s=0.05", "--set", "environment.timeout_s=5"]


def test_evaluate_against_a_dead_endpoint_exits_3_naming_it(home):
    from prompt_r1.cli import app

    port = closed_port()
    result = CliRunner().invoke(app, ["evaluate", "-c", "configs/smoke.yaml", "--run-id", "dead",
                                      "--set", 'eval.methods=["direct","cot"]', *_dead_env_args(port)])
    assert result.exit_code == 3, result.output
    flat = " ".join(result.output.split())
    assert "environment `tiny-env`" in flat and "first error:" in flat
    assert "onnect" in flat  # the connection error itself, not a generic message
    with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
        rows = wh.query("SELECT error, score, prediction FROM eval_predictions WHERE run_id = 'dead'")
        assert rows and all(e and s is None and p == "" for e, s, p in rows)
        assert wh.query("SELECT SUM(errors), SUM(n), COUNT(score) FROM eval_results WHERE run_id = 'dead'") == \
            [(len(rows), len(rows), 0)]


def test_train_against_a_dead_endpoint_exits_3_without_an_agent(home):
    """A training step against a dead endpoint. Validation is off: with it, the untrained agent's
    validation would meet the dead endpoint first and stop the run there (tested above)."""
    port = closed_port()
    proc = subprocess.run([sys.executable, "-m", "prompt_r1.cli", "train", "-c", "configs/smoke.yaml",
                           "--run-id", "dead", "--set", "data.validation_fraction=0", *_dead_env_args(port)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 3, out[-3000:]
    failed_step = re.search(r"environment `tiny-env`: \d+ of \d+ calls failed in training step (\d+)", out)
    assert failed_step and "first error:" in out, out[-3000:]
    # the tiny agent may answer a whole step without a call: steps before the failing one (and
    # their checkpoints) are real; nothing of the failing step is kept and no agent is exported
    run_folder = home / "smoke" / "dead"
    assert not (run_folder / "agent").exists()
    assert all(int(p.name.split("-")[1]) <= int(failed_step.group(1)) for p in run_folder.glob("checkpoints/step-*"))
    with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
        calls = wh.query("SELECT error FROM env_calls WHERE run_id = 'dead'")
        assert calls and all(e for (e,) in calls)
        trajs = wh.query("SELECT stop_reason, reward_total, error FROM trajectories WHERE run_id = 'dead'")
        assert all(r is None and e for s, r, e in trajs if s == "env_error")


# -- chaos: the smoke training and evaluation through a fault-injecting proxy ------------------------
def _chaos_args(url: str, retries: int, max_rate: float) -> list[str]:
    return ["--set", "environment.kind=openai", "--set", f"environment.base_url={url}",
            "--set", "environment.model=smollm2-135m-instruct", "--set", "environment.cache=false",
            "--set", f"environment.max_retries={retries}", "--set", "environment.backoff_s=0.05",
            "--set", "environment.timeout_s=20", "--set", "environment.call_deadline_s=600",
            "--set", f"environment.max_error_rate={max_rate}", "--set", "data.validation_fraction=0",
            "--set", "environment.max_tokens=16"]


# Enough trajectories per step that the tiny agent's occasional interaction prompts add up to a few
# environment calls a step: the fault draws are then not all clean by chance.
_TRAIN_SIZE = ["--set", "rollout.batch_questions=8", "--set", "rollout.group_size=4",
               "--set", "train.mini_batch_questions=8", "--set", "train.micro_batch_size=8"]


def _cli(home: Path, *args: str) -> tuple[int, str]:
    import os

    proc = subprocess.run([sys.executable, "-m", "prompt_r1.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PROMPT_R1_HOME": str(home)})
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def _check_recorded(wh: Warehouse, run_id: str, marker: str) -> tuple[int, int]:
    """Every call succeeded or has an error; no fault text reached a context or a score.
    Returns (attempts recorded, failed calls)."""
    from transformers import AutoTokenizer

    from prompt_r1.models.bundled import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-protocol"))
    calls = wh.query("SELECT error, attempts, completion_tokens FROM env_calls WHERE run_id = ?", [run_id])
    assert calls and all(a >= 1 for _, a, _ in calls)  # no cache: every call made a request
    assert all(n == 0 for e, _, n in calls if e)  # a failed call produced no reply
    for ids, replies, reward, error, stop in wh.query(
            "SELECT token_ids, env_replies, reward_total, error, stop_reason FROM trajectories WHERE run_id = ?", [run_id]):
        assert marker not in tok.decode(ids) and "environment error" not in tok.decode(ids)
        assert all(marker not in r for r in replies)
        assert (error is not None) == (stop == "env_error") == (reward is None)
    return sum(a for _, a, _ in calls), sum(1 for e, _, _ in calls if e)


@pytest.mark.slow
def test_chaos_training_and_evaluation_through_a_faulty_proxy(home, smollm2_path):
    from chaos_proxy import MARKER, ChaosProxy
    from prompt_r1.env.vllm_server import managed_vllm_server

    server_cfg = EnvConfig(name="smollm2", kind="vllm", model="smollm2-135m-instruct", max_tokens=16)
    with managed_vllm_server(server_cfg, home / "logs") as upstream, \
            ChaosProxy(upstream, rate=0.10, seed=7, hang_s=25.0) as proxy:
        # 10% of requests faulted, 4 retries: every call ends well; each fault costs one recorded attempt.
        start = start10 = len(proxy.log)
        rc, out = _cli(home, "train", "-c", "configs/smoke.yaml", "--run-id", "chaos10", *_TRAIN_SIZE,
                       *_chaos_args(proxy.base_url, retries=4, max_rate=0.05))
        assert rc == 0, out[-3000:]
        chat = [r for r in proxy.log[start:] if r["path"].endswith("/chat/completions")]
        with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
            attempts, failed = _check_recorded(wh, "chaos10", MARKER)
            assert attempts == len(chat), "every request the proxy saw is an attempt the client recorded"
            assert wh.steps_recorded("chaos10") == [0, 1]
            per_step = wh.query("SELECT step, COUNT(*) FROM trajectories WHERE run_id='chaos10' GROUP BY 1 ORDER BY 1")
            assert [n for _, n in per_step] == [32, 32]
        assert (home / "smoke" / "chaos10" / "agent" / "config.json").exists()

        rc, out = _cli(home, "evaluate", "-c", "configs/smoke.yaml", "--run-id", "eval10",
                       "--set", 'eval.methods=["direct","cot"]', *_chaos_args(proxy.base_url, 4, 0.05))
        assert rc == 0, out[-3000:]
        with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
            assert wh.query("SELECT COUNT(*) FROM eval_predictions WHERE run_id = 'eval10' AND error IS NOT NULL") \
                == [(0,)], "with retries every faulted call at 10% recovers"
        # Training alone makes few calls (a 10% draw may fault none of them); with evaluation it may not.
        assert proxy.faults_injected(start10), "the proxy should have injected faults at 10%"

        # 30% faulted and no retries: about 30% of calls fail, far past 5%: training stops at step 0.
        proxy.set_rate(0.30, seed=11)
        start = len(proxy.log)
        rc, out = _cli(home, "train", "-c", "configs/smoke.yaml", "--run-id", "chaos30", *_TRAIN_SIZE,
                       *_chaos_args(proxy.base_url, retries=0, max_rate=0.05))
        assert rc == 3, out[-3000:]
        assert "environment `tiny-env`" in out and "training step 0" in out and "first error:" in out
        assert not (home / "smoke" / "chaos30" / "agent").exists()
        injected = proxy.faults_injected(start)
        with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
            attempts, failed = _check_recorded(wh, "chaos30", MARKER)
            assert failed == sum(injected.values()) > 0, "each injected fault is exactly one failed call"

        # 30% faulted, no retries, evaluation: rows are written with errors, then exit 3.
        rc, out = _cli(home, "evaluate", "-c", "configs/smoke.yaml", "--run-id", "eval30",
                       "--set", 'eval.methods=["direct","cot"]', *_chaos_args(proxy.base_url, 0, 0.05))
        assert rc == 3 and "environment `tiny-env`" in out, out[-3000:]
        with Warehouse(home / "warehouse.duckdb", read_only=True) as wh:
            rows = wh.query("SELECT prediction, score, error FROM eval_predictions WHERE run_id = 'eval30'")
            assert any(e for _, _, e in rows) and any(e is None for _, _, e in rows)
            for prediction, score, error in rows:
                assert MARKER not in prediction
                assert (error is None) == (score is not None)
            for ((n, errors, scored),) in [wh.query(
                    "SELECT SUM(n), SUM(errors), (SELECT COUNT(score) FROM eval_predictions WHERE run_id='eval30') "
                    "FROM eval_results WHERE run_id = 'eval30'")]:
                assert n == len(rows) and errors == len(rows) - scored
