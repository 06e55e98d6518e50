"""The `rollout` section: how many trajectories a step samples, where (Ray actors and their
deadlines), how stale their weights may be, and the scaffold that proposes some members' first turn.

A strict pydantic model whose fields carry their help (`description`), from which `docs/config.md`
is generated; `prompt_r1.config.experiment` puts it in the whole tree.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from prompt_r1.config.base import StrictModel
from prompt_r1.config.identity import layout, when_set
from prompt_r1.core.scorer import SPEC_PATTERN


class ScaffoldConfig(StrictModel):
    """Guided exploration (`prompt_r1.rollout.scaffold`): a task's function proposes the first agent turn
    (and, with `follow_up`, later ones) of some members of each training group; off while `fn` is unset."""

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
    follow_up: str | None = Field(
        None, pattern=SPEC_PATTERN,
        description="Import path of a function called as `follow_up(question, replies)` for the scaffolded "
        "members after each environment reply (`replies`: the episode's replies so far, a tuple of str): the "
        "text of their next interaction turn, or None to let the policy write it. Checked like `fn`'s turn, "
        "except that it may name what a reply of the episode named. The two-hop task's: "
        "`prompt_r1.data.first_call:second_hop_scaffold` (asks the second hop about the country the first "
        "reply named).",
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
        if scaffold.fn is None and (scaffold.members or scaffold.ce_coef or scaffold.follow_up):
            raise ValueError("rollout.scaffold.members / ce_coef / follow_up are set but rollout.scaffold.fn is "
                             "not: name the task's scaffold function, or leave the section out")
        return self
