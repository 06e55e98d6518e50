"""The colocated layout (`rollout.colocate`): engines on the learner's GPUs, asleep during each update.

What can be checked without a GPU is checked here: the settings that refuse it (asynchronous
rollouts, more engines than learner GPUs), the vLLM engine's arguments and its sleep / wake calls
(a stand-in for `vllm.LLM` records them while the real `VLLMPolicy` runs), where Ray puts a
colocated engine (fake GPUs: it lands on its learner rank's node and sees that rank's GPU while
holding none of Ray's), and the order of sleep, update, wake and weight sync in a real training
run on CPU (a spy that records while the real code runs). vLLM's sleep mode itself needs CUDA
and is not exercised here (docs/scale.md says what has been measured on a GPU).
"""

from __future__ import annotations

import sys
import types

import pytest

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import load_config, parse_config


# -- settings ------------------------------------------------------------------------------------
def test_colocate_refuses_asynchronous_rollouts():
    with pytest.raises(ConfigError, match=r"rollout.colocate with rollout.max_staleness=1.*max_staleness to 0"):
        load_config("configs/smoke.yaml", {"rollout.colocate": True, "rollout.max_staleness": 1})


def test_colocate_needs_a_learner_gpu_per_engine_gpu():
    vllm = {"rollout.colocate": True, "agent.backend": "vllm"}
    cfg = load_config("configs/smoke.yaml", {**vllm, "rollout.num_workers": 2})
    assert any("rollout.colocate: 2 engine(s)" in p and "train.world_size is 1" in p for p in cfg.training_problems())
    assert not load_config("configs/smoke.yaml", vllm).training_problems()
    # the transformers backend samples on CPU: colocation changes nothing, so nothing is refused
    transformers = load_config("configs/smoke.yaml", {"rollout.colocate": True, "rollout.num_workers": 2})
    assert not transformers.training_problems()


def test_the_one_gpu_recipe_is_the_papers_agent_with_lora_colocated():
    one, paper = load_config("configs/one-gpu.yaml"), load_config("configs/paper.yaml")
    assert one.agent.model == paper.agent.model and one.agent.backend == "vllm" and one.agent.lora.enabled
    assert one.rollout.colocate and one.train.world_size == 1 and one.rollout.num_workers == 1
    assert not one.training_problems()


