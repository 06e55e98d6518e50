"""Agent policy backends behind one interface (`Policy`), chosen by `agent.backend`.

`make_policy(agent_cfg, model_path)` builds a `TransformersPolicy` (`hf`: CPU or a GPU, reference
log-probs) or a `VLLMPolicy` (`vllm_policy`: offline vLLM engine, imported only when asked for, so
vLLM stays optional); `base` holds the interface.

Imports: `prompt_r1.core`, `prompt_r1.config`, `prompt_r1.models`.
"""

from __future__ import annotations

from pathlib import Path

from prompt_r1.config.experiment import AgentConfig
from prompt_r1.policy.base import Policy, Sample

__all__ = ["Policy", "Sample", "backend_deterministic", "make_policy"]


def backend_deterministic(agent_cfg: AgentConfig) -> bool:
    """Whether rollouts with this agent config are exact whatever the batching (the `deterministic`
    property its policy will have): the transformers backend with `batch_invariant`; never vLLM,
    whose batched kernels are not batch-invariant and, on CPU, take no per-request seeds."""
    return agent_cfg.backend == "transformers" and agent_cfg.batch_invariant


def make_policy(agent_cfg: AgentConfig, model_path: str | Path, seed: int = 0, sleep_mode: bool = False) -> Policy:
    """The rollout policy for `agent_cfg.backend` loaded from `model_path` (a local HF folder);
    `sleep_mode` (`rollout.colocate`): a vLLM engine on GPU that can `sleep` while a learner updates."""
    if agent_cfg.backend == "transformers":
        from prompt_r1.policy.hf import TransformersPolicy

        return TransformersPolicy(model_path, temperature=agent_cfg.temperature, top_p=agent_cfg.top_p,
                                  dtype=agent_cfg.dtype, seed=seed, batch_invariant=agent_cfg.batch_invariant,
                                  device=agent_cfg.device)
    if agent_cfg.backend == "vllm":
        from prompt_r1.policy.vllm_policy import VLLMPolicy

        return VLLMPolicy(model_path, temperature=agent_cfg.temperature, top_p=agent_cfg.top_p,
                          dtype=agent_cfg.dtype, seed=seed, max_num_seqs=agent_cfg.vllm_max_num_seqs,
                          max_model_len=agent_cfg.vllm_max_model_len,
                          tensor_parallel_size=agent_cfg.tensor_parallel_size,
                          gpu_memory_utilization=agent_cfg.vllm_gpu_memory_utilization,
                          enforce_eager=agent_cfg.enforce_eager, sleep_mode=sleep_mode,
                          lora_rank=agent_cfg.lora.r if agent_cfg.lora.enabled else None)
    raise ValueError(f"agent.backend must be `transformers` or `vllm`, got {agent_cfg.backend!r}")
