"""The cost-aware reward (`reward.cost`) against independent statements of its rules.

Hypothesis is not in the venv, so each property is checked on many seeded generated cases:
trajectories with random agent turns (well-formed, missing tags, blank answers, partial answers),
random environment calls (two priced environments, failed calls, zero prices) and random window
settings. The oracles below are written from the formulas in docs/training.md, share no code with
`prompt_r1.core.cost_reward` (their percentile is a sorted list and an interpolation, not numpy;
their clip a median of three), and each test asserts that the branches it means to cover occurred.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from prompt_r1.config.experiment import RewardConfig
from prompt_r1.core.cost_reward import CostWindow, penalty_reward
from prompt_r1.core.grpo import decoupled_advantages, group_advantages
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.reward import RewardBreakdown, compute_reward
from prompt_r1.core.trajectory import EnvCall, Trajectory
from prompt_r1.rollout.reward_stage import score_trajectories

SEED = 20261126
GOLDS = {"q0": ["paris"], "q1": ["blue whale"], "q2": ["1969", "nineteen sixty nine"]}
QUESTIONS = {qid: QuestionRow(qid, "d", "train", "?", golds, "qa", "f1") for qid, golds in GOLDS.items()}
WRONG = ["london", "whale shark", "the moon", "", "   "]
PRICES = {"small": (0.0, 0.0), "big": (0.3, 1.2), "mid": (0.05, 0.2)}


# ---------------------------------------------------------------- generated trajectories

def _answer(rng: random.Random, golds: list[str]) -> str:
    kind = rng.choice(["gold", "gold", "partial", "wrong"])
    if kind == "gold":
        return rng.choice(golds)
    if kind == "partial":
        return rng.choice(golds).split()[0] + " " + rng.choice(["maybe", "city", "is it"])
    return rng.choice(WRONG)


def _turns(rng: random.Random, golds: list[str]) -> list[str]:
    asks = []
    for _ in range(rng.randint(0, 3)):
        asks.append(rng.choice(["<think>t</think><interaction_prompt>p</interaction_prompt>",
                                "<think>t</think>\n<interaction_prompt>p</interaction_prompt>",
                                "<interaction_prompt>p</interaction_prompt>"]))
    answer = _answer(rng, golds)
    final = rng.choice([f"<think>t</think><answer>{answer}</answer>", f"<answer>{answer}</answer>",
                        f"<think>t</think>Final: <answer>{answer}</answer>", "no tags at all"])
    return asks + [final]


def _calls(rng: random.Random, env_names: list[str]) -> list[EnvCall]:
    return [EnvCall(turn=i, env_name=rng.choice(env_names), model="m", prompt_tokens=rng.randint(0, 4000),
                    completion_tokens=rng.randint(0, 600), cached=rng.random() < 0.2,
                    error="HTTP 500" if rng.random() < 0.1 else None)
            for i in range(rng.randint(0, 4))]


def _batch(rng: random.Random, n: int, env_names: list[str]) -> list[Trajectory]:
    out = []
    for i in range(n):
        qid = rng.choice(sorted(GOLDS))
        t = Trajectory(qid, i, [], agent_turns=_turns(rng, GOLDS[qid]), env_calls=_calls(rng, env_names))
        if rng.random() < 0.05:
            t.error = "HTTP 500"  # ended by a failed call: never scored
        out.append(t)
    return out


# ---------------------------------------------------------------- oracles (from the formulas)

def oracle_cost(calls: list[EnvCall]) -> float:
    usd = 0.0
    for c in calls:
        if c.error is None:
            per_prompt, per_completion = PRICES[c.env_name]
            usd += c.prompt_tokens / 1000 * per_prompt + c.completion_tokens / 1000 * per_completion
    return usd


def oracle_percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks of the sorted values."""
    s = sorted(values)
    rank = q / 100 * (len(s) - 1)
    below = int(math.floor(rank))
    above = min(below + 1, len(s) - 1)
    return s[below] + (s[above] - s[below]) * (rank - below)


def oracle_base(turns: list[str], golds: list[str], cap: float = 1.0) -> tuple[float, float, float]:
    r = compute_reward(turns, golds, format_cap=cap)  # the dual-constrained reward is tested elsewhere
    return r.format, r.answer, r.total


def oracle_bonus(fmt: float, answer: float, base: float, root_cost: float, lo: float, hi: float,
                 alpha: float, correct_at: float, cap: float = 1.0) -> float:
    right = fmt > cap - 1e-6 and answer > correct_at - 1e-6
    if not right:
        return base
    if hi - lo < 1e-8:
        cheap = 0.5
    else:
        cheap = 1 - sorted([0.0, (root_cost - lo) / (hi - lo), 1.0])[1]
    return base + alpha * (cheap - base)


