"""Every check a training run makes before anything starts: the one pre-flight.

`prompt-r1 train`, `prompt_r1.train` and the Prefect flows all run it, so a mistake is refused the
same way whichever door a user came in by, before data, models, servers or Ray start. It is two
halves because the session takes its run folder between them: `check_run_settings` starts
nothing; `check_run_capacity` may start (or reach) Ray to count a cluster's GPUs, which a run
folder's owner must do after recording itself (`run_folder.own_run`), so a killed owner's Ray is
found by the next one. `check_run` is both, for callers that hold no run folder yet (the flows'
command line, before Prefect starts); it leaves Ray alone. Two checks need the training pool and
run inside the session once it has it: `check_scaffold_on` (before Ray) and `check_pack_budget_on`
(once the agent's tokenizer is at hand, before the learner or any rollout).
"""

from __future__ import annotations

import logging
from pathlib import Path

from prompt_r1.config.experiment import Config
from prompt_r1.core.questions import QuestionRow

log = logging.getLogger(__name__)


def check_run_settings(cfg: Config) -> None:
    """What the config alone can show wrong, starting nothing: a config that cannot train,
    `train.device` against this machine, models the actors could not load, an `agent.model` that
    names no agent, a managed vLLM server this machine's vLLM cannot run."""
    from prompt_r1.env.vllm_server import check_server_host
    from prompt_r1.models.resolver import check_agent_spec
    from prompt_r1.planning.machine import check_before_ray

    cfg.check_trainable()
    check_before_ray(cfg)
    check_agent_spec(cfg.agent.model, cfg.name)
    for env_cfg in cfg.training_environments():
        check_server_host(env_cfg)


def check_run_capacity(cfg: Config, start_ray: bool = True) -> None:
    """Whether the run fits where it would run: more actors (rollout, learner ranks) than a local
    Ray instance can start, and, when the run would use GPUs, a plan that does not fit them
    (`prompt-r1 plan`). Whether a one-rank learner on `train.device` auto or cuda runs in Ray is
    Ray's to say (does it see a GPU), so that check starts Ray; with `start_ray` False such a rank
    is left to the session's own check. A cluster's address is reached either way (the plan
    counts its GPUs)."""
    from prompt_r1.cluster.connect import check_local_cpus
    from prompt_r1.planning.machine import preflight

    train = cfg.train
    check_local_cpus(cfg.rollout, learner_ranks=_learner_ranks(cfg, start_ray), cpus_per_rank=train.cpus_per_rank)
    preflight(cfg)


def _learner_ranks(cfg: Config, start_ray: bool) -> int:
    """Learner ranks that run as Ray actors (`learner_in_ray`), asked of Ray only when `start_ray`
    or Ray already runs; 0 for an unanswered one-rank learner."""
    import ray

    from prompt_r1.learner.base import learner_in_ray

    train = cfg.train
    if train.world_size > 1:
        return train.world_size
    if train.device == "cpu" or not (start_ray or ray.is_initialized()):
        return 0
    return train.world_size if learner_in_ray(cfg) else 0


def check_run(cfg: Config) -> None:
    """Both halves, for a caller that holds no run folder yet (the flows' command line): Ray is
    not started for them, since the run folder's owner must record itself first."""
    check_run_settings(cfg)
    check_run_capacity(cfg, start_ray=False)


def check_scaffold_on(cfg: Config, questions: list[QuestionRow]) -> None:
    """`rollout.scaffold.fn`, loaded and called once per training question: one that cannot be
    imported, fails, or names a gold answer or a privileged name stops the run before any model loads."""
    from prompt_r1.rollout.scaffold import FOLLOW_UP, check_scaffold, load_scaffold

    spec, privileged = cfg.rollout.scaffold.fn, cfg.rollout.scaffold.privileged
    if spec is not None:
        checked = check_scaffold(load_scaffold(spec, privileged), questions)
        log.info("scaffold %s: %d training questions checked, none names a gold answer%s", spec, checked,
                 f" or what {privileged} forbids" if privileged else "")
    if cfg.rollout.scaffold.follow_up is not None:  # needs replies: checked on every turn it writes in training
        load_scaffold(cfg.rollout.scaffold.follow_up, privileged, FOLLOW_UP)


def check_pack_budget_on(cfg: Config, model_path: Path | str, questions: list[QuestionRow]) -> None:
    """`train.pack_tokens` against the longest agent prompt of the pool (with the environment's
    description line under `agent.describe_environment`) plus `agent.max_response_tokens`; needs
    the agent's tokenizer, so it runs once the agent's folder is resolved."""
    from transformers import AutoTokenizer

    from prompt_r1.core.tokens import agent_prompt_ids
    from prompt_r1.learner.batches import check_pack_budget

    if not cfg.train.pack_tokens:
        return
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lines = [env.prompt_description() for env in cfg.training_environments()] if cfg.agent.describe_environment else [None]
    lengths = {q.question_id: max(len(agent_prompt_ids(tokenizer, q.question, line)) for line in lines)
               for q in questions}
    check_pack_budget(cfg.train.pack_tokens, cfg.agent.max_response_tokens, lengths)
