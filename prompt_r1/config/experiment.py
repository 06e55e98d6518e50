"""Typed experiment configuration, validated once at the edge.

Every knob of a run lives in one pydantic model tree loaded from YAML (`configs/*.yaml`).
Unknown keys and bad values are errors that name the key and the file, so a typo never
silently falls back to a default. The same models are flattened into MLflow params and
hashed to identify a run. The sections live beside this module (`sampling`: data, agent;
`rollout`; `reward`; `training`: train; `evaluation`: eval; `env`: one environment; `base`: what
every section shares); this module assembles the whole tree and loads it from YAML with `--set`
overrides. The run home (folders and ids) is `prompt_r1.config.run_home`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from prompt_r1.config.base import ConfigError, SafeName, StrictModel
from prompt_r1.config.env import EnvConfig
from prompt_r1.config.evaluation import BaselinesConfig, EvalConfig
from prompt_r1.config.identity import identity_data, layout
from prompt_r1.config.reward import RewardConfig
from prompt_r1.config.rollout import RolloutConfig
from prompt_r1.config.sampling import AgentConfig, DataConfig, LoraConfig
from prompt_r1.config.tracking import TrackingConfig, default_registered_model
from prompt_r1.config.training import TrainConfig
from prompt_r1.core.urls import redact_url

# the sections, importable from here too (one import for the whole tree)
__all__ = ["AgentConfig", "BaselinesConfig", "Config", "ConfigError", "DataConfig", "EnvConfig", "EvalConfig",
           "LoraConfig", "RewardConfig", "RolloutConfig", "TrackingConfig", "TrainConfig", "flatten", "load_config",
           "parse_config", "parse_overrides"]


class Config(StrictModel):
    name: SafeName = Field("smoke", description="Experiment name (one MLflow experiment per name; a folder under the run home).")
    seed: int = Field(0, description="Seed for data order, sampling and initialisation.")
    data: DataConfig = Field(
        default_factory=DataConfig,
        description="Where questions come from (ingested into the warehouse) and which of them train and validate.",
    )
    agent: AgentConfig = Field(
        default_factory=AgentConfig,
        description="The small agent LLM that is trained: its model, rollout backend, sampling and token limits.",
    )
    environment: EnvConfig = Field(
        default_factory=EnvConfig,
        description="The environment LLM the agent prompts during training when `train.environments` is empty "
        "(and then, when `eval.environments` is empty too, in evaluation, `ask` and `serve`).",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Rollout batches: questions per step, GRPO group size, turns, and the Ray actors that sample them.",
    )
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="Weights of the dual-constrained reward; the defaults are the reference's.",
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig,
        description="The GRPO update (optimiser, clipping, KL, loss aggregation), checkpoints and validation.",
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="Evaluation: methods x datasets x environment LLMs, the agents compared and their decoding.",
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig,
        description="Where runs are tracked (MLflow tracking and registry URI) and the registered model of the "
        "trained agents; never part of the run's identity.",
        json_schema_extra=layout(),
    )

    @model_validator(mode="after")
    def _rollout_device_has_its_gpus(self) -> "Config":
        gpus = self.rollout.gpus_per_worker
        if self.agent.device == "cuda" and not gpus and not self.rollout.colocate:
            raise ValueError("agent.device=cuda with rollout.gpus_per_worker=0: a rollout actor without a GPU share "
                             "sees no GPU; set rollout.gpus_per_worker (1 = a GPU each, 0.25 = four actors on one), "
                             "or rollout.colocate=true to share the learner's GPUs")
        if self.agent.backend == "vllm" and gpus:
            raise ValueError(f"rollout.gpus_per_worker={gpus:g} is the transformers backend's GPU share; a vLLM "
                             "engine takes agent.tensor_parallel_size GPUs: set rollout.gpus_per_worker to 0")
        return self

    @model_validator(mode="after")
    def _packs_hold_a_response(self) -> "Config":
        """A packed sequence must hold at least one whole trajectory: a prompt and a full response."""
        budget, response = self.train.pack_tokens, self.agent.max_response_tokens
        if budget and budget <= response:
            raise ValueError(f"train.pack_tokens {budget} cannot hold one trajectory: agent.max_response_tokens is "
                             f"{response}, and its prompt comes on top; set train.pack_tokens above {response} "
                             "(the longest prompt plus it), or 0 for padded micro-batches")
        return self

    @model_validator(mode="after")
    def _scaffold_has_no_sampler(self) -> "Config":
        """A scaffold's written turn has no sampling log-prob: a rollout correction would weigh it as if the
        sampler had given it probability 1."""
        mode = self.train.rollout_correction.mode
        if self.rollout.scaffold.fn is not None and mode != "off":
            raise ValueError(f"rollout.scaffold with train.rollout_correction.mode={mode}: a scaffold's turn is "
                             "written, not sampled, so it has no sampling log-prob to correct against; set "
                             "train.rollout_correction.mode to off, or unset rollout.scaffold.fn")
        return self

    def hash(self) -> str:
        """Stable short hash of the resolved config (identifies a run's settings).

        Each field's rule (`prompt_r1.config.identity`) says whether it is part of the hash: the
        learner's layout, where evaluation's engines run and where a run is tracked are not (a run
        resumes with another world size as the same run); keys added after runs were recorded count
        only once set, so those runs keep their hash."""
        blob = json.dumps(identity_data(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def registered_model(self) -> str:
        """The registered model this config's agents join (`tracking.registered_model`, else
        `prompt-r1-<name>`): its versions alone compete for its `champion` alias."""
        return self.tracking.registered_model or default_registered_model(self.name)

    def flat(self) -> dict[str, Any]:
        """Dotted-key view for MLflow params."""
        return flatten(self.model_dump(mode="json"))

    def eval_environments(self) -> list[EnvConfig]:
        """`eval.environments`, or else the environments training prompted (`training_environments`):
        a pool config's `environment` section is never trained against, so it is no default to evaluate."""
        return self.eval.environments or self.training_environments()

    def training_environments(self) -> list[EnvConfig]:
        """The environments training draws from: `train.environments`, or the one `environment`."""
        return [entry.env() for entry in self.train.environments] or [self.environment]

    def syncs_on_device(self, learner_device: str) -> bool:
        """Whether the full-weight sync stays on the learner's GPU (handed over by CUDA IPC,
        `core.device_share`): the engines are transformers policies on that same GPU
        (`rollout.colocate`, `agent.device: cuda`), the learner (on `learner_device`, a device type)
        holds every weight alone (world size 1), and the sync is full weights (LoRA's few MiB go
        through the host). vLLM engines and learner groups take the host path."""
        return (self.rollout.colocate and self.agent.backend == "transformers" and self.agent.device == "cuda"
                and learner_device == "cuda" and self.train.world_size == 1 and not self.agent.lora.enabled)

    def training_weights(self) -> list[float]:
        """Sampling weights of `training_environments()`, in the same order."""
        return [entry.weight for entry in self.train.environments] or [1.0]

    def training_problems(self) -> list[str]:
        """Why this config cannot train (empty = it can).

        Checked where training starts, not at load: evaluation-only configs may use a group of
        one or nucleus sampling, and must still validate.
        """
        problems = []
        if self.rollout.group_size < 2:
            problems.append(f"rollout.group_size is {self.rollout.group_size}: GRPO needs >= 2 (a group of "
                            "one has advantage 0 and learns nothing)")
        if self.agent.temperature <= 0:
            problems.append("agent.temperature is 0: greedy groups are identical samples with advantage 0, "
                            "and the ratio of a greedy policy is undefined; use e.g. 1.0")
        if self.agent.top_p < 1:
            problems.append(f"agent.top_p is {self.agent.top_p}: the learner's log-probs do not model the "
                            "nucleus cut, so the optimised policy would not be the one that sampled; use 1.0")
        if self.train.world_size > 1 and self.train.strategy == "fsdp" and self.agent.lora.enabled:
            problems.append("train.strategy is fsdp with agent.lora.enabled: fsdp shards full fine-tuning; a LoRA "
                            "adapter is small, use train.strategy: ddp")
        if self.reward.cost.mode != "off" and not any(
                env.price_per_1k_prompt or env.price_per_1k_completion for env in self.training_environments()):
            problems.append(f"reward.cost.mode is {self.reward.cost.mode} but every training environment's "
                            "price_per_1k_prompt and price_per_1k_completion is 0, so every trajectory costs 0 (under "
                            "bonus each right answer then scores 1 - alpha/2, not 1); set the prices of `environment` "
                            "(or of each train.environments member), or reward.cost.mode: off")
        engine_gpus = self.rollout.num_workers * self.agent.tensor_parallel_size
        if self.rollout.colocate and self.agent.backend == "vllm" and engine_gpus > self.train.world_size:
            problems.append(f"rollout.colocate: {self.rollout.num_workers} engine(s) x agent.tensor_parallel_size "
                            f"{self.agent.tensor_parallel_size} need {engine_gpus} learner GPUs to share, but "
                            f"train.world_size is {self.train.world_size}; lower rollout.num_workers or raise "
                            "train.world_size")
        return problems

    def check_trainable(self, source: str = "config") -> None:
        """Raise ConfigError listing every setting that makes GRPO training wrong or useless."""
        problems = self.training_problems()
        if problems:
            raise ConfigError(f"{source} cannot be used for training:\n  " + "\n  ".join(problems))


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys.

    >>> flatten({"a": {"b": 1, "c": [2]}, "d": "x"})
    {'a.b': 1, 'a.c': '[2]', 'd': 'x'}
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        elif isinstance(value, list):
            out[dotted] = json.dumps(value)
        else:
            out[dotted] = value
    return out


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key `{key}` (check the spelling; see configs/smoke.yaml)")
        else:
            given = e.get("input")  # a URI's password is never echoed
            lines.append(f"  `{key}`: {e['msg']} (got {(redact_url(given) if isinstance(given, str) else given)!r})")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding one key twice: plain YAML keeps the last, so a
    second `train:` block would silently discard the whole first one."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_unique_keys(node, "", set())
        return super().construct_document(node)