def oracle_penalty(fmt: float, answer: float, base: float, usd: float, scale: float, cost_cap: float,
                   keep: float, cap: float = 1.0) -> float:
    if fmt < cap - 1e-6:
        return base
    return fmt - 1 + answer * keep - answer * min(scale * usd, cost_cap)


# ---------------------------------------------------------------- tests

def test_cost_off_is_the_dual_constrained_reward_exactly() -> None:
    """`off` (whatever the other cost settings say) scores every trajectory exactly as
    `compute_reward` does with the configured weights."""
    rng = random.Random(SEED)
    for weights in ({}, {"format_cap": 0.9, "think_prompt_score": 0.3}):
        cfg = RewardConfig(**weights, cost={"mode": "off", "alpha": 0.9})
        trajectories = _batch(rng, 3000, sorted(PRICES))
        score_trajectories(trajectories, QUESTIONS, cfg)
        for t in trajectories:
            if t.error is not None:
                assert t.reward is None
                continue
            expected = compute_reward(t.agent_turns, GOLDS[t.question_id], **weights)
            assert t.reward == expected and t.reward.cost == 0.0


def test_bonus_matches_router_r1_rule() -> None:
    rng = random.Random(SEED + 1)
    seen: Counter[str] = Counter()
    for case in range(150):
        size = rng.choice([1, 5, 40, 1000])
        low = rng.choice([0.0, 5.0, 25.0])
        high = rng.choice([75.0, 95.0, 100.0])
        alpha, correct_at = rng.choice([0.0, 0.3, 0.6, 0.65, 0.7, 1.0]), rng.choice([1.0, 0.5])
        names = rng.choice([["small"], ["big"], ["small", "big", "mid"]])
        cfg = RewardConfig(cost={"mode": "bonus", "alpha": alpha, "correct_at": correct_at, "window": size,
                                 "low_percentile": low, "high_percentile": high})
        earlier = [rng.uniform(0, 2) for _ in range(rng.randint(0, 30))]
        window = CostWindow(size, earlier)
        batch = _batch(rng, rng.randint(1, 24), names)
        score_trajectories(batch, QUESTIONS, cfg, prices=PRICES, cost_window=window)

        scored = [t for t in batch if t.error is None]
        roots = [math.sqrt(oracle_cost(t.env_calls)) for t in scored]
        held = (earlier + roots)[-size:]
        assert window.values() == pytest.approx(held, abs=1e-12)
        lo, hi = oracle_percentile(held, low), oracle_percentile(held, high)
        for t, root in zip(scored, roots):
            fmt, answer, base = oracle_base(t.agent_turns, GOLDS[t.question_id])
            want = oracle_bonus(fmt, answer, base, root, lo, hi, alpha, correct_at)
            assert t.reward.total == pytest.approx(want, abs=1e-9), (case, t.agent_turns)
            assert (t.reward.format, t.reward.answer) == (fmt, answer)  # the parts stay the raw scores
            assert t.reward.cost == pytest.approx(want - base, abs=1e-9)
            right = fmt == 1.0 and answer >= correct_at
            seen["right" if right else "not right"] += 1
            if right:
                seen["flat window" if hi - lo < 1e-8 else "clipped" if not lo <= root <= hi else "inside"] += 1
        assert all(t.reward is None for t in batch if t.error is not None)
    assert {"right", "not right", "flat window", "clipped", "inside"} <= set(seen), seen


def test_penalty_matches_xrouter_rule() -> None:
    rng = random.Random(SEED + 2)
    seen: Counter[str] = Counter()
    for _ in range(100):
        scale, keep = rng.choice([0.0, 2.0, 3.0, 50.0]), rng.choice([1.0, 1.5])
        cost_cap = rng.choice([0.6, 0.8, keep])
        cfg = RewardConfig(cost={"mode": "penalty", "penalty_scale": scale, "penalty_cap": cost_cap,
                                 "penalty_keep": keep})
        batch = _batch(rng, 20, ["small", "big", "mid"])
        score_trajectories(batch, QUESTIONS, cfg, prices=PRICES)
        for t in (t for t in batch if t.error is None):
            usd = oracle_cost(t.env_calls)
            fmt, answer, base = oracle_base(t.agent_turns, GOLDS[t.question_id])
            want = oracle_penalty(fmt, answer, base, usd, scale, cost_cap, keep)
            assert t.reward.total == pytest.approx(want, abs=1e-9)
            assert t.reward.cost == pytest.approx(want - base, abs=1e-9)
            seen["gate shut" if fmt < 1 else "capped" if scale * usd > cost_cap else "scaled"] += 1
    assert {"gate shut", "capped", "scaled"} <= set(seen), seen


