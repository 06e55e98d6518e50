"""What actors on a two-node Ray cluster with fake GPUs get from the driver: GPUs, settings, the API key.

The cluster is simulated on one machine (`ray.cluster_utils.Cluster`), two nodes of 2 CPUs and 2
(fake) GPUs each. Its nodes start before the test sets any variable, so, as on a real cluster
whose nodes ran `ray start` in another shell, an actor sees a driver's variable only if the
driver passes it on.

- Learner ranks (`train.world_size: 4`, two per node): each node's ranks see both of its rank
  GPUs, in one order, and each one's device is its own GPU among them (Ray Train's sharing,
  `learner/rank_gpus.py`); `NCCL_*` and `TORCH_NCCL_*` variables reach them. There is no CUDA
  here, so the ranks' `setup` (join the process group, load the model on the device) is replaced
  by a report of what the rank sees; everything before it is the real `LearnerGroup`.
- Rollout actors, one per node, with an `openai` environment whose key is in a variable
  (`environment.api_key_env`): the key reaches both, and appears nowhere in what Ray shows of the
  actors (their runtime environments) or in the cluster's log files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.learner.ray_group import LearnerRank

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a simulated cluster and a tiny-model rollout pool: minutes on a busy 2-core machine

KEY_VAR = "PROMPT_R1_TEST_ENV_KEY"
KEY = "sk-test-3f9c2e7d41a8b6"  # a made-up key: only its absence from logs matters


@pytest.fixture(scope="module")
def gpu_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # as in tests/rollout/test_rollout_two_nodes.py: token authentication on before the Cluster starts
    from ray._private.authentication.authentication_token_setup import (enable_token_auth_by_default,
                                                                        ensure_token_if_auth_enabled)

    enable_token_auth_by_default()
    ensure_token_if_auth_enabled(None, create_token_if_missing=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes(timeout=60)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


class ReportingRank(LearnerRank):
    """A learner rank whose `setup` reports what it sees instead of joining NCCL (no CUDA here)."""

    def setup(self, host: str, port: int) -> dict:
        from prompt_r1.cluster.engine_placement import actor_location

        return {**actor_location(), "device": self.device,
                "nccl": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}}


def test_ranks_share_their_nodes_gpus_and_get_the_nccl_settings(gpu_nodes, tiny_model_path, monkeypatch):
    from ray import cloudpickle

    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.learner import ray_group

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    monkeypatch.setattr(ray_group, "LearnerRank", ReportingRank)
    cfg = load_config("configs/smoke.yaml", {"train.world_size": 4, "train.cpus_per_rank": 0.5,
                                             "train.placement_strategy": "SPREAD",
                                             "rollout.ray_address": gpu_nodes.address})
    init_ray(cfg.rollout)
    try:
        with ray_group.LearnerGroup(cfg, tiny_model_path) as group:
            seen = group.placements
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
    by_node: dict[str, list[str]] = {}
    for where in seen:
        [own] = where["gpu_ids"]  # Ray's one GPU for the rank
        by_node.setdefault(where["node_id"], []).append(own)
    assert len(by_node) == 2 and all(sorted(ids) == ["0", "1"] for ids in by_node.values()), seen
    for rank, where in enumerate(seen):
        visible = where["cuda_visible_devices"].split(",")
        assert visible == sorted(by_node[where["node_id"]], key=int), (rank, where)  # its node's, in order
        assert where["device"] == f"cuda:{visible.index(where['gpu_ids'][0])}" == group.devices[rank]
        assert where["nccl"] == {"NCCL_SOCKET_IFNAME": "lo", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


def test_the_environment_key_reaches_rollout_actors_on_both_nodes_and_no_log(gpu_nodes, tiny_model_path,
                                                                              monkeypatch):
    from prompt_r1.env.openai_env import resolve_api_key
    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool

    assert KEY_VAR not in os.environ
    monkeypatch.setenv(KEY_VAR, KEY)  # after the nodes started: only the driver has it
    cfg = load_config("configs/smoke.yaml", {
        "agent.model": "tiny", "rollout.num_workers": 2, "rollout.cpus_per_worker": 2,
        "rollout.ray_address": gpu_nodes.address, "environment.kind": "openai",
        "environment.base_url": "http://127.0.0.1:9/v1", "environment.api_key_env": KEY_VAR})
    init_ray(cfg.rollout)
    try:
        with RolloutPool(cfg, tiny_model_path) as pool:
            assert len({p["node_id"] for p in pool.placements}) == 2  # one actor on each node
            seen = ray.get([w.__ray_call__.remote(lambda self: (
                os.environ.get(KEY_VAR), resolve_api_key(self.envs[0].cfg), ray.get_runtime_context().runtime_env))
                for w in pool.engines.actors])
        logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    finally:
        ray.shutdown()
    assert [(env_key, used) for env_key, used, _ in seen] == [(KEY, KEY)] * 2
    for _, _, runtime_env in seen:  # what Ray shows of an actor (`ray list actors --detail`): not the key
        assert "PROMPT_R1_MODELS" in runtime_env["env_vars"] and KEY not in repr(runtime_env), runtime_env
    leaked = [p for p in logs.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaked, leaked
