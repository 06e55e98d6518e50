"""Ray rollout pool: a local 2-CPU Ray instance, two actors, weight broadcast, and the CLI command."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from prompt_r1.config import load_config
from warehouse.store import QuestionRow

ray = pytest.importorskip("ray")


def questions(n: int) -> list[QuestionRow]:
    texts = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs has a spider?",
             "What colour is the sky?", "Which planet is largest?"]
    return [QuestionRow(f"q{i}", "sample", "train", texts[i % len(texts)], ["x"], "standard_qa", "f1")
            for i in range(n)]


class EchoModelEnv:
    """A real transformers environment (the tiny model, greedy), built inside each actor."""

    def __init__(self, env_cfg):
        from prompt_r1.models import resolve_model
        from prompt_r1.policy.hf import TransformersPolicy

        self.name, self.model = env_cfg.name, env_cfg.model
        self.policy = TransformersPolicy(resolve_model(env_cfg.model), temperature=0.0)
        self.max_tokens = env_cfg.max_tokens

    async def reply(self, messages, turn=0):
        from types import SimpleNamespace

        from prompt_r1.trajectory import EnvCall

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


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    from prompt_r1.config import RolloutConfig
    from prompt_r1.ray_rollout import init_ray

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
    from prompt_r1.ray_rollout import RolloutPool

    cfg = smoke_cfg()
    batch = questions(3)
    with RolloutPool(cfg, tiny_model_path, 2, env_factory=env_factory()) as pool:
        assert len({ray.get(w.ping.remote()) for w in pool.workers}) == 2
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
        state = {k: v + 0.5 * torch.randn_like(v)
                 for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict().items()}
        pool.broadcast(state)
        after = pool.rollout(batch, step=0)
        assert len(after) == len(first)
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
        assert set(r["reward"]) == {"format", "answer", "total"}
    with Warehouse(db) as wh:
        rows = wh.query("SELECT COUNT(*), MIN(step), MAX(step) FROM trajectories WHERE run_id = 'cli-test'")[0]
        assert rows == (len(records), 0, 0)
        calls = wh.query("SELECT COUNT(*) FROM env_calls WHERE run_id = 'cli-test'")[0][0]
        assert calls == sum(len(r["env_calls"]) for r in records)