def test_penalty_at_zero_prices_and_bonus_at_alpha_zero_are_todays_reward() -> None:
    rng = random.Random(SEED + 3)
    batch = _batch(rng, 400, ["small"])
    for cost in ({"mode": "penalty"}, {"mode": "bonus", "alpha": 0.0}):
        score_trajectories(batch, QUESTIONS, RewardConfig(cost=cost), prices=PRICES)
        for t in (t for t in batch if t.error is None):
            assert t.reward.total == pytest.approx(compute_reward(t.agent_turns, GOLDS[t.question_id]).total, abs=1e-12)


def test_a_call_to_an_unpriced_environment_is_an_error_naming_it() -> None:
    t = Trajectory("q0", 0, [], agent_turns=["<answer>paris</answer>"], env_calls=[EnvCall(0, "ghost", "m", 5, 5)])
    with pytest.raises(KeyError, match="ghost"):
        score_trajectories([t], QUESTIONS, RewardConfig(cost={"mode": "penalty"}), prices=PRICES)
    with pytest.raises(ValueError, match="no environment prices"):
        score_trajectories([t], QUESTIONS, RewardConfig(cost={"mode": "bonus"}))


def test_reversed_percentiles_are_refused() -> None:
    with pytest.raises(ValueError, match="low_percentile"):
        RewardConfig(cost={"mode": "bonus", "low_percentile": 90, "high_percentile": 10})


def test_a_penalty_cap_above_keep_is_refused_and_below_it_a_right_answer_never_scores_below_a_wrong_one() -> None:
    """A cap above keep makes the answer's factor negative; at or below keep, for any cost, more answer
    is never less reward."""
    rng = random.Random(SEED + 7)
    refused = kept = 0
    for _ in range(300):
        keep, cap = rng.choice([0.1, 0.5, 1.0, 1.5, 3.0]), rng.choice([0.0, 0.05, 0.6, 1.0, 1.5, 2.0, 5.0])
        cost = {"mode": rng.choice(["off", "penalty", "bonus"]), "penalty_keep": keep, "penalty_cap": cap,
                "penalty_scale": rng.choice([0.0, 2.0, 100.0])}
        if cap > keep:
            with pytest.raises(ValueError, match=r"penalty_cap .*above reward.cost.penalty_keep"):
                RewardConfig(cost=cost)
            refused += 1
            continue
        c = RewardConfig(cost=cost).cost
        kept += 1
        for usd in (0.0, 0.001, 0.3, 10.0, 1e6):
            right, partial, wrong = (penalty_reward(RewardBreakdown(1.0, a, a), usd, c.penalty_scale, c.penalty_cap,
                                                    c.penalty_keep, 1.0).total for a in (1.0, 0.5, 0.0))
            assert right >= partial >= wrong, (keep, cap, usd, right, partial, wrong)
    assert refused and kept


def test_a_cost_reward_without_any_price_cannot_train() -> None:
    """Every price 0 means every trajectory costs 0: `bonus` then only lowers right answers, `penalty` does nothing."""
    from prompt_r1.config.experiment import parse_config

    priced = [{"environment": {"price_per_1k_prompt": 0.1}}, {"environment": {"price_per_1k_completion": 2.0}},
              {"train": {"environments": [{"name": "a"}, {"name": "b", "price_per_1k_completion": 0.5}]}}]
    free = [{}, {"environment": {"price_per_1k_prompt": 0.0}},
            {"train": {"environments": [{"name": "a"}, {"name": "b"}]}},
            {"environment": {"price_per_1k_prompt": 3.0}, "train": {"environments": [{"name": "a"}]}}]
    for mode in ("bonus", "penalty"):
        for data in free:
            cfg = parse_config({**data, "reward": {"cost": {"mode": mode}}})
            (problem,) = [p for p in cfg.training_problems() if "reward.cost.mode" in p]
            assert mode in problem and "price_per_1k" in problem
            with pytest.raises(ValueError, match="reward.cost.mode"):
                cfg.check_trainable()
        for data in priced:
            assert not parse_config({**data, "reward": {"cost": {"mode": mode}}}).training_problems()
    for data in free:
        assert not parse_config({**data, "reward": {"cost": {"mode": "off"}}}).training_problems()


