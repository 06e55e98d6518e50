"""`agent.device`, `rollout.gpus_per_worker` and an in-process environment's `device`: the
combinations that cannot work are refused at load with the setting to change, and their defaults
leave every recorded config hash as it was."""

from __future__ import annotations

import pytest

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import load_config, parse_config

GPU = {"agent": {"device": "cuda", "batch_invariant": False}, "rollout": {"gpus_per_worker": 0.25}}


@pytest.mark.parametrize("data, says", [
    ({"agent": {"device": "cuda"}, "rollout": {"gpus_per_worker": 1}}, "agent.batch_invariant to false"),
    ({"agent": {"device": "cuda", "batch_invariant": False}}, "rollout.gpus_per_worker"),
    ({"agent": {"device": "cuda", "backend": "vllm", "batch_invariant": False}}, "leave agent.device at cpu"),
    ({"agent": {"backend": "vllm"}, "rollout": {"gpus_per_worker": 1}}, "set rollout.gpus_per_worker to 0"),
    ({"environment": {"kind": "openai", "base_url": "http://h/v1", "device": "cuda"}}, "leave device at cpu"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_setting(data, says):
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        parse_config(data)


def test_the_working_combinations_load():
    assert parse_config(GPU).agent.device == "cuda"
    colocated = {"agent": GPU["agent"], "rollout": {"colocate": True}}  # the learner's GPUs: no share of its own
    assert parse_config(colocated).rollout.gpus_per_worker == 0
    assert parse_config({"rollout": {"gpus_per_worker": 0.5}}).agent.device == "cpu"  # reserves only
    assert parse_config({"environment": {"kind": "inprocess", "device": "cuda"}}).environment.device == "cuda"


def test_defaults_keep_the_hash_and_a_gpu_rollout_has_its_own():
    smoke = load_config("configs/smoke.yaml")
    spelled = load_config("configs/smoke.yaml", {"agent.device": "cpu", "rollout.gpus_per_worker": 0,
                                                 "environment.device": "cpu"})
    assert spelled.hash() == smoke.hash()
    # the share of a GPU is where an actor runs, not what it samples; the device is what it samples on
    assert load_config("configs/smoke.yaml", {"rollout.gpus_per_worker": 0.5}).hash() == smoke.hash()
    on_gpu = load_config("configs/smoke.yaml", {"agent.device": "cuda", "agent.batch_invariant": False,
                                                "rollout.gpus_per_worker": 0.5})
    assert on_gpu.hash() != load_config("configs/smoke.yaml", {"agent.batch_invariant": False}).hash()
