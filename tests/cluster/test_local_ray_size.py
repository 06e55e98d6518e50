"""The size of a local Ray instance: every core, or what the config's actors ask for where that is more.

A local instance never grows, so it must hold the whole config at once. `configs/paper.yaml` on
one 8-GPU node (4 vLLM engines and 4 learner ranks, a CPU each) was refused on a machine with
fewer than 8 CPUs in Ray's count (the old default was 2, whatever the machine); now the instance
is sized to hold it and the placement is reserved on fake GPUs. On a small machine (2 cores here,
faked with `os.cpu_count`, so the test means the same on a CI machine with more) the smoke config
with two learner ranks and a rollout actor runs on shared cores with a warning; an explicit
`rollout.ray_num_cpus` that is too small is still refused before anything starts.
"""

from __future__ import annotations

import logging
import os

import pytest

from prompt_r1.config.experiment import load_config

ray = pytest.importorskip("ray")


@pytest.fixture
def two_cores(monkeypatch):
    """This machine as one of 2 cores, for the sizing rule (Ray itself is told its CPUs)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_sizing_rule_against_its_statement(monkeypatch) -> None:
    """`local_cpus` is max(cores, what is asked) unless `ray_num_cpus` says otherwise, for any mix."""
    from prompt_r1.config.experiment import RolloutConfig
    from prompt_r1.cluster.connect import cpus_needed, local_cpus

    for cores in (1, 2, 8, 64):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        for workers in (1, 3, 8):
            for world_size in (1, 2, 4):
                for device in ("cpu", "auto"):
                    cfg = load_config("configs/smoke.yaml", {
                        "rollout.num_workers": workers, "rollout.cpus_per_worker": 0.5,
                        "train.world_size": world_size, "train.device": device, "train.cpus_per_rank": 1.5})
                    ranks = world_size if world_size > 1 or device != "cpu" else 0
                    asked = workers * 0.5 + ranks * 1.5
                    assert cpus_needed(cfg) == asked
                    assert cpus_needed(cfg, learner=False) == workers * 0.5
                    assert local_cpus(cfg.rollout, asked) >= asked and local_cpus(cfg.rollout, asked) >= cores
                    assert local_cpus(cfg.rollout, asked) in (cores, -(-asked // 1))  # no more than needed
                    assert local_cpus(RolloutConfig(ray_num_cpus=3), asked) == 3


def test_paper_config_is_admitted_on_a_fake_8_gpu_node(two_cores, caplog) -> None:
    from prompt_r1.cluster.engine_placement import engine_bundle
    from prompt_r1.cluster.placement import release, reserve_groups
    from prompt_r1.cluster.connect import check_local_cpus, cpus_needed, local_cpus
    from ray.util import placement_group_table

    cfg = load_config("configs/paper.yaml")
    assert cfg.rollout.ray_num_cpus is None and cfg.rollout.ray_address is None
    with caplog.at_level(logging.WARNING, logger="prompt_r1.cluster.connect"):
        check_local_cpus(cfg.rollout, learner_ranks=cfg.train.world_size, cpus_per_rank=cfg.train.cpus_per_rank)
    assert "share the cores" in caplog.text and "gets 8 CPUs" in caplog.text
    num_cpus = local_cpus(cfg.rollout, cpus_needed(cfg))
    assert num_cpus == 8
    # the instance `init_ray` starts, on a node with 8 (fake) GPUs: the paper's placement fits it
    ray.init(address="local", num_cpus=num_cpus, num_gpus=8, include_dashboard=False, logging_level=logging.WARNING)
    engines = [[engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=8)]] * cfg.rollout.num_workers
    ranks = [[{"CPU": cfg.train.cpus_per_rank, "GPU": 1}] * cfg.train.world_size]
    groups = reserve_groups(engines + ranks, what="paper.yaml", timeout_s=30, field="test", fix="-", name="paper")
    try:
        # the placement-group table, not available_resources(): the latter is refreshed by the raylet's
        # periodic report and can still show the GPUs free just after the groups were placed
        tables = [placement_group_table(group) for group in groups]
        assert len(groups) == 5 and all(t["state"] == "CREATED" for t in tables)
        assert sum(b.get("GPU", 0) for t in tables for b in t["bundles"].values()) == 8
    finally:
        for group in groups:
            release(group)


def test_two_ranks_and_a_rollout_actor_share_two_cores_with_a_warning(two_cores, caplog) -> None:
    from prompt_r1.cluster.connect import check_local_cpus, cpus_needed, init_ray

    cfg = load_config("configs/smoke.yaml", {"train.world_size": 2})
    with caplog.at_level(logging.WARNING, logger="prompt_r1.cluster.connect"):
        check_local_cpus(cfg.rollout, learner_ranks=2, cpus_per_rank=cfg.train.cpus_per_rank)
    assert "1 actors x 1 CPUs" in caplog.text and "learner group 2 ranks" in caplog.text
    assert "more than this machine's 2 cores" in caplog.text and "rollout.ray_num_cpus" in caplog.text
    init_ray(cfg.rollout, cpus_needed(cfg))
    assert ray.cluster_resources()["CPU"] == 3
    check_local_cpus(cfg.rollout, learner_ranks=2, cpus_per_rank=cfg.train.cpus_per_rank)  # the running one holds it


def test_an_explicit_ray_num_cpus_too_small_is_still_refused(two_cores) -> None:
    from prompt_r1.cluster.connect import RayWaitError, check_local_cpus

    cfg = load_config("configs/smoke.yaml", {"train.world_size": 2, "rollout.ray_num_cpus": 2})
    with pytest.raises(RayWaitError, match=r"learner group 2 ranks .* has 2 CPUs \(rollout.ray_num_cpus\)"):
        check_local_cpus(cfg.rollout, learner_ranks=2, cpus_per_rank=cfg.train.cpus_per_rank)
