"""Asynchronous rollouts (`rollout.max_staleness`) and the truncated importance-sampling loss.

The loss rules are checked against per-token statements written here; the schedule by training
the smoke config through `TrainingSession.run`: at k = 1 every trained trajectory was sampled by
the step's weights or the ones before, at k = 0 the run equals the synchronous schedule (a copy
of it below) in metrics, trajectories and exported weights, byte for byte.
"""

from __future__ import annotations

import math
import random
import shutil

import pytest
import torch
from grpo_helpers import hand_trajectories, spy_policy_loss
from tests.training.test_determinism import TIMING, stable

from prompt_r1.config.experiment import load_config, parse_config
from prompt_r1.core.grpo import policy_loss, truncated_is_weights


# -- the loss ------------------------------------------------------------------------------------
def test_truncated_is_weights_follow_the_rule():
    rng = random.Random(0)
    old = [rng.uniform(-6, 0) for _ in range(200)]
    behaviour = [o + rng.uniform(-2, 2) for o in old]
    for cap in (1.0, 1.5, 4.0):
        got = truncated_is_weights(torch.tensor(old), torch.tensor(behaviour), cap).tolist()
        want = [min(math.exp(o - b), cap) for o, b in zip(old, behaviour)]
        assert got == pytest.approx(want, rel=1e-5)
        assert any(w == cap for w in got) and any(w < 1 for w in got)  # both sides of the cap occur
    with pytest.raises(ValueError, match="tis_cap"):
        truncated_is_weights(torch.zeros(1), torch.zeros(1), 0.5)


def _random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 5, generator=g) * 4
    logprobs = old + (torch.rand(3, 5, generator=g) - 0.5)  # ratios of both sides of the clip range
    behaviour = old + (torch.rand(3, 5, generator=g) - 0.5) * 3
    adv = torch.tensor([1.5, -0.7, 0.4])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    return logprobs, old, behaviour, adv, mask


def test_policy_loss_weights_each_tokens_clipped_term():
    logprobs, old, behaviour, adv, mask = _random_batch(1)
    cap, low, high = 1.8, 0.2, 0.28
    w = truncated_is_weights(old, behaviour, cap)
    loss, stats = policy_loss(logprobs, old, None, adv, mask, low, high, kl_coef=0.0, is_weights=w)
    terms = []  # the rule per token: w * max(-A rho, -A clip(rho)), averaged over agent tokens
    for i in range(3):
        for j in range(5):
            if mask[i, j]:
                rho = math.exp(logprobs[i, j].item() - old[i, j].item())
                weight = min(math.exp(old[i, j].item() - behaviour[i, j].item()), cap)
                a = adv[i].item()
                terms.append(weight * max(-a * rho, -a * min(max(rho, 1 - low), 1 + high)))
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    assert stats["clip_fraction"] > 0  # the clip is exercised, not only the weight
    plain, _ = policy_loss(logprobs, old, None, adv, mask, low, high, kl_coef=0.0)
    ones, _ = policy_loss(logprobs, old, None, adv, mask, low, high, kl_coef=0.0, is_weights=torch.ones(3, 5))
    assert torch.equal(plain, ones) and plain.item() != pytest.approx(loss.item(), rel=1e-3)


def test_first_pass_gradient_is_that_of_the_ratio_to_the_behaviour_policy():
    """At the first pass (logprobs = old) and below the cap, d loss / d logp per token is
    -A * pi / behaviour / N: the gradient of the ratio to the policy that sampled."""
    _, old, behaviour, adv, mask = _random_batch(2)
    behaviour = old + 0.3 * torch.sign(torch.randn(3, 5, generator=torch.Generator().manual_seed(3)))
    logprobs = old.clone().requires_grad_(True)
    w = truncated_is_weights(old, behaviour, cap=10.0)  # exp(0.3) < 10: nothing truncated
    loss, _ = policy_loss(logprobs, old, None, adv, mask, kl_coef=0.0, is_weights=w)
    loss.backward()
    n = mask.sum().item()
    want = torch.tensor([[-adv[i].item() * math.exp(old[i, j].item() - behaviour[i, j].item()) / n
                          if mask[i, j] else 0.0 for j in range(5)] for i in range(3)])
    assert torch.allclose(logprobs.grad, want, atol=1e-6)


# -- the learner -------------------------------------------------------------------------------------
def _stale_config(max_staleness: int, tis_cap: float = 1.5):
    return parse_config({"seed": 0, "agent": {"model": "tiny", "max_response_tokens": 16, "temperature": 1.0},
                         "rollout": {"max_staleness": max_staleness},
                         "train": {"lr": 1e-3, "micro_batch_size": 6, "mini_batch_questions": 64,
                                   "kl_coef": 0.0, "device": "cpu", "tis_cap": tis_cap}})


