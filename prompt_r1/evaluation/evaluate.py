"""Evaluation: methods x datasets x environment LLMs, scored by one metric implementation.

Methods, and the one rule each uses to extract its prediction:
- `direct`: the bare question to the environment; prediction = the whole reply, stripped.
- `cot`: the question plus a chain-of-thought instruction; prediction = the text after the last
  `Answer:` in the reply (or its last non-empty line when there is none).
- `agent:<ckpt>`: the multi-turn Prompt-R1 protocol with an agent checkpoint, decoding with
  `eval.temperature`/`eval.top_p` for at most `eval.max_turns` generations (greedy and
  `rollout.max_turns` by default); prediction = the `<answer>` of the agent's final turn
  (never text the environment wrote).
- `opro` / `gepa` / `textgrad`: an instruction optimised on training questions within
  `eval.baselines`' budget (`prompt_r1.evaluation.baselines`), appended to the question; prediction as `cot`.
  An optimisation that environment failures made no result is not stored and gives no instruction:
  each of the method's rows is stored with that failure as its `error`.
- `agent_only:<ckpt>`: the agent answers alone, no environment (the paper's "w/o Env"
  ablation); prediction = its `<answer>` when present, else its whole reply.
Every prediction is scored with EM, F1, substring match and SSim; `score` is the dataset's
primary metric. A row whose environment call failed (after the client's retries) is stored with
its `error` and NULL scores, never scored; a cell's means are over its scored rows and `errors`
counts the others. An environment whose share of failed rows passes its `max_error_rate` raises
`EnvironmentFailure` after its rows are written. Environment calls of a suite run concurrently
(bounded by the environment's semaphore); greedy decoding (or seeded sampling) and the
environment cache make reruns reproduce every number.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from prompt_r1.config.experiment import AgentConfig, Config, RolloutConfig
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.failures import check_error_rate, env_ended
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.seeding import NO_STEP, draw_seed
from prompt_r1.evaluation.scoring import Prediction, aggregate, episode_record, examples, score_predictions
from prompt_r1.data.scorers import check_scorers
from prompt_r1.env.judge import use_judges
from prompt_r1.evaluation.questions import EvalError, check_dataset_limits, select_questions, suite_datasets
from prompt_r1.evaluation.answers import AGENT_ONLY_SUFFIX, COT_SUFFIX, extract_agent_only_answer, extract_cot_answer
from prompt_r1.evaluation.turns import evaluation_turns
from prompt_r1.planning.memory import in_process_share
from warehouse.store import Warehouse

log = logging.getLogger(__name__)

@dataclass
class EvalOutcome:
    """What an evaluation produced: for every environment, or (a part) for one."""

    predictions: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    env_error_rates: dict[str, float] = field(default_factory=dict)  # env name -> share of failed rows
    baselines: list[dict[str, Any]] = field(default_factory=list)  # optimised instructions and their spend
    episodes: list[dict[str, Any]] = field(default_factory=list)  # every agent episode, `episode_record`s
    suites: dict[str, list[str]] = field(default_factory=dict)  # suite -> its datasets, as evaluated
    turns: list[dict[str, Any]] = field(default_factory=list)  # what the agent did per cell (`turns.turn_rows`)

    def add(self, part: "EvalOutcome") -> None:
        """Take in one environment's part (its rows, episodes, spend, times and error rate)."""
        self.predictions += part.predictions
        self.results += part.results
        self.examples += part.examples
        self.baselines += part.baselines
        self.episodes += part.episodes
        self.seconds.update(part.seconds)
        self.env_error_rates.update(part.env_error_rates)


# `on_environment(env_cfg, work)`: runs one environment's part of an evaluation; calls `work()`
# (which evaluates that environment, writes its rows and returns its part) and returns its result.
EnvironmentHook = Callable[[EnvConfig, Callable[[], EvalOutcome]], EvalOutcome]


