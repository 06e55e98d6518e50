"""Training against a pool of environment LLMs (`train.environments`).

The rules under test: each question draws one environment by the seed rule, so its whole GRPO
group prompts the same one; a pool of one is today's run, exactly; each trajectory records its
environment (also in warehouse files made before pools); error rates are checked per environment
against its own limit; managed servers start for each pool member; per-environment metrics use the
pooled rule on each environment's trajectories; `agent.describe_environment` off leaves the agent's
prompt as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path

import duckdb
import pytest

from prompt_r1.config.env import EnvConfig, PoolEnvConfig
from prompt_r1.config.experiment import load_config
from prompt_r1.core.failures import EnvironmentFailure, check_pool_error_rates
from prompt_r1.core.protocol import INSTRUCTION, build_agent_prompt
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.seeding import draw_environment
from prompt_r1.core.trajectory import EnvCall, Trajectory, rollout_stats


def smoke():
    return load_config("configs/smoke.yaml")


def pool_of(cfg, *envs: EnvConfig, weights=None):
    """`cfg` training against `envs` (a `train.environments` pool)."""
    weights = weights or [1.0] * len(envs)
    entries = [PoolEnvConfig.model_validate({**e.model_dump(), "weight": w}) for e, w in zip(envs, weights)]
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"environments": entries})})


# -- the draw ------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 3.0], [0.5, 2.0, 1.5]])
def test_environment_draws_follow_the_weights(weights):
    """Stated independently: over many questions each environment is drawn about weight/total of
    the time (binomial margin of 5 standard deviations), and the draw is a pure function."""
    n = 4000
    draws = [draw_environment(7, 3, f"q{i}", weights) for i in range(n)]
    assert draws == [draw_environment(7, 3, f"q{i}", weights) for i in range(n)]
    for index, weight in enumerate(weights):
        p = weight / sum(weights)
        assert abs(draws.count(index) - n * p) < 5 * math.sqrt(n * p * (1 - p)), (index, draws.count(index))
    # another step redraws: over steps a question meets every environment
    assert {draw_environment(7, s, "q0", weights) for s in range(60)} == set(range(len(weights)))


def test_a_pool_of_one_draws_nothing():
    assert {draw_environment(s, s, f"q{s}", [2.5]) for s in range(50)} == {0}
    with pytest.raises(ValueError, match="positive"):
        draw_environment(0, 0, "q", [1.0, 0.0])


class NamedEnv:
    """A stand-in environment that answers with its own name and counts its calls."""

    def __init__(self, cfg: EnvConfig):
        self.cfg, self.name, self.model = cfg, cfg.name, cfg.model
        self.calls = 0

    async def reply(self, messages, turn=0):
        from prompt_r1.env.base import EnvReply

        self.calls += 1
        return EnvReply(f"reply from {self.name}", EnvCall(turn=turn, env_name=self.name, model=self.model))


def _questions(n: int) -> list[QuestionRow]:
    return [QuestionRow(f"q{i}", "sample", "train", f"What is {i} + {i}?", [str(2 * i)], "standard_qa", "f1")
            for i in range(n)]


def _rollout(cfg, envs, weights, questions, step=4):
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.policy.hf import TransformersPolicy
    from prompt_r1.rollout.episode import rollout_batch

    policy = TransformersPolicy(resolve_model("tiny-protocol"), temperature=1.0)
    return asyncio.run(rollout_batch(policy, envs, questions, cfg.agent, cfg.rollout, cfg.reward,
                                     group_size=3, seed=5, step=step, env_weights=weights))


def test_each_group_prompts_the_environment_its_question_drew(_model_cache):
    cfg = smoke()
    envs = [NamedEnv(EnvConfig(name="small")), NamedEnv(EnvConfig(name="large"))]
    weights = [1.0, 2.0]
    trajectories = _rollout(cfg, envs, weights, _questions(8))
    for t in trajectories:
        expected = envs[draw_environment(5, 4, t.question_id, weights)].name
        assert t.env_name == expected
        assert all(c.env_name == expected for c in t.env_calls)
        assert all(reply == f"reply from {expected}" for reply in t.env_replies)
    assert {t.env_name for t in trajectories} == {"small", "large"}  # both drawn among 8 questions
    assert sum(e.calls for e in envs) == sum(len(t.env_calls) for t in trajectories)


# -- the agent's prompt ------------------------------------------------------------------------
def test_describe_environment_off_leaves_the_prompt_as_it_was_and_on_names_the_drawn_one(_model_cache):
    from prompt_r1.core.tokens import chat_prompt_ids

    cfg = smoke()
    assert not cfg.agent.describe_environment
    # the reference's prompt, stated here independently of build_agent_prompt
    assert build_agent_prompt(" Who? ") == f"Question: Who?\n{INSTRUCTION}"
    envs = [NamedEnv(EnvConfig(name="small", description="a 135M chat model")),
            NamedEnv(EnvConfig(name="large", model="gemma"))]
    plain = _rollout(cfg, envs, [1.0, 1.0], _questions(4))
    from prompt_r1.models.bundled import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-protocol"))
    for t in plain:
        question = f"What is {t.question_id[1:]} + {t.question_id[1:]}?"
        assert t.prompt_ids == chat_prompt_ids(tokenizer, [{"role": "user", "content": f"Question: {question}\n"
                                                            f"{INSTRUCTION}"}])
    described = _rollout(cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"describe_environment": True})}),
                         envs, [1.0, 1.0], _questions(4))
    lines = {"small": "a 135M chat model", "large": "large (model gemma)"}
    for t in described:
        text = tokenizer.decode(t.prompt_ids)
        assert f"The large language model you will interact with: {lines[t.env_name]}" in text


# -- configs ------------------------------------------------------------------------------------
def test_new_keys_at_their_defaults_keep_the_config_hash(monkeypatch):
    from prompt_r1.config.experiment import Config

    cfg = smoke()
    now = cfg.hash()
    dump = Config.model_dump

    def before_pools(self, **kwargs):  # the config as dumped before these keys existed
        data = dump(self, **kwargs)
        data["agent"].pop("describe_environment")
        for env in (data["environment"], *data["eval"]["environments"]):
            env.pop("description")
        return data

    monkeypatch.setattr(Config, "model_dump", before_pools)
    assert cfg.hash() == now
    monkeypatch.undo()
    described = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"describe_environment": True})})
    named = cfg.model_copy(update={"environment": cfg.environment.model_copy(update={"description": "tiny"})})
    assert len({cfg.hash(), described.hash(), named.hash()}) == 3
    assert pool_of(cfg, cfg.environment).hash() != cfg.hash()  # a pool is another run, even of one


# -- error rates per environment -------------------------------------------------------------
def _with_calls(env_name: str, failed: int, ok: int) -> list[Trajectory]:
    calls = [EnvCall(0, env_name, "m", error="HTTP 500") for _ in range(failed)]
    calls += [EnvCall(0, env_name, "m") for _ in range(ok)]
    return [Trajectory("q", i, [], env_name=env_name, env_calls=[c]) for i, c in enumerate(calls)]


def test_error_rates_are_checked_per_environment_against_its_own_limit():
    lenient, strict = EnvConfig(name="lenient", max_error_rate=0.5), EnvConfig(name="strict", max_error_rate=0.05)
    # 1 of 10 failed on `strict`: 10% > 5%, while the pool's share (1 of 30) is under both limits
    trajectories = _with_calls("lenient", 0, 20) + _with_calls("strict", 1, 9)
    with pytest.raises(EnvironmentFailure, match="environment `strict`: 1 of 10 calls failed in step 3") as err:
        check_pool_error_rates([lenient, strict], trajectories, "step 3")
    assert err.value.env_name == "strict"
    # 2 of 10 failed on `lenient` (20% <= 50%): passes, and the pooled rate is returned
    fine = _with_calls("lenient", 2, 8) + _with_calls("strict", 0, 10)
    assert check_pool_error_rates([lenient, strict], fine, "step 3") == pytest.approx(2 / 20)
    # a pool of one checks every call, whatever name its trajectories carry (custom env factories)
    with pytest.raises(EnvironmentFailure, match="environment `strict`"):
        check_pool_error_rates([strict], _with_calls("other", 1, 1), "step 3")


# -- per-environment metrics -----------------------------------------------------------------
def test_environment_metrics_are_the_pooled_rule_on_each_environments_trajectories():
    from prompt_r1.core.reward import RewardBreakdown
    from tasks.stages import ENV_METRICS, environment_metrics

    a = [Trajectory("q0", i, [], env_name="a", reward=RewardBreakdown(1.0, 0.5 * i, 1.0 + 0.5 * i),
                    env_calls=[EnvCall(0, "a", "m", prompt_tokens=100 * (i + 1), completion_tokens=10)])
         for i in range(2)]
    b = [Trajectory("q1", i, [], env_name="b", error="HTTP 500" if i else None,
                    reward=None if i else RewardBreakdown(0.2, 0.0, -0.8),
                    env_calls=[EnvCall(0, "b", "m", completion_tokens=40, error="HTTP 500" if i else None)])
         for i in range(2)]
    envs = [EnvConfig(name="a", price_per_1k_prompt=2.0), EnvConfig(name="b", price_per_1k_completion=10.0)]
    metrics = environment_metrics(a + b, envs, format_cap=1.0)
    for name, subset in (("a", a), ("b", b)):
        stats = rollout_stats(subset, format_cap=1.0)
        for key, source in ENV_METRICS.items():
            if key != "trajectories":
                assert metrics[f"train_env/{name}/{key}"] == stats[source], (name, key)
    assert metrics["train_env/b/error_rate"] == 0.5 and metrics["train_env/a/reward"] == 1.25
    assert metrics["train_env/a/cost_usd"] == pytest.approx((100 + 200) / 2 * 2.0 / 1000)
    assert metrics["train_env/b/cost_usd"] == pytest.approx(40 * 10.0 / 1000)
    assert metrics["train_env/a/trajectories"] == 2.0


# -- managed servers ---------------------------------------------------------------------------
def test_a_managed_server_starts_for_each_pool_member_that_needs_one(monkeypatch):
    import prompt_r1.env.vllm_server as vllm_server
    from prompt_r1.rollout.pool import actor_environments

    started, stopped = [], []

    @contextlib.contextmanager
    def fake_server(env_cfg, log_dir=None):
        started.append(env_cfg.name)
        yield f"http://127.0.0.1:{8000 + len(started)}/v1"
        stopped.append(env_cfg.name)

    monkeypatch.setattr(vllm_server, "managed_vllm_server", fake_server)
    cfg = smoke()
    cfg = pool_of(cfg, EnvConfig(name="smol", kind="vllm", model="m1"), EnvConfig(name="local"),
                  EnvConfig(name="gemma", kind="vllm", model="m2"), weights=[1.0, 2.0, 3.0])
    with actor_environments(cfg) as actor_cfg:
        assert started == ["smol", "gemma"] and not stopped
        pool = actor_cfg.train.environments
        assert [(e.name, e.kind, e.weight) for e in pool] == [("smol", "openai", 1.0), ("local", "inprocess", 2.0),
                                                              ("gemma", "openai", 3.0)]
        assert pool[0].base_url == "http://127.0.0.1:8001/v1" and not any(e.cache for e in pool)
        assert actor_cfg.training_weights() == [1.0, 2.0, 3.0]
    assert sorted(stopped) == ["gemma", "smol"]


# -- the warehouse --------------------------------------------------------------------------
def test_trajectories_record_their_environment_also_in_warehouse_files_made_before_pools(tmp_path):
    from warehouse.store import SCHEMA, Warehouse

    path = tmp_path / "old.duckdb"
    old_schema = "\n".join(line for line in SCHEMA.read_text().splitlines() if "env_name        VARCHAR" not in line
                           and "ADD COLUMN IF NOT EXISTS env_name" not in line)
    with duckdb.connect(str(path)) as con:  # a file as the warehouse wrote it before pools
        con.execute(old_schema)
        con.execute("INSERT INTO trajectories (run_id, step, question_id, group_index, token_ids, loss_mask, "
                    "agent_turns, env_replies, answer, reward_format, reward_answer, reward_total, num_turns, "
                    "stop_reason, created_at, policy_version) "
                    "VALUES ('old', 0, 'q', 0, [1], [1], ['a'], [], 'x', 1, 1, 2, 1, 'answered', now(), 0)")
    t = Trajectory("q", 0, [], token_ids=[1], loss_mask=[1], agent_turns=["a"], stop_reason="answered",
                   env_name="smol")
    with Warehouse(path) as wh:
        wh.replace_step("new", 0, [t.to_record()], [])
        rows = wh.query("SELECT run_id, env_name, policy_version FROM trajectories ORDER BY run_id")
    assert rows == [("new", "smol", 0), ("old", None, 0)]


# -- training runs --------------------------------------------------------------------------------
def _train(home: Path, cfg, run_id: str, monkeypatch) -> tuple[list[dict], list[list[dict]], bytes, list, list]:
    """A smoke training run through the real session (Ray actor, in-process environments): its
    per-step metrics, trajectories, exported weights and warehouse rows (wall-clock columns aside)."""
    from prompt_r1.data.ingest import ingest
    from prompt_r1.training.session import TrainingSession
    from tests.training.test_determinism import recording_hooks
    from warehouse.store import Warehouse

    monkeypatch.setenv("PROMPT_R1_HOME", str(home))
    hooks, metrics, trajectories = recording_hooks()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, ["data/sample"])
        with TrainingSession(cfg, wh, run_id, home / "run") as session:
            agent = session.run(hooks).agent
        trajs = wh.query_dicts("SELECT * EXCLUDE (run_id, created_at) FROM trajectories WHERE run_id = ? "
                               "ORDER BY step, question_id, group_index", [run_id])
        calls = wh.query("SELECT * EXCLUDE (run_id, created_at, latency_s) FROM env_calls WHERE run_id = ? "
                         "ORDER BY step, question_id, group_index, turn", [run_id])
    return metrics, trajectories, (agent / "model.safetensors").read_bytes(), trajs, calls


def test_a_pool_of_one_reproduces_the_run_with_environment(tmp_path, monkeypatch):
    import ray

    cfg = smoke()
    try:
        single = _train(tmp_path / "single", cfg, "single", monkeypatch)
        pooled = _train(tmp_path / "pooled", pool_of(cfg, cfg.environment, weights=[3.0]), "pooled", monkeypatch)
    finally:
        ray.shutdown()
    assert len(single[0]) == 2 and single[0][0] and single[3]  # two steps, with metrics and rows
    assert any(t["env_calls"] for step in single[1] for t in step)  # the environment was called
    assert {t["env_name"] for step in single[1] for t in step} == {"tiny-env"}
    assert pooled[1] == single[1]  # trajectories: ids, log-probs, replies, rewards, environment
    assert pooled[0] == single[0]  # per-step metrics (timings aside)
    assert pooled[2] == single[2]  # exported weights, byte for byte
    assert pooled[3] == single[3] and pooled[4] == single[4]  # warehouse rows


def test_a_pool_of_two_trains_each_group_against_one_environment(tmp_path, monkeypatch):
    import ray

    cfg = smoke()
    other = cfg.environment.model_copy(update={"name": "tiny-env-b", "max_tokens": 8})
    pooled = pool_of(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"batch_questions": 4})}),
                     cfg.environment, other, weights=[1.0, 1.0])
    try:
        metrics, trajectories, _, rows, calls = _train(tmp_path / "pool", pooled, "pool", monkeypatch)
    finally:
        ray.shutdown()
    assert len(metrics) == 2
    seen = set()
    for step, batch in enumerate(trajectories):
        for t in batch:
            assert t["env_name"] == ("tiny-env", "tiny-env-b")[draw_environment(0, step, t["question_id"], [1.0, 1.0])]
            assert all(c["env_name"] == t["env_name"] for c in t["env_calls"])
            seen.add(t["env_name"])
    assert seen == {"tiny-env", "tiny-env-b"}  # 8 questions over two steps drew both
    assert {r["env_name"] for r in rows} == seen  # trajectories.env_name


def test_the_plan_counts_a_managed_server_for_each_pool_member():
    from prompt_r1.planning.memory import Machine, environment_components

    cfg = load_config("configs/pool-demo.yaml")
    machine = Machine(nodes=1, gpus_per_node=0)
    names = [c.name for c in environment_components(cfg, machine)]
    assert names == ["environment server smollm2-135m", "environment server gemma3-270m"]
    assert [c.name for c in environment_components(load_config("configs/demo.yaml"), machine)] == [
        "environment server"]  # a pool of one: the component it always was


def test_the_flow_logs_per_environment_metrics_only_for_a_pool(monkeypatch, tmp_path):
    import tasks.stages as train_tasks
    from prompt_r1.training.hooks import StepResult

    class Buffer:
        def __init__(self):
            self.added = []

        def add(self, step, metrics):
            self.added.append((step, metrics))

    monkeypatch.setattr(train_tasks, "training_progress", lambda *args, **kwargs: None)  # no Prefect server here
    step = StepResult(0, {"reward_mean": 0.5}, [Trajectory("q", 0, [], env_name="a"), Trajectory("r", 0, [], env_name="b")])
    single, pooled = Buffer(), Buffer()
    train_tasks.FlowTrainingHooks(2, single, tmp_path).on_step(step)
    train_tasks.FlowTrainingHooks(2, pooled, tmp_path, [EnvConfig(name="a"), EnvConfig(name="b")]).on_step(step)
    assert single.added == [(0, {"reward_mean": 0.5})]  # today's metric names, nothing more
    logged = pooled.added[0][1]
    assert logged["reward_mean"] == 0.5
    assert {k.split("/")[1] for k in logged if k.startswith("train_env/")} == {"a", "b"}
    assert logged["train_env/a/trajectories"] == logged["train_env/b/trajectories"] == 1.0


def test_per_environment_metrics_reach_mlflow_under_train_env_name_metric(home):
    """The buffer logs `train_env/<name>/<metric>` as named (the UI groups by `/`), whatever the
    environment's name holds of `-`, `.` and `_`; names without `/` stay as they were."""
    import mlflow
    from mlflow import MlflowClient

    from tasks.tracking import runs as tracking
    from tasks.stages import environment_metrics

    names = ["env-a", "env.b_2", "a-b-c", "x"]
    trajectories = [Trajectory(f"q{i}", 0, [], env_name=name) for i, name in enumerate(names)]
    metrics = {"reward_mean": 0.5, "val_reward": 0.25,
               **environment_metrics(trajectories, [EnvConfig(name=n) for n in names], 1.0)}
    tracking.setup_mlflow("smoke")
    try:
        with mlflow.start_run() as run:
            buffer = tracking.MetricBuffer(run.info.run_id)
            buffer.add(0, metrics)
            buffer.flush()
        logged = MlflowClient().get_run(run.info.run_id).data.metrics
    finally:
        mlflow.set_tracking_uri(None)
    assert set(logged) == set(metrics)
    for name in names:
        assert logged[f"train_env/{name}/trajectories"] == 1.0
        assert {k.split("/")[2] for k in logged if k.split("/")[:2] == ["train_env", name]} >= {"reward", "calls"}


