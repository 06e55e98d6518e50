"""What a Ray actor (rollout worker, learner rank) takes from the driver's environment.

On a local Ray instance actors inherit the driver's environment; on a cluster (`ray start` on
each node) they inherit only what was exported before `ray start` on their node. So the driver
passes on what a run depends on:

- settings (`actor_env_vars`): the model cache, offline mode and such by name, and every `NCCL_*`
  and `TORCH_NCCL_*` variable (network interface, debug and workaround switches for the learner
  ranks' collectives), through the actor's `runtime_env`;
- secrets (`secret_env`): the environment LLM's API key variable (`environment.api_key_env`). Not
  through `runtime_env`, which Ray shows to anyone who can list the cluster's actors (`ray list
  actors --detail`, the dashboard) and may write to its logs, but as an actor argument holding
  `SecretStr` values (printed as `**********`), which the actor puts into its own environment
  (`apply_secret_env`) before it opens the environment client.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from pydantic import SecretStr

from prompt_r1.config.env import EnvConfig

# Settings that actors need from the driver's environment (local or remote workers).
FORWARDED_ENV = ("PROMPT_R1_HOME", "PROMPT_R1_MODELS", "HF_HUB_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM",
                 "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")
# Families forwarded whole: NCCL's own settings and PyTorch's for its NCCL process groups.
FORWARDED_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def actor_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's settings an actor needs, for `runtime_env={"env_vars": ...}`; never a secret.

    >>> actor_env_vars({"HF_HOME": "/hf", "NCCL_SOCKET_IFNAME": "eth0", "TORCH_NCCL_BLOCKING_WAIT": "1",
    ...                 "OPENAI_API_KEY": "sk-x", "NCCLX": "no", "PATH": "/bin"})
    {'HF_HOME': '/hf', 'NCCL_SOCKET_IFNAME': 'eth0', 'TORCH_NCCL_BLOCKING_WAIT': '1'}
    """
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_PREFIXES)}


def secret_env(env_cfgs: Iterable[EnvConfig], environ: Mapping[str, str] | None = None) -> dict[str, SecretStr]:
    """The API key variables the environments name (`api_key_env`) that the driver has set, for
    an actor's arguments (a variable the driver lacks is left out: the actor then fails as the
    driver would, naming it).

    >>> keys = secret_env([EnvConfig(name="gpt", kind="openai", model="m", base_url="http://x/v1",
    ...                              api_key_env="OPENAI_API_KEY")], {"OPENAI_API_KEY": "sk-secret"})
    >>> keys
    {'OPENAI_API_KEY': SecretStr('**********')}
    """
    environ = os.environ if environ is None else environ
    return {cfg.api_key_env: SecretStr(environ[cfg.api_key_env]) for cfg in env_cfgs
            if cfg.api_key_env and environ.get(cfg.api_key_env)}


def apply_secret_env(secrets: Mapping[str, SecretStr] | None) -> None:
    """Inside an actor: put the driver's secrets into this process's environment (the driver's
    value wins over one the node may have: the run uses the key its user gave)."""
    for name, value in (secrets or {}).items():
        os.environ[name] = value.get_secret_value()