async def _env_method(env, questions: list[QuestionRow], method: str, concurrent: bool,
                      instruction: str | None = None) -> list[Prediction]:
    """`direct`, `cot`, or a baseline's optimised `instruction` (evaluated with the `cot` rule)."""
    suffix = COT_SUFFIX if method == "cot" else ("\n" + instruction if instruction is not None else "")
    cot_rule = method == "cot" or instruction is not None

    async def one(q: QuestionRow) -> Prediction:
        reply = await env.reply([{"role": "user", "content": q.question + suffix}])
        if reply.call.error is not None:
            return Prediction(q, method, "", 1, reply.call.prompt_tokens, reply.call.completion_tokens,
                              error=reply.call.error)
        text = extract_cot_answer(reply.text) if cot_rule else reply.text.strip()
        return Prediction(q, method, text, 1, reply.call.prompt_tokens, reply.call.completion_tokens)

    bar = tqdm(total=len(questions), desc=f"{env.name}:{method}", leave=False)
    results: list[Prediction] = []
    if concurrent:
        tasks = [asyncio.ensure_future(one(q)) for q in questions]
        for task in tasks:
            task.add_done_callback(lambda _: bar.update())
        results = list(await asyncio.gather(*tasks))
    else:
        for q in questions:
            results.append(await one(q))
            bar.update()
    bar.close()
    return results


