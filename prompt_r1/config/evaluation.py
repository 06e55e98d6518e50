"""How a run is evaluated: the `eval` section and its prompt-optimisation `baselines`, and the
rule of where its agent engines run (`engine_place`), stated here for both `evaluate` and `plan`
(the share each takes is `planning.memory.in_process_share`, which needs the whole config).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from prompt_r1.config.base import StrictModel
from prompt_r1.config.env import EnvConfig
from prompt_r1.config.identity import layout, when_set


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
        default_factory=list, description="Datasets the training questions come from (empty = data.train_datasets, or the datasets of data.sources)."
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
    dataset_limits: dict[str, Annotated[int, Field(ge=1, strict=True)]] = Field(  # strict: a boolean is no count
        default_factory=dict,
        description="Questions of the named datasets, in place of `limit_per_dataset` (e.g. `{compositional_probe: "
        "40}` beside 3 per sample dataset); a name that no suite evaluates is an error.",
    )
    environments: list[EnvConfig] = Field(
        default_factory=list, description="Environment LLMs to evaluate against (empty = the training ones: the "
        "`train.environments` pool, else `environment`)."
    )
    environment_suites: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per environment name, the suites (of `suites`) evaluated against it; an environment not "
        "named here gets every suite (e.g. `{gemma3-270m: [sample]}` keeps a slow held-out environment to the "
        "sample datasets). A name that no evaluated environment has is an error.",
        json_schema_extra=when_set(),
    )
    agent_checkpoints: list[str] = Field(
        default_factory=lambda: ["base", "trained"],
        description="`base` (agent.model), `trained` (this run's final checkpoint), `champion` (the registry's), "
        "or any agent spec: a bundled model, a folder, a training run id or a models:/ URI; `LABEL=SPEC` names "
        "it `agent:LABEL` (e.g. `shipped=benchmarks/results/first-call/shipped-agent`), and the "
        "report shows each such agent against `agent:base` as it shows `trained`.",
    )
    examples_per_dataset: int = Field(2, ge=0, description="Trajectories kept for reading.")
    trace_episodes: int = Field(
        50, ge=0,
        description="Agent episodes logged as MLflow traces per environment of an evaluation run (each "
        "environment's nested run), picked evenly over its episodes in method, dataset and question order; "
        "0 = no traces. Every episode stays in the warehouse either way.",
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Agent sampling temperature in evaluation (0 = greedy; the reference uses 0.7)."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Agent nucleus sampling in evaluation (the reference uses 0.8).")
    max_turns: int | None = Field(
        None, ge=1, le=100,
        description="Agent generations per question in evaluation (None = rollout.max_turns; the reference uses 10).",
    )
    agent_placement: Literal["auto", "driver", "ray"] = Field(
        "auto",
        description="Where the agent engines under evaluation run. `driver`: in this process, sharing its first "
        "GPU (agent.vllm_gpu_memory_utilization split between them). `ray`: each a Ray actor in a placement group "
        "of its own with agent.tensor_parallel_size GPUs (on a cluster without GPUs: rollout.cpus_per_worker CPUs), "
        "taking the whole share of its GPUs; a cluster with fewer GPUs than the engines need falls back to `driver` "
        "with a warning. `auto`: `ray` for the vllm backend when Ray counts GPUs, else `driver`.",
        json_schema_extra=layout(),
    )

    @model_validator(mode="after")
    def _environment_suites_are_evaluated(self) -> "EvalConfig":
        for name, suites in self.environment_suites.items():
            unknown = [s for s in suites if s not in self.suites]
            if not suites or unknown:
                what = f"{unknown} are not in eval.suites {self.suites}" if unknown else "names no suite"
                raise ValueError(f"eval.environment_suites[{name!r}]: {what}; name suites that eval.suites "
                                 "evaluates, or leave the environment out to evaluate it on all")
        return self


def engine_place(placement: str, backend: str, engines: int, tensor_parallel_size: int, cluster_gpus: float) -> str:
    """Where evaluation's `engines` agent engines run under `eval.agent_placement` (stated once, for
    `evaluation.engines` and `plan`): `ray` (each in a placement group of its own), `driver` (in the
    driver's process), or `shared` (Ray was the choice but the cluster has fewer GPUs than the
    engines need: in the driver, splitting its first GPU, with a warning).

    >>> [engine_place("auto", "vllm", engines, 1, gpus) for engines, gpus in ((2, 8), (2, 0), (3, 2))]
    ['ray', 'driver', 'shared']
    >>> engine_place("auto", "transformers", 2, 1, 8), engine_place("ray", "transformers", 2, 1, 0)
    ('driver', 'ray')
    """
    if placement == "driver" or engines == 0 or (placement == "auto" and backend != "vllm"):
        return "driver"
    if cluster_gpus == 0:
        return "driver" if placement == "auto" else "ray"  # `ray` without GPUs: CPU actors
    return "shared" if cluster_gpus < engines * tensor_parallel_size else "ray"
