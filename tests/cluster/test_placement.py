"""Placement groups with deadlines (`prompt_r1.cluster.placement`) on a local Ray with fake GPUs."""

from __future__ import annotations

import time

import pytest
import ray

from prompt_r1.cluster.placement import PlacementError, in_group, missing_resources, release, reserve


@pytest.fixture(scope="module")
def fake_gpu_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False)
    yield
    ray.shutdown()


def test_missing_resources_is_total_asked_minus_free():
    bundles = [{"CPU": 1, "GPU": 1}] * 3
    assert missing_resources(bundles, {"CPU": 4.0, "GPU": 1.0}) == {"GPU": 2.0}
    assert missing_resources(bundles, {"CPU": 3.0, "GPU": 3.0}) == {}


def test_reserve_places_and_actor_sees_its_bundle(fake_gpu_ray):
    group = reserve([{"CPU": 1, "GPU": 1}] * 2, what="two ranks", timeout_s=30, field="train.placement_timeout_s",
                    fix="lower train.world_size")

    @ray.remote(num_cpus=1, num_gpus=1)
    def visible() -> str:
        return ",".join(str(i) for i in ray.get_gpu_ids())

    ids = ray.get([visible.options(scheduling_strategy=in_group(group, i)).remote() for i in range(2)], timeout=60)
    assert len(set(ids)) == 2 and all(ids), ids  # two distinct fake GPUs
    release(group)


def test_impossible_bundle_fails_at_once_naming_the_node(fake_gpu_ray):
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"no node .* can hold bundle 0 .*GPU: 8.*lower agent.tensor_parallel_size"):
        reserve([{"CPU": 1, "GPU": 8}], what="the rollout engine", timeout_s=30, field="rollout.actor_start_timeout_s",
                fix="lower agent.tensor_parallel_size")
    assert time.monotonic() - started < 10


def test_more_than_free_fails_within_deadline_naming_missing(fake_gpu_ray):
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"within 2s \(train.placement_timeout_s\).*missing: 2 GPU.*world_size"):
        reserve([{"CPU": 0.5, "GPU": 1}] * 6, what="the learner group", timeout_s=2,
                field="train.placement_timeout_s", fix="lower train.world_size")
    assert time.monotonic() - started < 15
    # the failed group gave its reservation back: four GPUs can still be placed
    release(reserve([{"GPU": 1}] * 4, what="four", timeout_s=30, field="x", fix="y"))