def _check_unique_keys(node: yaml.Node, where: str, seen: set[int]) -> None:
    """Walk the composed tree before construction, where each key still has its line (merge keys
    `<<` are YAML's way to override on purpose and are left alone)."""
    if id(node) in seen:  # an alias: checked where its anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{where}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, Any], int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                continue
            name = f"{where}.{key.value}" if where else str(key.value)
            line = key.start_mark.line + 1
            if isinstance(key, yaml.ScalarNode):
                if (key.tag, key.value) in first_line:
                    raise _DuplicateKey(name, first_line[key.tag, key.value], line)
                first_line[key.tag, key.value] = line
            _check_unique_keys(value, name, seen)


def load_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> Config:
    """Load and validate a YAML config; `overrides` are dotted keys (`train.steps: 3`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (try configs/smoke.yaml)")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except _DuplicateKey as dup:
        raise ConfigError(f"config {path}: key `{dup.key}` is given twice, on line {dup.first} and line {dup.second}; "
                          "YAML would keep only the last one, so delete or merge one of them") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                above = ".".join(parents[:depth + 1])
                raise ConfigError(f"override {dotted}: {above} is a single value in {path}, not a section "
                                  f"with keys; set {above}=VALUE instead (docs/config.md lists every key)")
        node[leaf] = value
    return parse_config(data, str(path))


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """`--set key.path=value` pairs; values are read as JSON when they parse, else as strings.

    >>> parse_overrides(["train.steps=3", 'eval.suites=["ood"]', "name=demo"])
    {'train.steps': 3, 'eval.suites': ['ood'], 'name': 'demo'}
    """
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE (e.g. train.steps=3), got {item!r}")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed
