"""Learner groups (`train.world_size` > 1) on CPU: 2 gloo ranks train as 1, checkpoints move between
world sizes, `prompt-r1 train`'s path gives the same agent, and a rank that dies fails the step
naming it, within the deadline, with the group torn down.

Every group runs on a local Ray instance (`address="local"`, so no stray cluster is joined) with
more logical CPUs than the machine has: the ranks of these tiny models mostly wait on each other.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import pytest
import torch
from grpo_helpers import hand_trajectories, make_config, rollout
from safetensors.torch import load_file

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import load_config, parse_config
from prompt_r1.cluster.placement import in_group
from prompt_r1.learner.checkpoint import (OPTIMIZER_DIR, STATE_FILE, CheckpointError, load_checkpoint,
                                          save_checkpoint)
from prompt_r1.learner.grpo_learner import GRPOLearner

ray = pytest.importorskip("ray")

TOLERANCE = 1e-5  # max |w_N ranks - w_1 rank| over all parameters (measured: below 1e-6 here)
# three questions, mini-batches of two: the second mini-batch has one question, so rank 1 holds none
# of it (no gradient of its own under ddp, padding passes under fsdp); micro-batches of two, uneven
SETTINGS = {"mini_batch_questions": 2, "micro_batch_size": 2, "kl_coef": 0.05, "ppo_epochs": 2}


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _weights(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _optimizer_tensors(state: dict) -> dict[tuple[int | str, str], torch.Tensor]:
    """By (parameter index or name, key)."""
    return {(i, key): value for i, entry in state["state"].items() for key, value in entry.items()}


def _checkpoint_tensors(folder) -> tuple[dict[str, torch.Tensor], dict]:
    """The weights, and the trainer state with the optimiser state (saved apart, by name) read into it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = torch.load(folder / STATE_FILE, weights_only=False)
    assert "optimizer" not in state  # each rank wrote its part to optimizer/, none held it whole
    whole = folder.parent / f"{folder.name}-optimizer.pt"
    dcp_to_torch_save(folder / OPTIMIZER_DIR, whole)
    state["optimizer"] = torch.load(whole, weights_only=False)["optimizer"]
    return load_file(str(folder / "model.safetensors")), state