def test_learner_weights_tokens_by_the_engines_log_probs_only_when_stale(tiny_model_path, monkeypatch):
    from prompt_r1.learner.grpo_learner import GRPOLearner

    calls = spy_policy_loss(monkeypatch)
    stale = GRPOLearner(_stale_config(1, tis_cap=1.5), tiny_model_path)
    trajectories = hand_trajectories(stale.tokenizer)
    # behaviour log-probs = the learner's own, moved by +-0.6 per agent token (0.0 where inserted)
    own = stale.response_logprobs(trajectories)
    rng = random.Random(4)
    for t, lp in zip(trajectories, own):
        t.logprobs = [v + rng.choice([-0.6, 0.6]) if m else 0.0 for v, m in zip(lp.tolist(), t.loss_mask)]
    metrics = stale.step(trajectories)
    (call,) = calls
    agent = call["mask"].bool()
    weights = call["is_weights"][agent]
    # exp(+0.6) = 1.82 is capped at 1.5, exp(-0.6) = 0.55 is not
    assert set(round(w, 3) for w in weights.tolist()) == {1.5, round(math.exp(-0.6), 3)}
    assert metrics["tis_capped_fraction"] == pytest.approx((weights == 1.5).float().mean().item())
    assert metrics["tis_mean"] == pytest.approx(weights.mean().item(), rel=1e-5)

    calls.clear()  # max_staleness 0: no weight, no new metric (today's loss)
    on_policy = GRPOLearner(_stale_config(0), tiny_model_path)
    metrics = on_policy.step(trajectories)
    assert calls[0]["is_weights"] is None and "tis_mean" not in metrics

    for t in trajectories:  # stale batches need the engine's log-probs: refused, not guessed
        t.logprobs = []
    with pytest.raises(ValueError, match="max_staleness"):
        stale.step(trajectories)


# -- the schedule ------------------------------------------------------------------------------------
STEP = ["next-batch", "rollout", "reward", "grpo-update", "record", "broadcast-weights"]


def _synchronous_run(session, hooks) -> None:
    """The schedule as it was before asynchronous rollouts (TrainingSession.run, verbatim but for
    the outcome it returns): what max_staleness 0 must still do."""
    import time

    from prompt_r1.training.hooks import StepResult

    cfg = session.cfg.train
    if session.step == 0 and session.val_questions:
        hooks.on_validation(0, hooks.stage("validate", session.validate))
    while session.step < cfg.steps:
        index = session.step
        t0 = time.perf_counter()
        questions = hooks.stage("next-batch", session.next_batch)
        trajectories = hooks.stage("rollout", session.rollout, questions)
        rollout_s = time.perf_counter() - t0
        hooks.stage("reward", session.score, trajectories)
        metrics = hooks.stage("grpo-update", session.update, trajectories)
        metrics["rollout_time_s"] = rollout_s
        metrics["rollout_actor_restarts"] = 0.0  # none die here (a dead actor: tests/rollout/test_actor_restart.py)
        hooks.stage("record", session.finish_step, trajectories)
        hooks.stage("broadcast-weights", session.broadcast)
        hooks.on_step(StepResult(index, metrics, trajectories))
        last = session.step == cfg.steps
        if last or (cfg.validate_every and session.step % cfg.validate_every == 0):
            hooks.on_validation(session.step, hooks.stage("validate", session.validate))
        if last or session.step % cfg.checkpoint_every == 0:
            hooks.before_checkpoint(session.step)
            path = hooks.stage("checkpoint", session.checkpoint)
            hooks.after_checkpoint(session.step, path)
    session.export_agent()


