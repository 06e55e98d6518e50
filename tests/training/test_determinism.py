"""Determinism: a run's draws depend on (seed, step, question, sample, turn), never on batching.

The environment's latency decides which agent turns share a generation batch; these tests
change it on purpose (random asyncio delays) and require identical samples, trajectories,
metrics and exported weights with the transformers backend.
"""

from __future__ import annotations

import asyncio
import random
import sys
from functools import partial
from pathlib import Path

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.core.seeding import draw_seed
from prompt_r1.core.questions import QuestionRow

TIMING = ("rollout_time_s", "step_time_s", "tokens_per_s")  # wall-clock: never reproducible


def reproducible(key: str) -> bool:
    """Metrics a rerun must repeat: not wall-clock timings, not MLflow's `system/*` samples."""
    return key not in TIMING and not key.startswith("system/")


def stable(traj) -> dict:
    """A trajectory's record without its wall-clock times (call latencies and start times, turn times)."""
    record = traj.to_record()
    record["env_calls"] = [{k: v for k, v in c.items() if k not in ("latency_s", "started_at")}
                           for c in record["env_calls"]]
    record.pop("turn_times")
    return record


def recording_hooks():
    """Training hooks that keep each step's reproducible metrics and `stable` trajectory records:
    (hooks, metrics, trajectories), the lists filled as the run goes."""
    from prompt_r1.training.hooks import TrainingHooks

    metrics: list[dict] = []
    trajectories: list[list[dict]] = []

    class Record(TrainingHooks):
        def on_step(self, result):
            metrics.append({k: v for k, v in result.metrics.items() if k not in TIMING})
            trajectories.append([stable(t) for t in result.trajectories])

    return Record(), metrics, trajectories


class DelayedEnv:
    """The configured in-process environment behind random (unseeded) delays before and after
    each call, so replies arrive in a different order and grouping every run."""

    def __init__(self, env_cfg, max_delay_s: float):
        from prompt_r1.env.inprocess import InProcessEnvironment

        self.inner, self.max_delay_s = InProcessEnvironment(env_cfg), max_delay_s
        self.name, self.model = env_cfg.name, env_cfg.model
        self._rng = random.Random()  # seeded from the OS: the point is latency we do not control

    async def reply(self, messages, turn=0):
        await asyncio.sleep(self._rng.uniform(0, self.max_delay_s))
        reply = await self.inner.reply(messages, turn=turn)
        await asyncio.sleep(self._rng.uniform(0, self.max_delay_s))
        return reply

    async def aclose(self):
        await self.inner.aclose()


def smoke(**agent):
    cfg = load_config("configs/smoke.yaml")
    return cfg.model_copy(update={"agent": cfg.agent.model_copy(update=agent)}) if agent else cfg


# -- (a) the policy: a row's sample is the same in any batch --------------------------------
def test_rows_sample_the_same_in_any_batch_composition_and_order(tiny_model_path):
    from prompt_r1.policy.hf import TransformersPolicy

    policy = TransformersPolicy(tiny_model_path, temperature=1.0, stop_strings=("\x00\x00",))  # never hit
    rng = random.Random(0)
    vocab = len(policy.tokenizer)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 40))] for _ in range(7)]
    prompts.append(list(prompts[0]))  # a GRPO group: same prompt, another seed
    seeds = [draw_seed(0, 1, f"q{i % 7}", i // 7, 0) for i in range(8)]
    alone = [policy.generate([p], 24, [s])[0] for p, s in zip(prompts, seeds)]
    assert alone[0].token_ids != alone[7].token_ids  # the seed, not the prompt, decides
    for _ in range(6):
        rows = rng.sample(range(8), rng.randint(2, 8))
        batched = policy.generate([prompts[r] for r in rows], 24, [seeds[r] for r in rows])
        for r, sample in zip(rows, batched):
            assert sample.token_ids == alone[r].token_ids and sample.logprobs == alone[r].logprobs, r


def test_batched_rows_keep_their_draws_up_to_float_noise(tiny_model_path):
    """`batch_invariant=False`: the draws are still per row (same seeds, same ids here), but a
    left-padded batch moves log-probs by float noise, so the policy says it is not exact."""
    from prompt_r1.policy import backend_deterministic, make_policy

    exact = make_policy(smoke(model="tiny").agent, tiny_model_path)
    loose_cfg = smoke(model="tiny", batch_invariant=False).agent
    loose = make_policy(loose_cfg, tiny_model_path)
    assert exact.deterministic and backend_deterministic(smoke().agent)
    assert not loose.deterministic and not backend_deterministic(loose_cfg)
    assert not backend_deterministic(smoke(backend="vllm").agent)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, len(exact.tokenizer)) for _ in range(n)] for n in (3, 17, 30, 9)]
    seeds = [11, 12, 13, 14]
    alone = [exact.generate([p], 16, [s])[0] for p, s in zip(prompts, seeds)]
    batched = loose.generate(prompts, 16, seeds)
    for a, b in zip(alone, batched):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