def test_two_ranks_correct_and_measure_the_sampler_as_one(local_ray, tiny_model_path) -> None:
    """`train.rollout_correction` both: the token weights and the geometric mask per rank, and the
    `rollout_corr/*` sums added over ranks, give one learner's weights and metrics."""
    import random

    from prompt_r1.learner.ray_group import LearnerGroup

    correction = {"rollout_correction": {"mode": "both", "geo_low": 0.95, "geo_high": 1.05}, "tis_cap": 1.2}
    one = GRPOLearner(make_config(**SETTINGS, **correction), tiny_model_path)
    torch.manual_seed(0)
    batch = rollout(one, ["a", "b", "c"], group_size=3, new_tokens=6)
    rng = random.Random(1)  # the sampler's log-probs moved, so weights, caps and masks all occur
    for t in batch:
        t.logprobs = [v + rng.choice([-0.3, 0.0, 0.2]) for v in t.logprobs]
    theirs = one.step(batch)
    assert 0 < theirs["rollout_corr/seq_masked_share"] < 1 and theirs["rollout_corr/token_capped_share"] > 0
    group_cfg = make_config(**SETTINGS, **correction, world_size=2, strategy="ddp", dist_timeout_s=120)
    with LearnerGroup(group_cfg, tiny_model_path) as group:
        mine = group.step(batch)
        assert _max_diff(group.merged_state_dict(), _weights(one)) < TOLERANCE
    for key, value in theirs.items():
        if key.startswith("rollout_corr/") or key in ("tis_mean", "tis_capped_fraction", "logprob_diff"):
            assert mine[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_and_checkpoint_as_one(local_ray, tiny_model_path, tmp_path, strategy) -> None:
    from prompt_r1.learner.ray_group import LearnerGroup

    cfg = make_config(**SETTINGS)
    one = GRPOLearner(cfg, tiny_model_path)
    initial = _weights(one)
    torch.manual_seed(0)
    batch = rollout(one, ["a", "b", "c"], group_size=3, new_tokens=6)  # real samples, unequal rewards
    one_metrics = [one.step(batch) for _ in range(3)]

    group_cfg = make_config(**SETTINGS, world_size=2, strategy=strategy, dist_timeout_s=120)
    with LearnerGroup(group_cfg, tiny_model_path) as group:
        group_metrics = [group.step(batch) for _ in range(3)]
        trained = group.merged_state_dict()
        # (a) the same weights as one learner on the whole batch, which moved far more than that
        assert _max_diff(trained, _weights(one)) < TOLERANCE
        assert _max_diff(trained, initial) > 100 * TOLERANCE
        for mine, theirs in zip(group_metrics, one_metrics):
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)  # the global norm
            assert mine["pg_loss"] == pytest.approx(theirs["pg_loss"], abs=1e-6)
            assert mine["kl"] == pytest.approx(theirs["kl"], abs=1e-6)
            for key in ("groups", "groups_informative"):
                assert mine[key] == theirs[key], key

        # (c) saved by 2 ranks, resumed by 1: the group's weights, the full optimiser state, the step
        saved = group.save_checkpoint(tmp_path / "two", 3, {"position": 3})
        resumed = GRPOLearner(cfg, tiny_model_path)
        assert load_checkpoint(resumed, saved) == (3, {"position": 3})
        assert all(torch.equal(trained[k], v) for k, v in _weights(resumed).items())
        theirs = _optimizer_tensors(one.optimizer.state_dict())
        mine = _optimizer_tensors(resumed.optimizer.state_dict())
        assert mine.keys() == theirs.keys() and len(mine) == 3 * len(one.params)  # step, exp_avg, exp_avg_sq each
        for key, value in theirs.items():  # equal up to the float noise of the weights (relative to each tensor)
            assert value.shape == mine[key].shape, key
            assert (value - mine[key]).abs().max() <= 1e-3 * value.abs().max(), key
        assert resumed.scheduler.state_dict() == one.scheduler.state_dict()
        # ...and training on continues as the uninterrupted learner does
        resumed.step(batch)
        one.step(batch)
        assert _max_diff(_weights(resumed), _weights(one)) < TOLERANCE

        # saved by 1, loaded by 2 ranks: saving again gives back the very same tensors
        ckpt_one = save_checkpoint(one, tmp_path / "one", 4, {"position": 4}, cfg)
        assert group.load_checkpoint(ckpt_one) == (4, {"position": 4})
        again = group.save_checkpoint(tmp_path / "again", 4, {"position": 4})
    (w1, s1), (w2, s2) = _checkpoint_tensors(ckpt_one), _checkpoint_tensors(again)
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    o1, o2 = _optimizer_tensors(s1["optimizer"]), _optimizer_tensors(s2["optimizer"])
    assert o1.keys() == o2.keys() and all(torch.equal(o1[k], o2[k]) for k in o1)
    assert [{k: v for k, v in g.items() if k != "params"} for g in s1["optimizer"]["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in s2["optimizer"]["param_groups"]]
    assert (s1["step"], s1["data_position"], s1["scheduler"]) == (s2["step"], s2["data_position"], s2["scheduler"])


def test_two_ranks_train_a_lora_adapter_as_one(local_ray, tiny_model_path, tmp_path) -> None:
    """ddp with LoRA: only adapter gradients are summed; the broadcast merges the adapter on rank 0."""
    from prompt_r1.learner.ray_group import LearnerGroup

    cfg = make_config(lora=True, lr=1e-2, **SETTINGS)
    one = GRPOLearner(cfg, tiny_model_path)
    initial = one.merged_state_dict()
    batch = hand_trajectories(one.tokenizer)
    for _ in range(3):
        one.step(batch)
    with LearnerGroup(make_config(lora=True, lr=1e-2, **SETTINGS, world_size=2, dist_timeout_s=120),
                      tiny_model_path) as group:
        for _ in range(3):
            group.step(batch)
        trained = group.merged_state_dict()
        saved = group.save_checkpoint(tmp_path / "two", 3, {"position": 3})
        # a user mistake inside the ranks is reported as itself (and still tears the group down)
        full_cfg = make_config()
        full_model = save_checkpoint(GRPOLearner(full_cfg, tiny_model_path), tmp_path / "full", 1, {}, full_cfg)
        with pytest.raises(CheckpointError, match="is a full model but the config has agent.lora.enabled=True"):
            group.load_checkpoint(full_model)
        assert group.closed and group.ranks.actors == []
    assert _max_diff(trained, one.merged_state_dict()) < TOLERANCE
    assert _max_diff(trained, initial) > 100 * TOLERANCE
    resumed = GRPOLearner(cfg, tiny_model_path)
    assert load_checkpoint(resumed, saved) == (3, {"position": 3})  # an adapter checkpoint, as one learner writes
    assert _max_diff(resumed.merged_state_dict(), trained) == 0.0


def test_smoke_training_with_two_ranks_exports_the_agent_of_one(local_ray, home, warehouse) -> None:
    """`prompt-r1 train`'s path (TrainingSession.run): rollouts, update, broadcast, checkpoints, export."""
    from transformers import AutoModelForCausalLM

    from prompt_r1.data.ingest import ingest
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession

    class Recorder(TrainingHooks):
        def __init__(self):
            super().__init__()
            self.metrics: list[dict[str, float]] = []

        def on_step(self, result):
            self.metrics.append(result.metrics)

    ingest(warehouse, ["data/sample"])
    agents, steps = {}, {}
    for world_size in (1, 2):
        # four questions a step (two per rank), no validation rollouts: the update is what is compared
        cfg = load_config("configs/smoke.yaml", {"train.world_size": world_size, "rollout.batch_questions": 4,
                                                 "data.validation_fraction": 0, "train.dist_timeout_s": 120})
        hooks = Recorder()
        with TrainingSession(cfg, warehouse, f"ranks-{world_size}", home / "smoke" / f"ranks-{world_size}") as session:
            outcome = session.run(hooks)
        agents[world_size] = AutoModelForCausalLM.from_pretrained(outcome.agent).state_dict()
        steps[world_size] = hooks.metrics
    initial = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.agent.model)).state_dict()
    assert _max_diff(agents[2], agents[1]) < TOLERANCE  # measured 3e-7
    assert _max_diff(agents[1], initial) > 5 * TOLERANCE  # it learned (measured 1.4e-4 at the smoke lr)
    assert len(steps[1]) == len(steps[2]) == cfg.train.steps
    for mine, theirs in zip(steps[2], steps[1]):  # the same rollouts: the broadcast weights were the same
        for key in ("reward_mean", "groups_informative"):
            assert mine[key] == theirs[key], key
        assert mine["pg_loss"] == pytest.approx(theirs["pg_loss"], abs=1e-6)


