"""Evaluation's agent engines placed by Ray (`eval.agent_placement`), checked on fake Ray GPUs.

Each agent under evaluation gets a Ray actor in a placement group of its own with a GPU of its
own, and the driver calls it through the ordinary policy interface: two agents land in two groups
on two different (fake) GPUs and give exactly the predictions the in-driver engines give for the
same seed (the transformers backend with the tiny models; greedy decoding). The choice itself:
`auto` moves vLLM engines into Ray when Ray counts GPUs, each then taking the whole configured
share; fewer GPUs than engines keeps them in the driver, splitting the share, with a warning; the
transformers backend under `auto` never starts Ray. What a real vLLM engine does on a real GPU
there is not exercised here (docs/scale.md says what has been measured).
"""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path

import pytest

from prompt_r1.config.experiment import load_config, parse_config

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_gpu_ray():
    """A local Ray with two fake GPUs for one test, shut down after it."""
    if ray.is_initialized():
        ray.shutdown()
    hidden = os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses fake GPUs when it is empty
    try:
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, logging_level=logging.WARNING)
    finally:
        if hidden is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    yield
    ray.shutdown()


def test_two_agents_get_two_groups_on_two_gpus_and_the_driver_s_predictions(fake_gpu_ray, warehouse,
                                                                           tiny_model_path):
    from ray.util import placement_group_table

    from prompt_r1.data.ingest import ingest
    from prompt_r1.evaluation.engines import RemotePolicy
    from prompt_r1.evaluation.evaluate import EvalAgents, evaluate
    from prompt_r1.models.resolver import resolve_agents

    ingest(warehouse, [ROOT / "data" / "sample"])
    overrides = {"eval.methods": ["agent", "agent_only"], "eval.limit_per_dataset": 1}
    driver_cfg = load_config(ROOT / "configs" / "smoke.yaml", {**overrides, "eval.agent_placement": "driver"})
    ray_cfg = load_config(ROOT / "configs" / "smoke.yaml", {**overrides, "eval.agent_placement": "ray"})
    agents = {**resolve_agents(driver_cfg), "trained": tiny_model_path}  # two different models
    assert len(agents) == 2

    with EvalAgents(driver_cfg, agents) as opened:
        assert not any(isinstance(p, RemotePolicy) for p in opened.policies.values())
        in_driver = evaluate(driver_cfg, warehouse, "in-driver", opened)

    with EvalAgents(ray_cfg, agents) as opened:
        policies = opened.policies
        assert set(policies) == {"base", "trained"} and all(isinstance(p, RemotePolicy) for p in policies.values())
        groups = [p.engines.groups[p.index] for p in policies.values()]
        assert len({g.id for g in groups}) == 2  # a placement group each
        tables = [placement_group_table(g) for g in groups]
        assert all(t["state"] == "CREATED" and list(t["bundles"].values()) == [{"CPU": 1.0, "GPU": 1.0}]
                   for t in tables)
        gpus = [p.location["gpu_ids"] for p in policies.values()]
        assert sorted(gpus) == [["0"], ["1"]]  # one GPU each, not the same one
        assert all(p.location["pid"] != os.getpid() for p in policies.values())  # not in the driver
        in_ray = evaluate(ray_cfg, warehouse, "in-ray", opened)
        actors = [p.engines.actors[p.index] for p in policies.values()]

    rows = lambda out: sorted((r["method"], r["question_id"], r["prediction"], r["num_turns"])  # noqa: E731
                              for r in out.predictions)
    turns = lambda out: sorted((e["method"], e["question_id"], e["trajectory"]["agent_turns"])  # noqa: E731
                               for e in out.episodes)
    assert len(rows(in_driver)) == 2 * 2 * 4  # 2 methods x 2 agents x 4 sample datasets x 1 question
    assert {m for m, *_ in rows(in_ray)} == {"agent:base", "agent:trained", "agent_only:base", "agent_only:trained"}
    assert rows(in_ray) == rows(in_driver)
    assert turns(in_ray) == turns(in_driver) and len(turns(in_driver)) == 2 * 4  # every agent turn's text
    # closed: every engine stopped and every group given back
    assert all(placement_group_table(g)["state"] == "REMOVED" for g in groups)
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.placement.remote(), timeout=60)


@pytest.fixture
def spied_engines(monkeypatch):
    """`make_policy` (in the driver) and `ray_policies` (in Ray) replaced by recorders of the share
    each engine is given; the real `EvalAgents` decides between them."""
    import prompt_r1.evaluation.engines as engines
    import prompt_r1.policy as policy_module

    made = {"driver": [], "ray": []}
    closed = types.SimpleNamespace(close=lambda: None)
    monkeypatch.setattr(policy_module, "make_policy", lambda agent, path, seed=0: (
        made["driver"].append(agent.vllm_gpu_memory_utilization), closed)[1])
    monkeypatch.setattr(engines, "ray_policies", lambda cfg, agent, paths: (
        made["ray"].append((agent.vllm_gpu_memory_utilization, len(paths))), {label: closed for label in paths})[1])
    return made


