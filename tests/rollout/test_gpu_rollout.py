"""Rollout actors on GPU shares (`rollout.gpus_per_worker`), run on CPU through the same code path:
Ray's fake GPUs place the actors and the policy runs on the CPU device, batched as on a GPU.

Two actors of half a GPU each land on the one GPU of the instance (Ray sets each one's
`CUDA_VISIBLE_DEVICES` to it), a batch splits over them, and the learner's log-probs of the
sampled tokens match the sampler's; a third half does not fit and is refused naming what is
missing; a Ray instance without GPUs refuses GPU shares before any actor starts.
"""

from __future__ import annotations


import pytest
import torch

from tests.rollout.test_pool import questions, smoke_cfg

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def one_fake_gpu():
    from ray_helpers import init_fake_gpu_ray

    init_fake_gpu_ray(num_cpus=3, num_gpus=1)
    yield
    ray.shutdown()


def shared_gpu_cfg(workers: int = 2, share: float = 0.5, timeout_s: float = 300.0):
    cfg = smoke_cfg(model="tiny-protocol", temperature=1.0, batch_invariant=False)
    return cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={
        "num_workers": workers, "gpus_per_worker": share, "actor_start_timeout_s": timeout_s})})


@pytest.fixture(scope="module")
def protocol_model(_model_cache):
    from prompt_r1.models.bundled import resolve_model

    return str(resolve_model("tiny-protocol"))


def test_two_actors_share_one_gpu_and_sample_what_the_learner_recomputes(one_fake_gpu, protocol_model):
    from prompt_r1.config.experiment import parse_config
    from prompt_r1.learner.grpo_learner import GRPOLearner
    from prompt_r1.rollout.pool import RolloutPool

    cfg = shared_gpu_cfg()
    with RolloutPool(cfg, protocol_model, env_factory=None) as pool:
        where = pool.placements
        assert [w["gpu_ids"] for w in where] == [["0"], ["0"]]  # one GPU, two halves
        assert [w["cuda_visible_devices"] for w in where] == ["0", "0"] and where[0]["pid"] != where[1]["pid"]
        assert ray.available_resources().get("GPU", 0.0) == 0.0
        trajectories = pool.rollout(questions(4), step=0)
    assert len(trajectories) == 8 and {t.question_id for t in trajectories} == {f"q{i}" for i in range(4)}
    assert any(t.env_calls for t in trajectories)  # multi-turn: environment replies sit between agent turns
    agent = cfg.agent.model_dump()
    learner = GRPOLearner(parse_config({"agent": agent, "train": {"device": "cpu", "micro_batch_size": 4}}),
                          protocol_model)
    for traj, mine in zip(trajectories, learner.response_logprobs(trajectories)):
        sampled = torch.tensor(traj.logprobs)
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        assert mask.any() and torch.allclose(mine[mask], sampled[mask], atol=1e-4), (traj.question_id, mine, sampled)


def test_a_share_that_does_not_fit_is_refused_naming_what_is_missing(one_fake_gpu, protocol_model):
    from prompt_r1.cluster.placement import PlacementError
    from prompt_r1.rollout.pool import RolloutPool

    with pytest.raises(PlacementError) as caught:
        RolloutPool(shared_gpu_cfg(workers=3, timeout_s=20), protocol_model)
    message = str(caught.value)
    assert "GPU" in message and "rollout.num_workers" in message, message
    assert ray.available_resources().get("GPU", 0.0) == 1.0  # nothing left reserved


def test_gpu_shares_without_gpus_are_refused_before_any_actor():
    from prompt_r1.cluster.engine_placement import engine_bundle, shared_gpus
    from prompt_r1.cluster.placement import PlacementError

    cfg = shared_gpu_cfg()
    with pytest.raises(PlacementError, match=r"rollout\.gpus_per_worker=0\.5 .* this Ray cluster has no GPU"):
        engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=0)
    assert engine_bundle(cfg.agent, cfg.rollout, cluster_gpus=1) == {"CPU": 1.0, "GPU": 0.5}
    # colocated on the learner's GPU: the transformers policy on cuda shares the ranks' GPUs
    gpu = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"device": "cuda"}),
                                 "rollout": cfg.rollout.model_copy(update={"colocate": True, "num_workers": 1})})
    ranks = [{"node_id": "n0", "node_ip": "10.0.0.5", "gpu_ids": ["2"]}]
    assert shared_gpus(gpu, 1, ranks) == [{"node_ip": "10.0.0.5", "gpu_ids": ["2"]}]
    assert shared_gpus(cfg.model_copy(update={"rollout": gpu.rollout}), 1, ranks) is None  # on CPU: its own place
