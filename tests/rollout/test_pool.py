"""Ray rollout pool: a local 2-CPU Ray instance, two actors, weight broadcast, and the CLI command."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from prompt_r1.config.experiment import load_config
from prompt_r1.core.questions import QuestionRow

ray = pytest.importorskip("ray")


def questions(n: int) -> list[QuestionRow]:
    texts = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs has a spider?",
             "What colour is the sky?", "Which planet is largest?"]
    return [QuestionRow(f"q{i}", "sample", "train", texts[i % len(texts)], ["x"], "standard_qa", "f1")
            for i in range(n)]


class EchoModelEnv:
    """A real transformers environment (the tiny model, greedy), built inside each actor."""

    def __init__(self, env_cfg):
        from prompt_r1.models.bundled import resolve_model
        from prompt_r1.policy.hf import TransformersPolicy

        self.name, self.model = env_cfg.name, env_cfg.model
        self.policy = TransformersPolicy(resolve_model(env_cfg.model), temperature=0.0)
        self.max_tokens = env_cfg.max_tokens

    async def reply(self, messages, turn=0):
        from types import SimpleNamespace

        from prompt_r1.core.trajectory import EnvCall

        tok = self.policy.tokenizer
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)
        sample = self.policy.generate([ids], self.max_tokens)[0]
        return SimpleNamespace(text=sample.text, call=EnvCall(turn, self.name, self.model, len(ids),
                                                              len(sample.token_ids)))

    async def aclose(self):
        pass


def env_factory():
    """The real `open_environment` once prompt_r1.env exists; else the test-local model env."""
    try:
        from prompt_r1.env import open_environment  # noqa: F401
    except ImportError:
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        return EchoModelEnv
    return None


def test_an_unreachable_ray_address_fails_fast_with_a_message():
    import socket
    import time

    from prompt_r1.config.experiment import RolloutConfig
    from prompt_r1.cluster.connect import RayWaitError, init_ray

    if ray.is_initialized():
        ray.shutdown()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    started = time.monotonic()
    with pytest.raises(RayWaitError) as caught:
        init_ray(RolloutConfig(ray_address=f"127.0.0.1:{port}", ray_connect_timeout_s=3))
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "rollout.ray_address" in message and "refused" in message.lower()
    assert not ray.is_initialized()


def test_an_address_that_is_no_ray_cluster_fails_within_the_deadline(tmp_path):
    """A port that accepts connections but never answers: `ray.init` alone retries for minutes."""
    import subprocess
    import sys

    code = """
import socket, time
from prompt_r1.config.experiment import RolloutConfig
from prompt_r1.cluster.connect import RayWaitError, init_ray
silent = socket.create_server(("0.0.0.0", 0), backlog=64)
started = time.monotonic()
try:
    init_ray(RolloutConfig(ray_address=f"127.0.0.1:{silent.getsockname()[1]}", ray_connect_timeout_s=4))
except RayWaitError as err:
    print(f"took {time.monotonic() - started:.1f}: {err}", flush=True)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("took "), result.stdout + result.stderr[-3000:]
    assert float(result.stdout.split()[1].rstrip(":")) < 6
    assert "did not answer as a Ray cluster within 4s" in result.stdout and "ray_connect_timeout_s" in result.stdout


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    from prompt_r1.config.experiment import RolloutConfig
    from prompt_r1.cluster.connect import init_ray

    init_ray(RolloutConfig(ray_num_cpus=2))
    yield
    ray.shutdown()


def smoke_cfg(**overrides):
    cfg = load_config("configs/smoke.yaml")
    return cfg.model_copy(update={
        "agent": cfg.agent.model_copy(update={"model": "tiny", "temperature": 0.0, **overrides}),
        "rollout": cfg.rollout.model_copy(update={"group_size": 2, "num_workers": 2}),
    })