# -- the rollout: seeds follow the rule, whatever the environment's latency -------------------
def _questions() -> list[QuestionRow]:
    texts = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs has a spider?"]
    return [QuestionRow(f"q{i}", "sample", "train", t, ["x"], "standard_qa", "f1") for i, t in enumerate(texts)]


def test_rollout_seeds_each_turn_by_the_rule_and_ignores_latency(_model_cache):
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.policy.hf import TransformersPolicy
    from prompt_r1.rollout.episode import rollout_batch

    cfg = smoke()
    seen: list[tuple[list[int], int]] = []

    class Recording(TransformersPolicy):
        def generate(self, prompts, max_new_tokens, seeds=None):
            seen.extend(zip(map(list, prompts), seeds))
            return super().generate(prompts, max_new_tokens, seeds)

    policy = Recording(resolve_model("tiny-protocol"), temperature=1.0)

    def run(max_delay_s: float):
        env = DelayedEnv(cfg.environment, max_delay_s)
        return asyncio.run(rollout_batch(policy, env, _questions(), cfg.agent, cfg.rollout, cfg.reward,
                                         group_size=3, seed=5, step=4))

    first = run(0.0)
    # every generation's seed, restated from the trajectory it extended
    by_context: dict[tuple[int, ...], list[int]] = {}  # a group's first turns share their context
    for prompt, seed in seen:
        by_context.setdefault(tuple(prompt), []).append(seed)
    for t in first:
        for turn in range(len(t.agent_turns)):
            context = t.prompt_ids + t.token_ids[:_turn_start(t, turn)]
            assert draw_seed(5, 4, t.question_id, t.group_index, turn) in by_context[tuple(context)]
    assert any(len(t.agent_turns) > 1 for t in first)  # the environment was called
    again = run(0.2)
    assert [stable(t) for t in again] == [stable(t) for t in first]


def _turn_start(traj, turn: int) -> int:
    """Index in `token_ids` where agent turn `turn` starts (agent spans are the mask-1 runs)."""
    starts = [i for i, m in enumerate(traj.loss_mask) if m == 1 and (i == 0 or traj.loss_mask[i - 1] == 0)]
    return starts[turn]


# -- (b) two training runs, one behind random delays: identical everything ----------------
def _train(home: Path, max_delay_s: float, monkeypatch) -> tuple[list[dict], list[list[dict]], bytes]:
    from prompt_r1.data.ingest import ingest
    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    class Session(TrainingSession):
        def _start_pool(self):
            init_ray(self.cfg.rollout)
            cfg = self.actor_cfg
            factory = partial(DelayedEnv, max_delay_s=max_delay_s)
            return self._stack.enter_context(RolloutPool(cfg, self.model_path, 1, env_factory=factory))

    monkeypatch.setenv("PROMPT_R1_HOME", str(home))
    hooks, metrics, trajectories = recording_hooks()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, ["data/sample"])
        with Session(smoke(), wh, "det", home / "run") as session:
            agent = session.run(hooks).agent
    return metrics, trajectories, (agent / "model.safetensors").read_bytes()


def test_training_is_identical_whatever_the_environment_latency(home, tmp_path, monkeypatch):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors build DelayedEnv
    try:
        calm = _train(tmp_path / "calm", 0.0, monkeypatch)
        jittery = _train(tmp_path / "jittery", 0.3, monkeypatch)
    finally:
        ray.shutdown()
    assert len(calm[0]) == 2 and calm[0][0]  # two steps, with metrics
    assert jittery[1] == calm[1]             # trajectories: ids, log-probs, replies, rewards
    assert jittery[0] == calm[0]             # per-step metrics (timings aside)
    assert jittery[2] == calm[2]             # exported weights, byte for byte


# -- (c) `prompt-r1 rerun` of a training run --------------------------------------------------
@pytest.mark.slow
def test_rerun_of_a_training_run_reproduces_its_metrics(home):
    import mlflow
    from mlflow import MlflowClient
    from prefect.testing.utilities import prefect_test_harness

    from flows.cli import rerun_mlflow_run
    from flows.train import train_flow
    from tasks.tracking.runs import tracking_uri

    with prefect_test_harness(server_startup_timeout=180):
        first = train_flow("configs/smoke.yaml", resume=False)
        again = rerun_mlflow_run(first["run_id"])
    mlflow.set_tracking_uri(tracking_uri())
    client = MlflowClient()
    runs = [client.get_run(r["run_id"]) for r in (first, again)]
    assert runs[0].data.tags["deterministic"] == runs[1].data.tags["deterministic"] == "true"
    keys = sorted(k for k in runs[0].data.metrics if reproducible(k))
    assert {"reward_mean", "pg_loss", "grad_norm", "val_reward"} <= set(keys)
    assert sorted(k for k in runs[1].data.metrics if reproducible(k)) == keys
    for key in keys:
        history = [sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key)) for r in runs]
        assert history[0] == history[1], key