class ExitingReward:
    """A reward whose reading ends the process: the rank that reads it dies inside its step."""

    @property
    def total(self) -> float:
        os._exit(1)


def test_a_rank_that_dies_mid_step_fails_the_step_naming_it(local_ray, tiny_model_path) -> None:
    from ray.util import placement_group_table

    from prompt_r1.learner.ray_group import LearnerGroup, LearnerRankError

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ExitingReward reaches the rank by value
    cfg = make_config(world_size=2, dist_timeout_s=60)
    group = LearnerGroup(cfg, tiny_model_path)
    [placement] = group.ranks.groups
    batch = hand_trajectories(GRPOLearner(make_config(), tiny_model_path).tokenizer)
    for t in batch:
        if t.question_id == "q1":  # rank 1's share (whole groups, in order)
            t.reward = ExitingReward()
    started = time.monotonic()
    with pytest.raises(LearnerRankError) as caught:
        group.step(batch)  # rank 0 waits in a collective for a peer that is gone
    elapsed = time.monotonic() - started
    assert elapsed < cfg.train.dist_timeout_s, elapsed
    message = str(caught.value)
    assert caught.value.ranks[0] == 1 and "learner rank 1 died during a GRPO step" in message, message
    assert "--resume" in message and not isinstance(caught.value, ConfigError)
    assert placement_group_table(placement)["state"] == "REMOVED"
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)  # both ranks' CPUs come back
    assert ray.available_resources().get("CPU", 0.0) == 4
    with pytest.raises(LearnerRankError, match="torn down after an earlier failure"):
        group.step(batch)
    group.close()  # closing again is harmless


class Napper:
    """Stands in for a learner rank in a wait: answers after `seconds`."""

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_a_rank_that_hangs_fails_the_call_at_the_deadline_naming_it(local_ray) -> None:
    from ray.util import placement_group_table

    from prompt_r1.cluster.actor_group import ActorGroup
    from prompt_r1.cluster.placement import reserve
    from prompt_r1.learner.ray_group import LearnerGroup, LearnerRankError

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    group = LearnerGroup.__new__(LearnerGroup)  # the waiting logic alone, on actors that load no model
    group.timeout_s, group.closed = 120.0, False  # the first call waits for the actors to start
    placement = reserve([{"CPU": 0.5}] * 2, what="two nappers", timeout_s=30, field="f", fix="x")
    group.ranks = ActorGroup("learner rank", groups=[placement])
    group.ranks.start(Napper, [()] * 2,
                      [{"num_cpus": 0.5, "scheduling_strategy": in_group(placement, r)} for r in range(2)])
    assert group._gather(group.ranks.call("nap", 0.0), "napping") == [0.0, 0.0]
    group.timeout_s = 3.0
    started = time.monotonic()
    with pytest.raises(LearnerRankError, match=r"learner rank 1 did not finish napping within 3s "
                                               r"\(train.dist_timeout_s\).*torn down") as caught:
        group._gather(group.ranks.call_each("nap", [(0.0,), (600.0,)]), "napping")
    assert time.monotonic() - started < 3 + 10 and caught.value.ranks == [1]
    assert group.ranks.actors == [] and placement_group_table(placement)["state"] == "REMOVED"