def test_a_pool_config_without_eval_environments_evaluates_asks_and_serves_its_pool():
    """The `environment` section of a pool config is never trained against: evaluation defaults to
    the pool (all trained on, none held out), and `ask --env` / `serve` know every member."""
    import random

    from prompt_r1.config.experiment import parse_config
    from prompt_r1.evaluation.heldout import environment_split
    from prompt_r1.serving.service import config_environments, pick_environment

    rng = random.Random(44)
    for case in range(40):
        members = [{"name": f"m{i}-{case}", "model": rng.choice(["tiny", "tiny-smollm2"]),
                    "weight": rng.choice([0.5, 1, 3])} for i in range(rng.randint(1, 4))]
        single = {"name": rng.choice(["solo", members[0]["name"]]), "model": "tiny"}
        extra = [{"name": "held", "model": "tiny-smollm2"}] if rng.random() < 0.5 else []
        cfg = parse_config({"environment": single, "train": {"environments": members}, "eval": {"environments": extra}})
        pool_names = [m["name"] for m in members]
        want = [e["name"] for e in extra] or pool_names
        assert [e.name for e in cfg.eval_environments()] == want, case
        split = environment_split(cfg, {})
        assert split.held_out == {name: name == "held" for name in want}, case
        known = config_environments(cfg)
        for member in members:  # the pool's member wins a name it shares with `environment`
            assert known[member["name"]].model == member["model"]
            assert pick_environment(cfg, member["name"]).model == member["model"]
        assert pick_environment(cfg, None).name == pool_names[0]
        assert set(want) | set(pool_names) <= set(known)
    plain = parse_config({"environment": {"name": "solo", "model": "tiny"}})  # no pool: as before
    assert [e.name for e in plain.eval_environments()] == ["solo"] and pick_environment(plain, None).name == "solo"
    assert list(config_environments(plain)) == ["solo"]