def test_the_cost_free_reward_keeps_the_run_hash() -> None:
    """A run made before `reward.cost` existed resumes as the same run; turning cost on is another run."""
    from prompt_r1.config.experiment import parse_config

    today = parse_config({}).hash()
    assert parse_config({"reward": {"cost": {"mode": "off", "alpha": 0.9}, "normalize_parts": False}}).hash() == today
    assert parse_config({"reward": {"cost": {"mode": "bonus"}}}).hash() != today
    assert parse_config({"reward": {"normalize_parts": True}}).hash() != today


def test_old_records_without_a_cost_part_still_read() -> None:
    old = {"format": 1.0, "answer": 0.5, "total": 0.5}  # a record written before `cost` existed
    assert RewardBreakdown(**old).cost == 0.0
    assert RewardBreakdown(**old).parts(1.0) == (1.0, 0.5, 0.0)


# ---------------------------------------------------------------- GDPO

def oracle_gdpo(parts: list[list[float]], groups: list[int], scale: bool) -> list[float]:
    out = [0.0] * len(parts)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        for k in range(len(parts[0])):
            col = [parts[i][k] for i in members]
            if len(col) < 2:
                continue
            mean = sum(col) / len(col)
            std = math.sqrt(sum((v - mean) ** 2 for v in col) / (len(col) - 1))
            for i in members:
                out[i] += (parts[i][k] - mean) / ((std + 1e-6) if scale else 1.0)
    return out


def test_decoupled_advantages_match_per_part_normalisation() -> None:
    rng = random.Random(SEED + 4)
    for _ in range(200):
        n = rng.randint(1, 12)
        groups = [rng.randint(0, 3) for _ in range(n)]
        parts = [[rng.choice([0.0, 0.4, 1.0]), rng.choice([0.0, 0.5, 1.0]), rng.uniform(-0.5, 0.0)] for _ in range(n)]
        for scale in (True, False):
            got = decoupled_advantages(torch.tensor(parts), torch.tensor(groups), scale_by_std=scale).tolist()
            assert got == pytest.approx(oracle_gdpo(parts, groups, scale), abs=1e-4)
        one = torch.tensor([p[0] for p in parts])  # one part: GDPO is GRPO
        assert torch.allclose(decoupled_advantages(one[:, None], torch.tensor(groups)),
                              group_advantages(one, torch.tensor(groups)))


def _mixed_parts(tokenizer) -> list[Trajectory]:
    """Two groups of 3 whose rewards differ in different parts (format, answer, cost)."""
    from grpo_helpers import hand_trajectories

    trajectories = hand_trajectories(tokenizer)
    rewards = [RewardBreakdown(1.0, 1.0, 0.6, cost=-0.4), RewardBreakdown(1.0, 0.6, 0.6),
               RewardBreakdown(0.4, 0.9, -0.6), RewardBreakdown(1.0, 1.0, 1.0), RewardBreakdown(1.0, 0.5, 0.5),
               RewardBreakdown(1.0, 1.0, 0.8, cost=-0.2)]
    for t, r in zip(trajectories, rewards):
        t.reward = r
    return trajectories


@pytest.mark.parametrize("normalize_parts", [False, True])
def test_learner_advantages_default_grpo_or_gdpo(tiny_model_path, monkeypatch, normalize_parts) -> None:
    """Off (the default): the advantage is GRPO's on the totals, as before. On: GDPO's over the parts."""
    from grpo_helpers import spy_policy_loss

    from prompt_r1.config.experiment import parse_config
    from prompt_r1.learner.grpo_learner import GRPOLearner

    cfg = parse_config({"seed": 0, "agent": {"model": "tiny", "max_response_tokens": 16},
                        "reward": {"normalize_parts": normalize_parts},
                        "train": {"lr": 1e-3, "micro_batch_size": 8, "mini_batch_questions": 64, "device": "cpu"}})
    learner = GRPOLearner(cfg, tiny_model_path)
    calls = spy_policy_loss(monkeypatch)
    trajectories = _mixed_parts(learner.tokenizer)
    learner.step(trajectories)
    groups = [0, 0, 0, 1, 1, 1]
    totals = oracle_gdpo([[t.reward.total] for t in trajectories], groups, scale=True)
    parts = oracle_gdpo([[t.reward.format, t.reward.answer if t.reward.format == 1.0 else 0.0, t.reward.cost]
                         for t in trajectories], groups, scale=True)
    assert [round(a, 3) for a in parts] != [round(a, 3) for a in totals]  # the batch tells them apart
    assert len(calls) == 1
    assert calls[0]["adv"].tolist() == pytest.approx(parts if normalize_parts else totals, abs=1e-4)


# ---------------------------------------------------------------- the window across steps and resumes

def test_the_session_window_spans_steps_and_survives_a_checkpoint(tiny_model_path, tmp_path) -> None:
    """The training session scores each step against one window of every earlier step's costs,
    and a session restored from a checkpoint holds the same window (so `--resume` scales alike)."""
    from prompt_r1.config.experiment import parse_config
    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.learner.base import LocalLearner
    from prompt_r1.training.session import TrainingSession

    cfg = parse_config({"seed": 0, "agent": {"model": "tiny"}, "train": {"device": "cpu"},
                        "environment": {"name": "big", "price_per_1k_prompt": 0.3, "price_per_1k_completion": 1.2},
                        "reward": {"cost": {"mode": "bonus", "window": 50}}})

    def session() -> TrainingSession:
        s = TrainingSession(cfg, warehouse=None, run_id="r", run_dir=tmp_path)
        s.learner = LocalLearner(cfg, tiny_model_path)
        s.by_id = {q: QuestionRow(q, "d", "train", "question?", golds, "qa", "f1") for q, golds in GOLDS.items()}
        return s

    rng = random.Random(SEED + 5)
    first = session()
    steps = [_batch(rng, 8, ["big"]) for _ in range(3)]
    for batch in steps:
        first.score(batch)
    costs = [math.sqrt(oracle_cost(t.env_calls)) for batch in steps for t in batch if t.error is None]
    assert first.cost_window.values() == pytest.approx(costs, abs=1e-12)
    first.position = 3
    path = first.checkpoint()

    resumed = session()
    resumed.restore(path)
    assert resumed.cost_window.values() == first.cost_window.values()
    assert (resumed.step, resumed.position) == (first.step, 3)
    later = _batch(rng, 8, ["big"])
    twin = [Trajectory(t.question_id, t.group_index, [], agent_turns=list(t.agent_turns), env_calls=list(t.env_calls),
                       error=t.error) for t in later]
    first.score(later)
    resumed.score(twin)
    assert [t.reward for t in later] == [t.reward for t in twin]


def test_the_cost_part_reaches_the_warehouse(warehouse) -> None:
    """`reward_cost` beside the other parts; a record without it (written before it) stores 0.0, a
    trajectory ended by a failure NULL."""
    from prompt_r1.training.batch_stats import trajectory_rows

    scored = Trajectory("q0", 0, [], agent_turns=["x"], reward=RewardBreakdown(1.0, 1.0, 0.7, cost=-0.3))
    failed = Trajectory("q0", 1, [], agent_turns=["x"], error="HTTP 500")
    rows, calls = trajectory_rows([scored, failed])
    old = dict(rows[0], group_index=2, reward={"format": 1.0, "answer": 0.5, "total": 0.5})
    warehouse.replace_step("run", 0, rows + [old], calls)
    got = warehouse.query("SELECT group_index, reward_total, reward_cost FROM trajectories ORDER BY group_index")
    assert got == [(0, 0.7, -0.3), (1, None, None), (2, 0.5, 0.0)]


def test_a_scored_rollout_prices_its_calls_at_its_environment(tiny_model_path) -> None:
    """Validation and probes score inside the rollout: the calls are priced at that environment's
    `price_per_1k_*` (here the penalty, whose value shows the price)."""
    from tests.rollout.test_rollout import ANSWER, ASK, ScriptedEnv, ScriptedPolicy, question
    from transformers import AutoTokenizer

    from prompt_r1.config.env import EnvConfig
    from prompt_r1.config.experiment import AgentConfig, RolloutConfig
    from prompt_r1.rollout.episode import run_rollout

    env = ScriptedEnv()
    env.cfg = EnvConfig(name=env.name, price_per_1k_prompt=10.0, price_per_1k_completion=20.0)
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_path),
                            lambda text, n: ASK.format(n=n, q="France") if n < 2 else ANSWER)
    reward_cfg = RewardConfig(cost={"mode": "penalty", "penalty_scale": 1.0, "penalty_cap": 1.0})
    trajs = run_rollout(policy, env, [question(0)], AgentConfig(max_new_tokens=64), RolloutConfig(group_size=1),
                        reward_cfg, seed=0)
    (t,) = trajs
    usd = sum(c.prompt_tokens * 10.0 / 1000 + c.completion_tokens * 20.0 / 1000 for c in t.env_calls)
    assert len(t.env_calls) == 2 and 0 < usd < 1  # under the cap
    assert t.reward.answer == 1.0 and t.reward.total == pytest.approx(1.0 - usd, abs=1e-12)
