"""Training rollouts as MLflow traces (`tracking.trace_rollouts` a step): which trajectories, with
which tags, and the advantage they show (the learner's rule, `learner.advantages`) against a
restatement; then a real smoke training run (Ray actor, in-process environments, a pool of two)
whose traces land in a real MLflow sqlite store with their step, reward, advantage and environment."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.core.reward import RewardBreakdown
from prompt_r1.core.trajectory import EnvCall, Trajectory
from prompt_r1.learner.advantages import outcome_advantages
from prompt_r1.training.hooks import StepResult
from prompt_r1.training.rollout_traces import METHOD, RolloutTracer, pick_rollouts


def restated_advantages(rewards: dict[str, list[float]], scale_by_std: bool = True) -> dict[str, list[float]]:
    """Per question: (r - mean) / (unbiased std + 1e-6), or r - mean (Dr.GRPO); a group of one 0."""
    out = {}
    for q, rs in rewards.items():
        if len(rs) < 2:
            out[q] = [0.0] * len(rs)
            continue
        mean = sum(rs) / len(rs)
        std = statistics.stdev(rs)
        out[q] = [(r - mean) / (std + 1e-6) if scale_by_std else r - mean for r in rs]
    return out


def _batch(rng: random.Random) -> list[Trajectory]:
    batch = []
    for q in range(rng.randint(1, 5)):
        env = rng.choice(["env-a", "env-b"])
        for g in range(rng.randint(1, 4)):
            failed = rng.random() < 0.15
            total = round(rng.uniform(-1, 1), 2)
            batch.append(Trajectory(f"q{q}", g, [], env_name=env, answer=f"a{q}{g}", agent_turns=["<think>t</think>"],
                                    error="HTTP 500" if failed else None,
                                    reward=None if failed else RewardBreakdown(1.0, total + 1 - 1.0, total),
                                    env_calls=[EnvCall(0, env, "m", prompt_tokens=1000, completion_tokens=10)]))
    rng.shuffle(batch)
    return batch


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_advantages_restate_the_group_rule(scale_by_std):
    cfg = load_config("configs/smoke.yaml", {"train.scale_by_std": scale_by_std})
    rng = random.Random(1)
    for _ in range(100):
        batch = [t for t in _batch(rng) if t.reward is not None]
        got = outcome_advantages(batch, cfg).tolist()
        rewards: dict[str, list[float]] = {}
        for t in batch:
            rewards.setdefault(t.question_id, []).append(t.reward.total)
        expected = restated_advantages(rewards, scale_by_std)
        seen: dict[str, int] = {}
        for t, a in zip(batch, got):
            i = seen[t.question_id] = seen.get(t.question_id, -1) + 1
            assert a == pytest.approx(expected[t.question_id][i], abs=1e-4)


def test_the_tracer_picks_k_trajectories_and_tags_what_training_saw():
    cfg = load_config("configs/smoke.yaml", {"train.environments": [
        {"name": "env-a", "kind": "inprocess", "model": "tiny", "price_per_1k_prompt": 1.0},
        {"name": "env-b", "kind": "inprocess", "model": "tiny-smollm2"}]})
    rng = random.Random(2)
    for k in (0, 1, 3, 50):
        for step in range(30):
            batch = _batch(rng)
            records = RolloutTracer(cfg, k).records(StepResult(step, {}, batch))
            assert len(records) == min(k, len(batch))
            if k >= len(batch):  # every one, once
                assert sorted((r["question_id"], r["trajectory"]["group_index"]) for r in records) == sorted(
                    (t.question_id, t.group_index) for t in batch)
            usable = [t for t in batch if t.error is None]
            counts = {q: sum(1 for t in usable if t.question_id == q) for q in {t.question_id for t in usable}}
            kept = [t for t in usable if counts[t.question_id] >= 2]
            rewards: dict[str, list[float]] = {}
            for t in kept:
                rewards.setdefault(t.question_id, []).append(t.reward.total)
            expected = restated_advantages(rewards)
            for r in records:
                t = next(t for t in batch if (t.question_id, t.group_index) == (r["question_id"],
                                                                                 r["trajectory"]["group_index"]))
                tags = r["tags"]
                assert r["method"] == METHOD and tags["step"] == str(step) and tags["environment"] == t.env_name
                assert r["env_model"] == {"env-a": "tiny", "env-b": "tiny-smollm2"}[t.env_name]
                assert tags["reward"] == ("none" if t.reward is None else f"{t.reward.total:.4f}")
                if t in kept:
                    i = [x for x in kept if x.question_id == t.question_id].index(t)
                    assert float(tags["advantage"]) == pytest.approx(expected[t.question_id][i], abs=2e-4)
                else:  # failed, or its group kept fewer than 2: the update never saw it
                    assert tags["advantage"] == "none" and r["advantage"] is None
                cost = r["env_calls"][0]["input_cost_usd"]
                assert cost == pytest.approx(1.0 if t.env_name == "env-a" else 0.0)
                assert "token_ids" not in r["trajectory"] and "env_calls" not in r["trajectory"]


def test_picks_are_spread_over_environments_and_questions():
    ts = [Trajectory(f"q{q}", g, [], env_name=e) for e in ("a", "b") for q in range(3) for g in range(4)]
    random.Random(0).shuffle(ts)
    picked = [ts[i] for i in pick_rollouts(ts, 4)]
    assert [t.env_name for t in picked] == ["a", "a", "b", "b"]
    assert len({(t.env_name, t.question_id) for t in picked}) == 4


@pytest.mark.slow
def test_a_training_run_leaves_k_rollout_traces_a_step_in_mlflow(home, monkeypatch):
    """Two smoke steps against a pool of two in-process environments, through the flow's hooks in a
    real MLflow run (sqlite): k traces a step, tagged with step, reward, advantage and environment,
    the reward (the warehouse's) as feedback and the advantage the group's rewards give."""
    import mlflow
    import ray

    import tasks.stages as train_tasks
    from flows.train import rollout_tracer
    from prompt_r1.data.ingest import ingest
    from prompt_r1.data.pool import TrainingPool
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession
    from tasks.tracking.runs import MetricBuffer, setup_mlflow
    from warehouse.store import Warehouse

    k = 3
    cfg = load_config("configs/smoke.yaml", {"tracking.trace_rollouts": k, "rollout.batch_questions": 4,
                                             "train.environments": [
                                                 {"name": "tiny-env", "kind": "inprocess", "model": "tiny",
                                                  "max_tokens": 16, "temperature": 0.0},
                                                 {"name": "tiny-env-b", "kind": "inprocess", "model": "tiny",
                                                  "max_tokens": 8, "temperature": 0.0}]})
    monkeypatch.setattr(train_tasks, "training_progress", lambda *args, **kwargs: None)  # a Prefect artifact
    monkeypatch.setattr(train_tasks.FlowTrainingHooks, "stage", TrainingHooks.stage)  # no Prefect tasks here
    exp_id = setup_mlflow(cfg.name)
    try:
        with Warehouse(home / "warehouse.duckdb") as wh:
            ingest(wh, ["data/sample"])
            questions = TrainingPool.load(wh, cfg)
            with mlflow.start_run() as run, TrainingSession(cfg, wh, run.info.run_id, home / "run",
                                                            questions=questions) as session:
                hooks = train_tasks.FlowTrainingHooks(cfg.train.steps, MetricBuffer(run.info.run_id),
                                                      session.ckpt_dir, cfg.training_environments(),
                                                      tracer=rollout_tracer(cfg, questions))
                session.run(hooks)
            rows = wh.query("SELECT step, question_id, group_index, reward_total, env_name FROM trajectories "
                            "WHERE run_id = ?", [run.info.run_id])
    finally:
        ray.shutdown()
    traces = mlflow.search_traces(locations=[exp_id], filter_string=f"tags.method = '{METHOD}'", return_type="list")
    by_step: dict[str, list] = {}
    for trace in traces:
        by_step.setdefault(trace.info.tags["step"], []).append(trace)
        assert trace.info.trace_metadata["mlflow.sourceRun"] == run.info.run_id
    assert sorted(by_step) == ["0", "1"] and all(len(v) == k for v in by_step.values())
    reward = {(s, q, g): (r, e) for s, q, g, r, e in rows}
    for step, step_traces in by_step.items():
        groups: dict[str, list[tuple[int, float]]] = {}
        for s, q, g, r, _ in rows:
            if str(s) == step:
                groups.setdefault(q, []).append((g, r))
        for trace in step_traces:
            tags = trace.info.tags
            root = trace.data.spans[0]
            key = (int(step), tags["question_id"], int(tags["group_index"]))
            total, env = reward[key]
            assert tags["environment"] == env and tags["env_name"] == env and tags["reward"] == f"{total:.4f}"
            members = sorted(groups[tags["question_id"]])
            expected = restated_advantages({"q": [r for _, r in members]})["q"][[g for g, _ in members].index(key[2])]
            assert float(tags["advantage"]) == pytest.approx(expected, abs=2e-4)
            feedback = {a.name: a for a in trace.info.assessments}
            assert math.isclose(feedback["reward"].value, total, abs_tol=1e-6) and feedback["gold_answers"].value
            assert root.name == "episode" and root.inputs["question"] != tags["question_id"]  # the question's text
