"""The transformers policy on a device (`agent.device`): a GPU that is not there is refused naming
the settings, and running out of GPU memory while generating names what sizes the batch. The GPU
code path itself runs on the CPU device in `tests/rollout/test_gpu_rollout.py`."""

from __future__ import annotations

import pytest
import torch

from prompt_r1.core.failures import UserError
from prompt_r1.core.tokens import agent_prompt_ids
from prompt_r1.policy.hf import TransformersPolicy, rollout_device

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@no_gpu
def test_cuda_without_a_visible_gpu_is_refused_naming_the_settings(tiny_model_path):
    with pytest.raises(UserError, match=r"agent\.device is 'cuda' but this rollout actor sees no CUDA GPU") as caught:
        TransformersPolicy(tiny_model_path, device="cuda", batch_invariant=False)
    assert "rollout.gpus_per_worker to 0" in str(caught.value) and "CUDA_VISIBLE_DEVICES" in str(caught.value)
    assert rollout_device("cpu") == torch.device("cpu")


def test_out_of_memory_while_generating_names_what_sizes_the_batch(tiny_model_path, monkeypatch):
    """A real OOM cannot be had on demand here: the model's forward raises torch's own error once."""
    policy = TransformersPolicy(tiny_model_path, batch_invariant=False, seed=3)
    prompts = [agent_prompt_ids(policy.tokenizer, q) for q in ("hi", "What is the capital of France?")]
    expected = policy.generate(prompts, 6, seeds=[1, 2])
    real_forward = policy.model.forward
    calls = []

    def out_of_memory(*args, **kwargs):
        calls.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(policy.model, "forward", out_of_memory)
    with pytest.raises(UserError) as caught:
        policy.generate(prompts, 6, seeds=[1, 2])
    message = str(caught.value)
    longest = max(map(len, prompts)) + 6
    for words in ("ran out of memory on cpu", f"2 row(s) of up to {longest} tokens", "Tried to allocate 2.00 GiB",
                  "rollout.batch_questions", "rollout.num_workers", "agent.max_response_tokens",
                  "rollout.gpus_per_worker", "prompt-r1 plan"):
        assert words in message, (words, message)
    assert calls == [1] and isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    monkeypatch.setattr(policy.model, "forward", real_forward)  # nothing of the policy was spoiled
    again = policy.generate(prompts, 6, seeds=[1, 2])
    assert [s.token_ids for s in again] == [s.token_ids for s in expected]


@no_gpu
def test_an_in_process_environment_on_cuda_without_a_gpu_is_refused_naming_it(_model_cache):
    from prompt_r1.config.base import ConfigError
    from prompt_r1.config.env import EnvConfig
    from prompt_r1.env.inprocess import InProcessEnvironment

    with pytest.raises(ConfigError, match=r"environment `tiny-env` has device 'cuda' but this process sees no CUDA"):
        InProcessEnvironment(EnvConfig(name="tiny-env", kind="inprocess", model="tiny", device="cuda"))