def test_auto_places_vllm_engines_in_ray_on_gpus_each_with_the_whole_share(fake_gpu_ray, spied_engines, caplog):
    from prompt_r1.evaluation.evaluate import EvalAgents

    cfg = parse_config({"agent": {"backend": "vllm", "vllm_gpu_memory_utilization": 0.8}})
    assert cfg.eval.agent_placement == "auto"
    with EvalAgents(cfg, {"base": "/a", "trained": "/b"}) as agents:
        assert len(agents.policies) == 2
    assert spied_engines == {"driver": [], "ray": [(0.8, 2)]}
    # a managed vLLM environment server may share an engine's GPU: its share is left to it
    served = parse_config({"agent": {"backend": "vllm", "vllm_gpu_memory_utilization": 0.8},
                           "environment": {"kind": "vllm", "gpu_memory_utilization": 0.3}})
    with EvalAgents(served, {"base": "/a", "trained": "/b"}) as agents:
        assert len(agents.policies) == 2
    assert spied_engines["ray"][-1] == (0.5, 2)
    # three engines on two GPUs: back in the driver, splitting its share, with a warning
    with caplog.at_level(logging.WARNING, logger="prompt_r1.evaluation.engines"):
        with EvalAgents(cfg, {"base": "/a", "trained": "/b", "champion": "/c"}) as agents:
            assert len(agents.policies) == 3
    assert spied_engines["driver"] == [0.2667] * 3 and len(spied_engines["ray"]) == 2
    assert "need 3 GPUs but the Ray cluster has 2" in caplog.text


def test_auto_keeps_transformers_engines_in_the_driver_without_starting_ray(spied_engines):
    from prompt_r1.evaluation.evaluate import EvalAgents

    if ray.is_initialized():
        ray.shutdown()
    with EvalAgents(parse_config({}), {"base": "/a", "trained": "/b"}) as agents:
        assert len(agents.policies) == 2
    assert len(spied_engines["driver"]) == 2 and spied_engines["ray"] == [] and not ray.is_initialized()


def test_the_placement_leaves_the_run_s_hash_alone():
    """Where evaluation's engines run changes no prediction, so no run's identity (resumes and the
    registry compare hashes)."""
    hashes = {parse_config({"eval": {"agent_placement": mode}}).hash() for mode in ("auto", "driver", "ray")}
    assert len(hashes) == 1
    assert parse_config({"eval": {"temperature": 0.7}}).hash() not in hashes


def test_the_placement_rule_against_its_statement():
    """`engine_place` (what `evaluate` and `plan` both follow) for every mix: the driver when asked,
    when there is no engine, or for `auto` with the transformers backend or without GPUs; shared
    when Ray was the choice but the GPUs are fewer than engines x tensor-parallel size; else Ray."""
    from prompt_r1.config.evaluation import engine_place

    for placement in ("auto", "driver", "ray"):
        for backend in ("transformers", "vllm"):
            for engines in (0, 1, 2, 3):
                for tp in (1, 2):
                    for gpus in (0, 1, 2, 4, 8):
                        got = engine_place(placement, backend, engines, tp, gpus)
                        ray_asked = placement == "ray" or (placement == "auto" and backend == "vllm" and gpus > 0)
                        if engines == 0 or not ray_asked:
                            assert got == "driver"
                        elif gpus and gpus < engines * tp:
                            assert got == "shared"
                        else:
                            assert got == "ray"


def test_plan_says_where_evaluation_places_its_engines():
    from prompt_r1.planning.memory import Machine
    from prompt_r1.planning.plan import make_plan
    from prompt_r1.planning.machine import agent_architecture

    paper, one = load_config(ROOT / "configs" / "paper.yaml"), load_config(ROOT / "configs" / "one-gpu.yaml")
    plan = make_plan(paper, agent_architecture(paper), Machine(gpus_per_node=8, gpu_memory_gib=80))
    assert plan.fits and "each placed by Ray on 1 GPU of its own" in plan.evaluation
    assert plan.to_dict()["evaluation"] == plan.evaluation and "evaluation (after training): 2" in plan.render()
    roomy = make_plan(one, agent_architecture(one), Machine(gpus_per_node=1, gpu_memory_gib=80))
    assert "share the driver's first GPU" in roomy.evaluation and "0.3 each" in roomy.evaluation  # 0.6 / 2
    assert "too little" not in roomy.evaluation
    small = make_plan(one, agent_architecture(one), Machine(gpus_per_node=1, gpu_memory_gib=24))
    assert "too little for a vLLM engine" in small.evaluation and "eval.agent_checkpoints" in small.evaluation
    smoke = load_config(ROOT / "configs" / "smoke.yaml")
    assert make_plan(smoke, agent_architecture(smoke), Machine()).evaluation.endswith("in the driver's process, on CPU")