def _train(home, name: str, overrides: dict, synchronous: bool = False, resume: bool = False) -> dict:
    """Train configs/smoke.yaml with `overrides`; what every stage, step and checkpoint left."""
    from prompt_r1.data.ingest import ingest
    from prompt_r1.models.export import read_state
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession
    from warehouse.store import Warehouse

    out: dict = {"stages": [], "metrics": [], "trajectories": [], "versions": [], "questions": [], "positions": [],
                 "validation": []}

    class Record(TrainingHooks):
        def stage(self, name, fn, *args):
            out["stages"].append(name)
            return fn(*args)

        def on_step(self, result):
            out["metrics"].append({k: v for k, v in result.metrics.items() if k not in TIMING})
            out["trajectories"].append([stable(t) for t in result.trajectories])
            out["versions"].append((result.step, sorted({t.policy_version for t in result.trajectories})))
            out["questions"].append(list(dict.fromkeys(t.question_id for t in result.trajectories)))

        def on_validation(self, updates_done, metrics):
            out["validation"].append((updates_done, metrics))

        def after_checkpoint(self, step, path):
            out["positions"].append((step, read_state(path)["data_position"]["position"]))

    cfg = load_config("configs/smoke.yaml", overrides)
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, ["data/sample"])
        with TrainingSession(cfg, wh, name, home / name, resume=resume) as session:
            out["first_step"] = session.step
            if synchronous:
                _synchronous_run(session, Record())
            else:
                session.run(Record())
            out["train_ids"] = [q.question_id for q in session.train_questions]
            out["recorded_steps"] = wh.steps_recorded(name)
    out["weights"] = (home / name / "agent" / "model.safetensors").read_bytes()
    return out


@pytest.fixture(scope="module")
def ray_session():
    import ray

    yield
    ray.shutdown()


def test_max_staleness_0_is_the_synchronous_schedule_bit_for_bit(home, ray_session):
    new = _train(home, "k0", {})
    old = _train(home, "sync", {}, synchronous=True)
    step = STEP + ["checkpoint"]
    assert new["stages"] == old["stages"] == ["validate"] + step + STEP + ["validate", "checkpoint"]
    assert len(new["metrics"]) == 2 and new["metrics"][0]["pg_loss"] is not None
    assert new["metrics"] == old["metrics"]
    assert new["trajectories"] == old["trajectories"]
    assert new["validation"] == old["validation"]
    assert new["weights"] == old["weights"]
    assert new["versions"] == [(0, [0]), (1, [1])]  # on-policy: each step's own weights


def test_max_staleness_1_trains_on_the_steps_weights_or_the_ones_before(home, ray_session):
    from prompt_r1.data.order import batches

    overrides = {"rollout.max_staleness": 1, "train.steps": 3, "train.keep_checkpoints": 3}
    run = _train(home, "k1", overrides)
    # the learner holds version s at update s: every batch is from version s or s - 1 ...
    assert all(set(versions) <= {step, step - 1} for step, versions in run["versions"])
    # ... and after the first step from s - 1: the batch rolled out while update s - 1 ran
    assert run["versions"] == [(0, [0]), (1, [0]), (2, [1])]
    ahead = ["next-batch", "rollout-submit"]
    assert run["stages"] == (["validate"] + ["next-batch", "rollout", "reward"] + ahead + STEP[3:] + ["checkpoint"]
                             + ["rollout", "reward"] + ahead + STEP[3:] + ["checkpoint"]
                             + ["rollout", "reward"] + STEP[3:] + ["validate", "checkpoint"])
    # data order as at k = 0: batch s at update s; a checkpoint after s updates resumes at batch s
    order = batches(run["train_ids"], 2, seed=0)
    assert run["questions"] == [next(order)[1] for _ in range(3)]
    assert run["positions"] == [(1, 1), (2, 2), (3, 3)]
    assert run["recorded_steps"] == [0, 1, 2]
    assert all(m["tis_mean"] > 0 for m in run["metrics"])

    # resume from the checkpoint after update 1: the batch of step 1, in flight then, is redone
    from prompt_r1.learner.checkpoint import list_checkpoints

    kept = list_checkpoints(home / "k1" / "checkpoints")
    assert [step for step, _ in kept] == [1, 2, 3]
    for _, folder in kept[1:]:
        shutil.rmtree(folder)
    again = _train(home, "k1", overrides, resume=True)
    assert again["first_step"] == 1
    assert again["questions"] == run["questions"][1:]
    assert again["versions"] == [(1, [1]), (2, [1])]  # step 1 rolled out again, on the resumed weights
    assert again["recorded_steps"] == [0, 1, 2]


def test_max_staleness_1_reruns_exactly(home, ray_session):
    """At k = 1 the version each batch is sampled with is fixed by the order of calls, not by
    timing: two runs of the same config give the same trajectories, metrics and weights."""
    overrides = {"rollout.max_staleness": 1, "train.steps": 2}
    first, second = _train(home, "k1-first", overrides), _train(home, "k1-second", overrides)
    assert first["versions"] == second["versions"] == [(0, [0]), (1, [0])]
    assert first["trajectories"] == second["trajectories"]
    assert first["metrics"] == second["metrics"]
    assert first["validation"] == second["validation"]
    assert first["weights"] == second["weights"]