def test_pool_of_two_actors_and_weight_broadcast(local_ray, tiny_model_path, home):
    from prompt_r1.rollout.pool import RolloutPool

    cfg = smoke_cfg()
    batch = questions(3)
    with RolloutPool(cfg, tiny_model_path, 2, env_factory=env_factory()) as pool:
        assert len({ray.get(w.ping.remote()) for w in pool.engines.actors}) == 2
        first = pool.rollout(batch, step=0)
        assert [(t.question_id, t.group_index) for t in first] == [(f"q{i}", g) for i in range(3) for g in range(2)]
        for t in first:
            assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) > 0 and t.reward is not None
        again = pool.rollout(batch, step=0)
        assert [t.token_ids for t in again] == [t.token_ids for t in first]  # greedy, same weights
        greedy_single = pool.rollout(batch[:1], step=1, greedy=True, group_size=1)
        assert len(greedy_single) == 1

        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        with torch.no_grad():  # per parameter, so tied copies (lm_head = embeddings) stay equal, as a learner's do
            for param in model.parameters():
                param.add_(0.5 * torch.randn_like(param))
        state = model.state_dict()
        from prompt_r1.core.weights import WeightUpdate

        update = WeightUpdate.make(1, "full", state)
        assert pool.broadcast(update) == [{"version": 1, "checksum": update.checksum}] * 2
        after = pool.rollout(batch, step=0)
        assert len(after) == len(first)
        assert {t.policy_version for t in first} == {0} and {t.policy_version for t in after} == {1}
        changed = [a.token_ids != b.token_ids for a, b in zip(after, first)]
        assert changed[0] and changed[-1]  # both actors took the new weights


def test_cli_rollout_writes_jsonl_and_warehouse(local_ray, home, tmp_path):
    if not hasattr(pytest.importorskip("prompt_r1.env"), "open_environment"):
        pytest.skip("prompt_r1.env.open_environment has not landed yet")
    from typer.testing import CliRunner

    from prompt_r1.cli import app
    from warehouse.store import Warehouse

    out, db = tmp_path / "trajectories.jsonl", tmp_path / "wh.duckdb"
    result = CliRunner().invoke(app, ["rollout", "--config", "configs/smoke.yaml", "--out", str(out), "--db", str(db),
                                      "--workers", "2", "--run-id", "cli-test",
                                      "--set", "agent.model=tiny"])  # skip the warm-started model build
    assert result.exit_code == 0, result.output
    assert "mean reward" in result.output and "stop reasons" in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    cfg = load_config("configs/smoke.yaml")
    assert len(records) == cfg.rollout.batch_questions * cfg.rollout.group_size
    for r in records:
        assert {"question_id", "token_ids", "loss_mask", "logprobs", "agent_turns", "env_replies", "answer",
                "reward", "env_calls", "stop_reason"} <= set(r)
        assert set(r["reward"]) == {"format", "answer", "total", "cost"}
    with Warehouse(db) as wh:
        rows = wh.query("SELECT COUNT(*), MIN(step), MAX(step) FROM trajectories WHERE run_id = 'cli-test'")[0]
        assert rows == (len(records), 0, 0)
        calls = wh.query("SELECT COUNT(*) FROM env_calls WHERE run_id = 'cli-test'")[0][0]
        assert calls == sum(len(r["env_calls"]) for r in records)
        from prompt_r1.data.pool import TrainingPool  # the questions a training run's pool starts with

        first = [q.question_id for q in TrainingPool.load(wh, cfg).train[: cfg.rollout.batch_questions]]
    assert list(dict.fromkeys(r["question_id"] for r in records)) == first


def test_a_pool_bigger_than_the_local_ray_fails_at_once(local_ray, tiny_model_path):
    import time

    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.rollout.pool import RolloutPool

    started = time.monotonic()
    with pytest.raises(RayWaitError, match=r"3 actors x 1 CPUs = 3 CPUs, but the local Ray instance has 2 CPUs"):
        RolloutPool(smoke_cfg(), tiny_model_path, 3)
    assert time.monotonic() - started < 5


def test_actors_that_cannot_start_fail_within_the_deadline_and_free_their_claim(local_ray, tiny_model_path):
    import time

    from prompt_r1.cluster.placement import PlacementError
    from prompt_r1.rollout.pool import RolloutPool

    @ray.remote(num_cpus=2)
    class Holder:  # another job holding every CPU of the local instance
        def ping(self):
            return True

    holder = Holder.remote()
    ray.get(holder.ping.remote(), timeout=60)
    cfg = smoke_cfg()
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"actor_start_timeout_s": 3.0})})
    started = time.monotonic()
    try:
        with pytest.raises(PlacementError) as caught:
            RolloutPool(cfg, tiny_model_path, 1)
        assert time.monotonic() - started < 10
    finally:
        ray.kill(holder)
    message = str(caught.value)
    assert "within 3s (rollout.actor_start_timeout_s)" in message and "{CPU: 0} free of {CPU: 2}" in message
    assert "missing: 1 CPU" in message and "rollout.num_workers" in message
    deadline = time.monotonic() + 30  # the pending group was removed: it never takes a CPU
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    assert ray.available_resources().get("CPU", 0) == 2


