"""The rollout actor's one refusal, stated once for the driver's pool and the actor: a managed
vLLM environment must be started by the driver (`pool.actor_environments`), never by an actor."""

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.rollout.worker import refuse_managed_environments


def test_a_managed_vllm_environment_is_refused_naming_it_and_the_fix():
    cfg = load_config("configs/smoke.yaml", {"environment.kind": "vllm"})
    with pytest.raises(ValueError) as err:
        refuse_managed_environments(cfg)
    assert cfg.environment.name in str(err.value) and "actor_environments" in str(err.value)


def test_environments_an_actor_can_open_pass():
    for kind in ("inprocess", "openai"):
        refuse_managed_environments(load_config("configs/smoke.yaml", {"environment.kind": kind,
                                                                       "environment.base_url": "http://x:1/v1"}))