def eval_agent(cfg: Config) -> AgentConfig:
    """The agent's settings for evaluation: `eval.temperature` and `eval.top_p` (greedy by default),
    on CPU with the transformers backend: `agent.device` places training's rollout actors, whose GPU
    shares evaluation's engines, `ask` and `serve` do not hold (vLLM places itself).

    >>> from prompt_r1.config.experiment import parse_config
    >>> a = eval_agent(parse_config({"eval": {"temperature": 0.7, "top_p": 0.8}}))
    >>> (a.temperature, a.top_p), (eval_agent(Config()).temperature, eval_agent(Config()).top_p)
    ((0.7, 0.8), (0.0, 1.0))
    """
    return cfg.agent.model_copy(update={"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p, "device": "cpu"})


def eval_rollout(cfg: Config) -> RolloutConfig:
    """The rollout settings for evaluation: `eval.max_turns` generations (default `rollout.max_turns`).

    >>> from prompt_r1.config.experiment import parse_config
    >>> eval_rollout(parse_config({"rollout": {"max_turns": 3}, "eval": {"max_turns": 10}})).max_turns
    10
    >>> eval_rollout(parse_config({"rollout": {"max_turns": 3}})).max_turns
    3
    """
    return cfg.rollout.model_copy(update={"max_turns": cfg.eval.max_turns or cfg.rollout.max_turns})


def eval_batch(cfg: Config) -> int:
    """Agent episodes evaluated together: a training step's trajectories, and with the vllm backend
    at least `agent.vllm_max_num_seqs`, the sequences its engine's KV cache is sized to run at once
    (a small training batch would otherwise leave the engine mostly idle between turns).

    >>> from prompt_r1.config.experiment import parse_config
    >>> shape = {"rollout": {"batch_questions": 2, "group_size": 4}}
    >>> eval_batch(parse_config(shape)), eval_batch(parse_config({**shape, "agent": {"backend": "vllm", "vllm_max_num_seqs": 32}}))
    (8, 32)
    """
    batch = cfg.rollout.batch_questions * cfg.rollout.group_size
    if cfg.agent.backend == "vllm":
        batch = max(batch, cfg.agent.vllm_max_num_seqs)
    return max(1, batch)


async def _agent_method(policy, env, questions, cfg: Config, label: str, seed: int) -> list[Prediction]:
    from prompt_r1.rollout.episode import rollout_batch
    from prompt_r1.rollout.scaffold import assert_unscaffolded

    preds: list[Prediction] = []
    batch = eval_batch(cfg)
    for start in tqdm(range(0, len(questions), batch), desc=f"{env.name}:agent:{label}", leave=False):
        chunk = questions[start : start + batch]
        trajs = await rollout_batch(policy, env, chunk, eval_agent(cfg), eval_rollout(cfg), cfg.reward,
                                    group_size=1, seed=seed)
        assert_unscaffolded(trajs, f"evaluation of agent:{label}")
        by_id = {t.question_id: t for t in trajs}
        preds += [agent_prediction(q, by_id[q.question_id], label) for q in chunk]
    return preds


def agent_prediction(question: QuestionRow, t, label: str) -> Prediction:
    """An agent episode as a prediction. Only an environment failure is its `error` here: an answer
    whose LLM judgement failed in the rollout's reward stage is scored again by `score_predictions`
    (the judge's reply is kept), which records that drop as the judge's (`judge_failed`), apart from
    the environment's failures and their `max_error_rate`."""
    return Prediction(question, f"agent:{label}", t.answer, len(t.agent_turns),
                      sum(c.prompt_tokens for c in t.env_calls), sum(c.completion_tokens for c in t.env_calls),
                      trajectory=t.to_record(), error=t.error if env_ended(t) else None)


def _agent_only(policy, questions: list[QuestionRow], agent_cfg: AgentConfig, label: str, seed: int) -> list[Prediction]:
    from prompt_r1.core.tokens import chat_prompt_ids  # imports torch: only when an agent is evaluated

    prompts = [chat_prompt_ids(policy.tokenizer,
                               [{"role": "user", "content": f"Question: {q.question}{AGENT_ONLY_SUFFIX}"}])
               for q in questions]
    samples = policy.generate(prompts, agent_cfg.max_new_tokens,
                              [draw_seed(seed, NO_STEP, q.question_id, 0, 0) for q in questions])
    return [Prediction(q, f"agent_only:{label}", extract_agent_only_answer(s.text), 0)
            for q, s in zip(questions, samples)]


class EvalAgents:
    """The agents under evaluation, opened once however many environments they meet (the
    `evaluate` flow runs one task per environment): their policies, and their `agent_only` rows,
    which do not depend on the environment. Close it (or use `with`): a vLLM agent engine holds
    its KV cache until closed. The engines run in this process or as Ray actors with GPUs of their
    own (`eval.agent_placement`, `prompt_r1.evaluation.engines`); either way a policy here has the
    one `Policy` interface."""

    def __init__(self, cfg: Config, agents: Mapping[str, Path | str]):
        self.cfg, self.paths = cfg, {label: Path(path) for label, path in agents.items()}
        self._policies: dict[str, Any] | None = None
        self._agent_only: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}

    @property
    def policies(self) -> dict[str, Any]:
        """label -> policy, built on first use (none when no agent method is configured)."""
        if self._policies is None:
            from prompt_r1.evaluation.engines import engines_in_ray, ray_policies
            from prompt_r1.policy import make_policy

            built: dict[str, Any] = {}
            try:
                if {"agent", "agent_only"} & set(self.cfg.eval.methods):
                    in_ray = engines_in_ray(self.cfg, len(self.paths))
                    # in Ray each engine has GPUs of its own; in this process they split its first GPU's share
                    share = in_process_share(self.cfg, 1 if in_ray else len(self.paths))
                    agent = eval_agent(self.cfg).model_copy(update={"vllm_gpu_memory_utilization": share})
                    if in_ray:
                        built = ray_policies(self.cfg, agent, self.paths)
                    else:
                        for label, path in self.paths.items():
                            built[label] = make_policy(agent, path, seed=self.cfg.seed)
            except BaseException:  # close what was built: no engine is left holding memory
                for policy in built.values():
                    policy.close()
                raise
            self._policies = built
        return self._policies

    def agent_only_rows(self, questions: list[QuestionRow], seconds: dict[str, float]) -> dict[str, list[dict[str, Any]]]:
        """label -> scored `agent_only` rows for `questions`, generated once per agent and question
        list; the first generation's time goes to `seconds`."""
        key = tuple(q.question_id for q in questions)
        rows = {}
        for label, policy in self.policies.items():
            if (label, key) not in self._agent_only:
                t0 = time.perf_counter()
                preds = _agent_only(policy, questions, eval_agent(self.cfg), label, self.cfg.seed)
                self._agent_only[label, key] = score_predictions(preds)
                seconds[f"agent_only:{label}"] = time.perf_counter() - t0
            rows[label] = self._agent_only[label, key]
        return rows

    def close(self) -> None:
        """Close the policies; the next use of `policies` builds them again."""
        for policy in (self._policies or {}).values():
            policy.close()
        self._policies = None

    def __enter__(self) -> EvalAgents:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate(
    cfg: Config,
    warehouse: Warehouse,
    run_id: str,
    agents: Mapping[str, Path | str] | EvalAgents,
    environments: Sequence[EnvConfig] | None = None,
    log_dir: Path | None = None,
    concurrent: bool = True,
    on_environment: EnvironmentHook | None = None,
) -> EvalOutcome:
    """Run every configured method on the configured suites against each environment: the one
    evaluation loop, for the CLI, the Python API and the flows.

    `agents` maps a label (`base`, `trained`, ...) to a model folder, opened here and closed at
    the end; or is an open `EvalAgents`, which the caller closes. Rows are written to the
    warehouse per environment (one transaction each), so a failure keeps earlier environments.
    `on_environment` wraps each environment's part (`EnvironmentHook`): the flows run it as a
    Prefect task and log it to MLflow; by default it simply runs.
    """
    check_dataset_limits(warehouse, cfg)
    questions = select_questions(warehouse, cfg.eval.suites, cfg.eval.limit_per_dataset, cfg.eval.dataset_limits)
    use_judges(cfg.data.judges, warehouse)  # the LLM judges a dataset's scorer may name (opened when first asked)
    check_scorers(questions, cfg.data.scorer_timeout_s)  # one that cannot load stops here, before any model loads
    if not questions:
        raise EvalError(f"no questions for suites {cfg.eval.suites}; ingest data first")
    environments = list(environments or cfg.eval_environments())
    outcome = EvalOutcome(suites={s: sorted({d for d, _ in suite_datasets(warehouse, [s])}) for s in cfg.eval.suites})
    by_environment = environment_questions(cfg, environments, questions, outcome.suites)
    opened = agents if isinstance(agents, EvalAgents) else EvalAgents(cfg, agents)
    run_part = on_environment or (lambda env_cfg, work: work())
    try:
        agent_only_rows = opened.agent_only_rows(questions, outcome.seconds) if "agent_only" in cfg.eval.methods else {}
        for env_cfg in environments:
            def work(env_cfg: EnvConfig = env_cfg) -> EvalOutcome:
                return _evaluate_environment(cfg, warehouse, run_id, env_cfg, by_environment[env_cfg.name], opened,
                                             agent_only_rows, outcome.suites, concurrent, log_dir)
            outcome.add(run_part(env_cfg, work))
        outcome.turns = evaluation_turns(cfg, outcome.episodes, questions)
    except BaseException:
        opened.close()  # a crash may have broken an agent engine: a retry with the same agents builds them anew
        raise
    finally:
        if opened is not agents:
            opened.close()
    return outcome


def environment_questions(cfg: Config, environments: Sequence[EnvConfig], questions: list[QuestionRow],
                          suites: Mapping[str, Sequence[str]]) -> dict[str, list[QuestionRow]]:
    """Environment name -> the questions evaluated against it: those of its `eval.environment_suites`
    entry's datasets, or all of them."""
    names = {e.name for e in [*cfg.eval_environments(), *environments]}  # a call may evaluate some of them
    unknown = sorted(set(cfg.eval.environment_suites) - names)
    if unknown:
        raise EvalError(f"eval.environment_suites names {unknown}, which no evaluated environment has "
                        f"({sorted(names)}); use the environments' names")
    out = {}
    for env_cfg in environments:
        wanted = cfg.eval.environment_suites.get(env_cfg.name)
        datasets = {d for s in wanted for d in suites[s]} if wanted else None
        out[env_cfg.name] = [q for q in questions if datasets is None or q.dataset in datasets]
    return out


def _evaluate_environment(cfg: Config, warehouse: Warehouse, run_id: str, env_cfg: EnvConfig,
                          questions: list[QuestionRow], opened: EvalAgents,
                          agent_only_rows: dict[str, list[dict[str, Any]]], suites: dict[str, list[str]],
                          concurrent: bool, log_dir: Path | None) -> EvalOutcome:
    """One environment's part: every method against it, its rows written to the warehouse (failures
    included, before any stop), then its error rate checked (`EnvironmentFailure` past `max_error_rate`)."""
    from prompt_r1.env import open_environment
    from prompt_r1.env.base import cost_usd

    part = EvalOutcome(suites=suites)
    log.info("evaluating against environment %s (%s, %s)", env_cfg.name, env_cfg.kind, env_cfg.model)
    with open_environment(env_cfg, warehouse=warehouse, log_dir=log_dir) as env:
        # One event loop per environment: async clients stay bound to the loop they started in.
        env_rows = asyncio.run(_evaluate_env(env, cfg, questions, opened.policies, agent_only_rows, part,
                                              concurrent, warehouse))
    for r in env_rows:
        r["env_name"] = env_cfg.name
    for e in part.examples:
        e["env_name"] = env_cfg.name
    for e in part.episodes:
        e.update(env_name=env_cfg.name, env_model=env_cfg.model)
        for call in e["env_calls"]:  # prices are per environment: input and output apart
            call["input_cost_usd"] = cost_usd(env_cfg, call["prompt_tokens"], 0)
            call["output_cost_usd"] = cost_usd(env_cfg, 0, call["completion_tokens"])
    part.results = aggregate(env_rows, env_cfg)
    warehouse.write_eval(run_id, env_rows, part.results)  # failures included: recorded before any stop
    part.predictions = env_rows
    part.env_error_rates[env_cfg.name] = check_error_rate(
        env_cfg.name, [r.get("error") for r in env_rows  # a judge's failures are checked by score_many
                       if not r["method"].startswith("agent_only") and not r.get("judge_failed")],
        env_cfg.max_error_rate, "evaluation")
    return part


async def _evaluate_env(env, cfg: Config, questions, policies, agent_only_rows, outcome: EvalOutcome,
                        concurrent: bool, warehouse: Warehouse | None = None) -> list[dict[str, Any]]:
    env_rows: list[dict[str, Any]] = []
    try:
        for method in cfg.eval.methods:
            t0 = time.perf_counter()
            if method in ("direct", "cot"):
                rows = score_predictions(await _env_method(env, questions, method, concurrent))
            elif method in ("opro", "gepa", "textgrad"):  # optimise (or reuse) an instruction, then evaluate it
                from prompt_r1.evaluation.baselines import OptimisationFailed, optimised_instruction

                try:
                    opt = await optimised_instruction(method, env, cfg, warehouse)
                except OptimisationFailed as err:  # no instruction to evaluate: every row is that failure
                    log.error("%s", err)
                    outcome.baselines.append({"env_name": env.name, "method": method, "instruction": "",
                                              "train_score": None, "cached": False,
                                              "cache_key": err.result.cache_key, "error": str(err),
                                              **err.result.spend})
                    rows = score_predictions([Prediction(q, method, "", 0, error=str(err)) for q in questions])
                else:
                    outcome.baselines.append({"env_name": env.name, "method": method,
                                              "instruction": opt.instruction, "train_score": opt.train_score,
                                              "cached": opt.cached, "cache_key": opt.cache_key, **opt.spend})
                    rows = score_predictions(await _env_method(env, questions, method, concurrent,
                                                               opt.instruction))
            elif method == "agent":
                rows = []
                for label, policy in policies.items():
                    preds = await _agent_method(policy, env, questions, cfg, label, cfg.seed)
                    scored = score_predictions(preds)
                    rows += scored
                    outcome.examples += examples(preds, cfg.eval.examples_per_dataset)
                    outcome.episodes += [episode_record(p, r) for p, r in zip(preds, scored, strict=True)]
            else:
                asked = {q.question_id for q in questions}  # this environment's (eval.environment_suites)
                rows = [dict(r) for label in policies for r in agent_only_rows[label] if r["question_id"] in asked]
            outcome.seconds[f"{env.name}:{method}"] = time.perf_counter() - t0
            env_rows += rows
    finally:
        await env.aclose()
    return env_rows