def test_local_cpus_count_the_learner_ranks_before_anything_starts(local_ray) -> None:
    from prompt_r1.cluster.connect import RayWaitError, check_local_cpus

    cfg = load_config("configs/smoke.yaml", {"train.world_size": 2, "train.cpus_per_rank": 2})
    with pytest.raises(RayWaitError, match=r"learner group 2 ranks x 2 CPUs = 4 CPUs .* has 4 CPUs.*train.world_size"):
        check_local_cpus(cfg.rollout, learner_ranks=2, cpus_per_rank=2)
    check_local_cpus(cfg.rollout, learner_ranks=2, cpus_per_rank=1)


def test_layout_settings_are_checked_and_do_not_change_the_run_identity(local_ray) -> None:
    from prompt_r1.learner.ray_group import learner_device

    base = {"agent": {"model": "tiny", "lora": {"enabled": True}}}
    with pytest.raises(ConfigError, match=r"train\.strategy is fsdp with agent\.lora\.enabled.*ddp"):
        parse_config({**base, "train": {"world_size": 2, "strategy": "fsdp"}}).check_trainable()
    parse_config({**base, "train": {"world_size": 2, "strategy": "ddp"}}).check_trainable()
    # how the learner is laid out is not which run it is: a run resumes at another world size
    layouts = [{}, {"world_size": 4, "strategy": "fsdp", "cpus_per_rank": 2, "dist_timeout_s": 5,
                    "placement_timeout_s": 5}]
    assert len({parse_config({"train": layout}).hash() for layout in layouts}) == 1
    assert parse_config({"train": {"lr": 1e-3}}).hash() != parse_config({}).hash()
    assert learner_device("cpu") == learner_device("auto") == "cpu"  # this Ray instance has no GPU
    with pytest.raises(ConfigError, match="train.device is 'cuda' but the Ray cluster has no GPU"):
        learner_device("cuda")


def test_ranks_take_a_gpu_each_when_the_cluster_has_gpus(monkeypatch) -> None:
    from prompt_r1.learner import ray_group

    monkeypatch.setattr(ray_group.ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    assert ray_group.learner_device("auto") == ray_group.learner_device("cuda:1") == "cuda:0"
    assert ray_group.learner_device("cpu") == "cpu"  # train.device: cpu places the ranks without GPUs


def test_one_rank_is_a_ray_actor_when_it_would_train_on_a_gpu(monkeypatch) -> None:
    """A one-rank learner on a GPU runs in Ray (a placed GPU, none in the driver); on CPU it stays
    in this process."""
    from prompt_r1.learner import base as learner_base

    monkeypatch.setattr(learner_base, "LocalLearner", lambda cfg, path: ("local", cfg.train.world_size))
    monkeypatch.setattr("prompt_r1.cluster.connect.init_ray", lambda rollout_cfg, cpus_needed=0.0: None)
    opened = []

    class Group:
        def __init__(self, cfg, path):
            opened.append(cfg.train.world_size)

        def close(self):
            opened.append("closed")

    monkeypatch.setattr("prompt_r1.learner.ray_group.LearnerGroup", Group)
    for gpus, device, expected in [(2.0, "auto", "ray"), (2.0, "cuda", "ray"), (2.0, "cpu", "local"),
                                   (0.0, "auto", "local")]:
        monkeypatch.setattr(ray, "cluster_resources", lambda gpus=gpus: {"CPU": 8.0, "GPU": gpus})
        cfg = make_config(device=device)
        assert learner_base.learner_in_ray(cfg) is (expected == "ray")
        with learner_base.open_learner(cfg, "unused") as learner:
            if expected == "local":
                assert learner == ("local", 1)
            else:
                assert isinstance(learner, Group)
    assert opened == [1, "closed", 1, "closed"]
    assert learner_base.learner_in_ray(make_config(world_size=2)) is True


def test_one_rank_joins_no_process_group_and_hands_its_weights_on_by_reference(local_ray, tiny_model_path) -> None:
    """World size 1 in Ray (a GPU learner) is the learner alone: the identity `Ranks`, no process
    group, no gradient buckets. Its weight sync stays in the object store: the driver gets the
    header and a reference, and what the reference holds matches the header."""
    from prompt_r1.core.weights import UpdateRef
    from prompt_r1.learner.ray_group import LearnerGroup

    with LearnerGroup(make_config(world_size=1, dist_timeout_s=120), tiny_model_path) as group:
        kind, joined = ray.get(group.ranks.actors[0].__ray_call__.remote(
            lambda rank: (type(rank.learner.ranks).__name__, torch.distributed.is_initialized())), timeout=60)
        assert (kind, joined) == ("Ranks", False)
        update = group.weights_for_sync(1)
        assert isinstance(update, UpdateRef)
        sent = ray.get(update.ref, timeout=60)
        assert update.header == sent.header and update.header.version == 1
        assert "lm_head.weight" not in sent.tensors  # tied to the embedding: sent once
