"""Settings of one environment LLM (`environment:` and each `eval.environments` entry).

The environment clients (`prompt_r1.env`) and the baselines need only this model, not the whole
experiment config (`prompt_r1.config.experiment`), which holds it in `environment`, `eval.environments` and
`eval.baselines.optimizer`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field, model_validator

from prompt_r1.config.base import SafeName, StrictModel
from prompt_r1.config.identity import when_set


# What the environment is told before the conversation (the reference's wording): the agent's earlier
# prompts and the environment's own replies come as chat turns, and the new prompt builds on them.
ENV_SYSTEM_PROMPT = (
    "You are a helpful assistant. Please read the provided content (including previous conversations "
    "and the current task) and help the user complete the task or answer the question."
)
MAX_TIMEOUT_S = 3600.0
MAX_RETRIES = 20


class EnvConfig(StrictModel):
    """One environment LLM: where it runs, how it samples, and the limits of a call to it.

    >>> EnvConfig(kind="openai", model="m")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    pydantic_core._pydantic_core.ValidationError: 1 validation error for EnvConfig
      Value error, kind=openai needs base_url ...
    """

    name: SafeName = Field("env", description="Short name used in tables, MLflow tags and file names.")
    kind: Literal["openai", "vllm", "inprocess"] = Field(
        "inprocess",
        description="`openai` = any OpenAI-compatible URL; `vllm` = managed local vLLM server; "
        "`inprocess` = transformers model in this process.",
    )
    model: str = Field("tiny", description="Model name (openai) or model id/folder (vllm, inprocess).")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="kind=inprocess: where its model generates (`cuda`: the GPU its process sees, e.g. the "
        "rollout actor's share under `agent.device: cuda`). Other kinds run where their server runs.",
        json_schema_extra=when_set())
    base_url: str | None = Field(None, description="OpenAI-compatible base URL (kind=openai).")
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key (never the key)."
    )
    system_prompt: str | None = Field(
        ENV_SYSTEM_PROMPT,
        description="System message put before every conversation sent to the environment (rollouts and "
        "the direct/cot baselines); None or empty = no system message.",
    )
    max_tokens: int = Field(128, ge=1, description="Reply token limit.")
    temperature: float = Field(0.0, ge=0.0, description="Environment sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Environment nucleus sampling.")
    seed: int | None = Field(0, description="Sampling seed sent to the server (None = send none).")
    stop: list[str] = Field(
        default_factory=list,
        description="Strings that end a reply (e.g. `\\n\\nUser:` for base models that keep writing turns).",
    )
    concurrency: int = Field(
        16, ge=1, le=4096,
        description="Maximum simultaneous calls. A managed vLLM server on CPU runs this many requests at once "
        "and sizes its KV cache for that many 4096-token sequences (more requests wait in its queue).",
    )
    timeout_s: float = Field(
        60.0, gt=0, le=MAX_TIMEOUT_S, description="Deadline of one attempt in seconds: connecting, the headers and the whole body "
        "(a server that sends its reply a byte at a time is cut off too), then the call retries."
    )
    max_retries: int = Field(
        4, ge=0, le=MAX_RETRIES,
        description="Retries of one call after its first attempt: timeouts, connection errors, HTTP "
        "408/409/429/5xx and malformed 200 bodies (other 4xx fail at once).",
    )
    backoff_s: float = Field(
        0.5, ge=0.01, le=60.0,
        description="Shortest pause before a retry: retry n waits backoff_s * 2**n (at most 60 s) plus up "
        "to 25% jitter, never less; longer when the server's Retry-After asks for more.",
    )
    max_retry_after_s: float = Field(
        60.0, ge=0.0, le=MAX_TIMEOUT_S,
        description="Longest Retry-After (or Retry-After-Ms) honoured: a server asking for up to this long "
        "is waited for, one asking for longer fails the call at once (recorded, naming this setting).",
    )
    call_deadline_s: float = Field(
        300.0, gt=0, le=4 * MAX_TIMEOUT_S,
        description="Overall deadline of one environment call: waiting for a free slot, every attempt and "
        "every backoff. A call that reaches it fails (recorded) instead of retrying further.",
    )
    max_reply_bytes: int = Field(
        256 * 1024, ge=1024, le=64 * 1024 * 1024,
        description="Largest response body read from an OpenAI-compatible server; a larger one fails the "
        "call (recorded) instead of being read and tokenised.",
    )
    cache: bool = Field(
        True, description="Cache replies in DuckDB keyed on endpoint, model, chat template, messages and sampling."
    )
    chat_template: str | None = Field(
        None, description="Jinja chat template for base models without one (vllm/inprocess)."
    )
    port: int | None = Field(None, description="Port for a managed vLLM server (None = free port).")
    gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1.0,
        description="Share of GPU memory a managed vLLM server takes. On CPU its KV cache is sized from the "
        "model and `concurrency` instead (for a model without a local config.json: 2 GiB).",
    )
    startup_timeout_s: float = Field(600.0, gt=0, description="Wait limit for a managed server.")
    enforce_eager: bool = Field(
        True, description="Managed vLLM server without graph compilation (`--enforce-eager`): starts "
        "in well under a minute on CPU instead of about 2 minutes; turn off for GPU throughput.",
    )
    max_error_rate: float = Field(
        0.05, ge=0.0, le=1.0,
        description="Largest share of this environment's calls that may fail (after retries) in one training "
        "step, one validation, one evaluation or one baseline optimisation; above it the run stops (exit 3) "
        "naming the environment and its first error (a failed optimisation's rows count as failed).",
    )
    description: str = Field(
        "", max_length=300,
        description="One line about this environment LLM (e.g. `a 135M chat model: short answers, little "
        "world knowledge`) for the agent's prompt under `agent.describe_environment`; empty = its name and model.",
        json_schema_extra=when_set(),
    )
    price_per_1k_prompt: float = Field(0.0, ge=0, description="USD per 1k prompt tokens.")
    price_per_1k_completion: float = Field(0.0, ge=0, description="USD per 1k completion tokens.")

    def prompt_description(self) -> str:
        """The line `agent.describe_environment` puts in the agent's prompt (whitespace folded to one line).

        >>> EnvConfig(name="smol", model="smollm2-135m-instruct").prompt_description()
        'smol (model smollm2-135m-instruct)'
        >>> EnvConfig(description=" a tiny model,   short answers ").prompt_description()
        'a tiny model, short answers'
        """
        return " ".join((self.description or f"{self.name} (model {self.model})").split())

    @model_validator(mode="after")
    def _check_kind(self) -> "EnvConfig":
        if self.kind == "openai" and not self.base_url:
            raise ValueError("kind=openai needs base_url")
        if self.device == "cuda" and self.kind != "inprocess":
            raise ValueError(f"device=cuda places an in-process model; kind={self.kind} runs where its server runs: "
                             "leave device at cpu")
        return self


class PoolEnvConfig(EnvConfig):
    """One environment of the training pool (`train.environments`): an environment and how often it is drawn."""

    weight: float = Field(
        1.0, gt=0,
        description="Sampling weight in the training pool: each question (and so its whole GRPO group) "
        "draws one environment with probability weight / sum of weights.",
    )

    def env(self) -> EnvConfig:
        """The environment itself, without the pool's weight."""
        return EnvConfig.model_validate(self.model_dump(exclude={"weight"}))


def env_prices(envs: Iterable[EnvConfig]) -> dict[str, tuple[float, float]]:
    """Environment name -> (price_per_1k_prompt, price_per_1k_completion): how `reward.cost` prices
    each call of a trajectory (`core.cost_reward.trajectory_cost`).

    >>> env_prices([EnvConfig(name="big", price_per_1k_completion=0.6)])
    {'big': (0.0, 0.6)}
    """
    return {env.name: (env.price_per_1k_prompt, env.price_per_1k_completion) for env in envs}