def hanging_rollouts(env_cfg):
    """Inside the actor: every rollout batch hangs (as on an environment that stopped answering)."""
    import asyncio

    import prompt_r1.rollout.episode

    async def hang(*args, **kwargs):
        await asyncio.sleep(120)

    prompt_r1.rollout.episode.rollout_batch = hang
    return EchoModelEnv.__new__(EchoModelEnv)


def test_a_stuck_rollout_fails_within_the_deadline(local_ray, tiny_model_path):
    import time

    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.rollout.pool import RolloutPool

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = smoke_cfg()
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"rollout_timeout_s": 3.0})})
    with RolloutPool(cfg, tiny_model_path, 1, env_factory=hanging_rollouts) as pool:
        started = time.monotonic()
        with pytest.raises(RayWaitError, match=r"rolling out 2 questions on 1 actors did not finish within 3s"):
            pool.rollout(questions(2), step=0)
        assert time.monotonic() - started < 8
        closing = time.monotonic()
    assert time.monotonic() - closing < 10  # the stuck actor is killed, not asked to clean up behind its queue


def test_training_session_stops_what_it_started_when_a_later_stage_fails(local_ray, warehouse, tmp_path,
                                                                         monkeypatch):
    from prompt_r1.data.ingest import ingest
    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.training.session import TrainingSession

    ingest(warehouse, ["data/sample"])
    stopped = []
    start_environment = TrainingSession._start_environments

    def tracked(self):
        self._stack.callback(stopped.append, "environment")
        return start_environment(self)

    def pool_that_cannot_start(self):  # the stage after the environment fails (as actors that never start)
        raise RayWaitError("starting the rollout actors (3 actors) did not finish within 1s")

    monkeypatch.setattr(TrainingSession, "_start_environments", tracked)
    monkeypatch.setattr(TrainingSession, "_start_pool", pool_that_cannot_start)
    with pytest.raises(RayWaitError, match="3 actors"):
        with TrainingSession(smoke_cfg(temperature=1.0), warehouse, "cleanup-test", tmp_path / "run"):
            pass
    assert stopped == ["environment"]


def test_sigterm_after_ray_started_runs_the_python_cleanup(home, tiny_model_path):
    """`ray.init` takes SIGTERM over (its C++ driver then dies with SIGABRT and a stack dump, and no
    `finally` runs); `init_ray` hands it back, so SIGTERM stops `prompt-r1 rollout` as Ctrl-C does:
    the rollout actors are stopped by the pool's own clean-up and Ray's processes go with the driver."""
    import os
    import signal
    import subprocess
    import threading
    import time
    from pathlib import Path

    psutil = pytest.importorskip("psutil")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "prompt_r1.cli", "rollout", "-c", "configs/smoke.yaml", "--run-id", "sigterm",
         "--set", "agent.model=tiny"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(root)}, start_new_session=True)
    lines: list[str] = []
    ray_up = threading.Event()  # the actors are starting: the driver waits in `ray.get`

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "rollout pool: 1 actor(s) starting" in line:
                ray_up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ray_up.wait(300), "".join(lines)[-3000:]
        ray_processes = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in ray_processes), [p.name() for p in ray_processes]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(180)
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    output = "".join(lines)
    assert code != -signal.SIGABRT and "SIGTERM received" not in output, output[-3000:]
    assert code == 130, output[-3000:]  # what Ctrl-C (KeyboardInterrupt) gives under typer
    assert "rollout pool: 1 actor(s) stopped" in output, output[-3000:]  # RolloutPool's clean-up ran
    _, alive = psutil.wait_procs(ray_processes, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]


def test_training_session_refuses_more_actors_than_local_cpus_before_loading_a_model(warehouse, tmp_path,
                                                                                     monkeypatch):
    from prompt_r1.data.ingest import ingest
    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.learner import grpo_learner
    from prompt_r1.training import session

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the CPU check")

    ingest(warehouse, ["data/sample"])
    monkeypatch.setattr(grpo_learner, "GRPOLearner", no_model)
    cfg = smoke_cfg(temperature=1.0)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"num_workers": 3, "ray_num_cpus": 2})})
    with pytest.raises(RayWaitError, match=r"3 actors x 1 CPUs = 3 CPUs, but the local Ray instance has 2 CPUs"
                                           r".*lower rollout.num_workers"):
        with session.TrainingSession(cfg, warehouse, "cpus", tmp_path / "run"):
            pass