# -- the engine's arguments, and sleep / wake ----------------------------------------------------
class FakeLLM:
    """Stands in for `vllm.LLM`: records its arguments and the calls made on it."""

    made: list["FakeLLM"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        FakeLLM.made.append(self)

    def get_tokenizer(self):
        return None

    def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        return True


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    import torch

    FakeLLM.made = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import prompt_r1.policy.vllm_policy as vllm_policy

    monkeypatch.setattr(vllm_policy, "model_kv_cache_bytes", lambda *a: 2**20)

    def on(gpu: bool):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
        return FakeLLM.made

    return on


def test_on_gpu_the_engine_takes_the_configured_share_with_cuda_graphs_and_sleep_mode(fake_vllm):
    from prompt_r1.config.experiment import AgentConfig
    from prompt_r1.policy import make_policy

    made = fake_vllm(gpu=True)
    policy = make_policy(AgentConfig(backend="vllm", vllm_gpu_memory_utilization=0.55), "/nowhere", sleep_mode=True)
    kwargs = made[-1].kwargs
    assert kwargs["gpu_memory_utilization"] == 0.55 and kwargs["enforce_eager"] is False
    assert kwargs["enable_sleep_mode"] is True and "kv_cache_memory_bytes" not in kwargs
    policy.sleep()
    policy.sleep()  # once: a second sleep is not sent to vLLM
    policy.wake_up()
    policy.wake_up()
    assert made[-1].calls == [("sleep", 1), ("wake_up", None)]
    make_policy(AgentConfig(backend="vllm", enforce_eager=True), "/nowhere")
    assert made[-1].kwargs["enforce_eager"] is True and "enable_sleep_mode" not in made[-1].kwargs
    assert made[-1].kwargs["gpu_memory_utilization"] == 0.9  # the key's default: an engine with a GPU of its own


def test_on_cpu_the_engine_stays_eager_with_an_absolute_kv_cache_and_never_sleeps(fake_vllm):
    from prompt_r1.config.experiment import AgentConfig
    from prompt_r1.policy import make_policy

    made = fake_vllm(gpu=False)
    policy = make_policy(AgentConfig(backend="vllm"), "/nowhere", sleep_mode=True)
    kwargs = made[-1].kwargs
    assert kwargs["enforce_eager"] is True and kwargs["kv_cache_memory_bytes"] == 2**20
    assert "enable_sleep_mode" not in kwargs and "gpu_memory_utilization" not in kwargs
    policy.sleep()
    policy.wake_up()
    assert made[-1].calls == []  # vLLM has no sleep mode on CPU


def test_evaluation_engines_in_one_process_split_the_share(monkeypatch):
    """`EvalAgents` builds its agents' engines in the driver, on one GPU: each gets its part of
    `agent.vllm_gpu_memory_utilization`, less a managed environment server's share."""
    import prompt_r1.policy as policy_module
    from prompt_r1.evaluation.evaluate import EvalAgents

    shares = []
    monkeypatch.setattr(policy_module, "make_policy", lambda agent, path, seed=0: (
        shares.append(agent.vllm_gpu_memory_utilization), types.SimpleNamespace(close=lambda: None))[1])
    cfg = parse_config({"agent": {"backend": "vllm", "vllm_gpu_memory_utilization": 0.8},
                        "eval": {"agent_placement": "driver"}})
    with EvalAgents(cfg, {"base": "/a", "trained": "/b"}) as agents:
        assert len(agents.policies) == 2 and shares == [0.4, 0.4]
    shares.clear()
    served = parse_config({"agent": {"backend": "vllm"}, "eval": {"agent_placement": "driver"},
                           "environment": {"kind": "vllm", "gpu_memory_utilization": 0.3}})
    with EvalAgents(served, {"base": "/a", "trained": "/b"}) as agents:
        assert len(agents.policies) == 2 and shares == [0.3, 0.3]  # (0.9 - 0.3) / 2


# -- where Ray puts a colocated engine (fake GPUs) -----------------------------------------------
@pytest.fixture
def fake_gpu_ray():
    """A local Ray with two fake GPUs for one test (shut down after it: a later training run in this
    module must not find GPUs and move its learner into Ray)."""
    ray = pytest.importorskip("ray")
    from ray_helpers import init_fake_gpu_ray

    init_fake_gpu_ray(num_cpus=4, num_gpus=2)
    yield ray
    ray.shutdown()


def test_a_colocated_engine_lands_beside_its_learner_rank_and_sees_its_gpu(fake_gpu_ray):
    ray = fake_gpu_ray
    from prompt_r1.cluster.engine_placement import (actor_location, actor_options, place_colocated,
                                                    shared_gpus)
    from prompt_r1.cluster.placement import in_group, release, reserve

    @ray.remote
    class Probe:
        def where(self):
            return actor_location()

    cfg = parse_config({"agent": {"backend": "vllm"}, "rollout": {"colocate": True, "num_workers": 2},
                        "train": {"world_size": 2}})
    ranks_group = reserve([{"CPU": 1, "GPU": 1}] * 2, what="two learner ranks", timeout_s=30, field="x", fix="y")
    ranks = [Probe.options(num_cpus=1, num_gpus=1, scheduling_strategy=in_group(ranks_group, r)).remote()
             for r in range(2)]
    placements = ray.get([r.where.remote() for r in ranks], timeout=60)
    shared = shared_gpus(cfg, 2, placements)
    bundles, groups = place_colocated(cfg, shared)
    try:
        engines = [Probe.options(**actor_options(b, g, ",".join(s["gpu_ids"]))).remote()
                   for b, g, s in zip(bundles, groups, shared)]
        seen = ray.get([e.where.remote() for e in engines], timeout=60)
        for rank, engine in zip(placements, seen):
            assert engine["node_id"] == rank["node_id"] and engine["gpu_ids"] == []  # no GPU of Ray's
            assert engine["cuda_visible_devices"] == ",".join(rank["gpu_ids"])  # but the rank's GPU in sight
        assert len({e["cuda_visible_devices"] for e in seen}) == 2  # each engine its own rank's GPU
        assert ray.available_resources().get("GPU", 0.0) == 0  # the ranks still hold both
    finally:
        for actor in [*ranks, *locals().get("engines", [])]:
            ray.kill(actor)
        for group in groups:
            release(group)
        release(ranks_group)


def test_colocation_falls_back_or_refuses_what_it_cannot_share():
    from prompt_r1.cluster.engine_placement import shared_gpus
    from prompt_r1.cluster.placement import PlacementError

    cfg = parse_config({"agent": {"backend": "vllm", "tensor_parallel_size": 2}, "rollout": {"colocate": True},
                        "train": {"world_size": 2}})
    rank = lambda node, gpu: {"node_id": node, "node_ip": f"10.0.0.{node}", "gpu_ids": [gpu]}  # noqa: E731
    assert shared_gpus(cfg, 1, [rank(1, "0"), rank(1, "1")]) == [{"node_ip": "10.0.0.1", "gpu_ids": ["0", "1"]}]
    with pytest.raises(PlacementError, match="different nodes"):
        shared_gpus(cfg, 1, [rank(1, "0"), rank(2, "0")])
    with pytest.raises(PlacementError, match="need 4 learner GPUs"):
        shared_gpus(cfg, 2, [rank(1, "0"), rank(1, "1")])
    assert shared_gpus(cfg, 1, None) is None  # a learner in this process: nothing to share
    off = parse_config({"agent": {"backend": "vllm"}})
    assert shared_gpus(off, 1, [rank(1, "0")]) is None


# -- the order around each update, in a real training run ----------------------------------------
@pytest.mark.parametrize("colocate", [True, False], ids=["colocated", "apart"])
def test_engines_sleep_for_each_update_and_wake_before_the_weight_sync(home, monkeypatch, colocate):
    import ray

    from prompt_r1.data.ingest import ingest
    from prompt_r1.rollout.pool import RolloutPool
    from prompt_r1.learner.base import LocalLearner
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    order: list[str] = []

    def spy(cls, name):
        real = getattr(cls, name)

        def recorded(self, *args, **kwargs):
            order.append(name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, recorded)

    for cls, name in [(RolloutPool, "sleep"), (RolloutPool, "wake_up"), (RolloutPool, "broadcast"),
                      (LocalLearner, "step")]:
        spy(cls, name)
    cfg = load_config("configs/smoke.yaml", {"rollout.colocate": colocate, "train.steps": 2})
    try:
        with Warehouse(home / "warehouse.duckdb") as wh:
            ingest(wh, ["data/sample"])
            with TrainingSession(cfg, wh, "r", home / "r") as session:
                session.run()
    finally:
        ray.shutdown()
    step = ["sleep", "step", "wake_up", "broadcast"] if colocate else ["step", "broadcast"]
    assert order == step * 2
