"""Turn-level credit (`prompt_r1.core.turn_credit`): the rule against an independent restatement
over generated batches, the scorer's contract, and the learner's use of it (a real step on the
tiny model: which advantage each token got, and that uniform turn rewards change nothing)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_helpers import hand_trajectories, make_config, spy_policy_loss
from prompt_r1.config.experiment import parse_config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory, rollout_stats
from prompt_r1.core.turn_credit import (TurnRewardError, informative, load_turn_scorer, score_turns,
                                        token_advantages, turn_advantages, turn_spans)


def _random_batch(rng: random.Random) -> tuple[list[list[float | None]], list[str], list[float]]:
    """Groups of 1-5 members, 1-4 turns each, turn rewards None or drawn from a few values (ties likely)."""
    turn_rewards, groups, outcomes = [], [], []
    for g in range(rng.randint(1, 5)):
        for _ in range(rng.randint(1, 5)):
            turn_rewards.append([rng.choice([None, 0.0, 0.5, 1.0, rng.random()]) for _ in range(rng.randint(1, 4))])
            groups.append(f"g{g}")
            outcomes.append(rng.choice([-1.0, 0.0, 1.0]))
    order = list(range(len(groups)))
    rng.shuffle(order)  # groups interleaved, as nothing guarantees they come together
    return [turn_rewards[i] for i in order], [groups[i] for i in order], [outcomes[i] for i in order]


def test_turn_advantages_match_the_rule_on_random_batches() -> None:
    rng = random.Random(0)
    for _ in range(300):
        turn_rewards, groups, _ = _random_batch(rng)
        got = turn_advantages(turn_rewards, groups)
        for i, rewards in enumerate(turn_rewards):
            assert len(got[i]) == len(rewards)
            for t, r in enumerate(rewards):
                if r is None:
                    assert got[i][t] == 0.0
                    continue
                peers = [turn_rewards[j][t] for j in range(len(groups)) if groups[j] == groups[i]
                         and t < len(turn_rewards[j]) and turn_rewards[j][t] is not None]
                assert got[i][t] == pytest.approx(r - sum(peers) / len(peers), abs=1e-12)


def test_a_group_is_informative_when_its_outcome_or_some_turn_varies() -> None:
    rng = random.Random(1)
    for _ in range(300):
        turn_rewards, groups, outcomes = _random_batch(rng)
        got = informative(outcomes, turn_rewards, groups)
        for i, g in enumerate(groups):
            members = [j for j in range(len(groups)) if groups[j] == g]
            turns = max(len(turn_rewards[j]) for j in members)
            varies = len({outcomes[j] for j in members}) > 1 or any(
                len({turn_rewards[j][t] for j in members if t < len(turn_rewards[j])} - {None}) > 1
                for t in range(turns))
            assert got[i] == (len(members) > 1 and varies)
            # and that is exactly when some member's advantage is not 0 (outcome or turn)
            if len(members) > 1 and not varies:
                assert all(a == 0.0 for j in members for a in turn_advantages(turn_rewards, groups)[j])


def _response(rng: random.Random, turns: int) -> tuple[list[int], list[int]]:
    """A loss mask of `turns` sampled turns (>= 1 token) with inserted replies (>= 1 token) between
    them, and the turn index of every token (-1 for inserted ones)."""
    mask, owner = [], []
    for t in range(turns):
        if t:
            n = rng.randint(1, 4)
            mask += [0] * n
            owner += [-1] * n
        n = rng.randint(1, 5)
        mask += [1] * n
        owner += [t] * n
    return mask, owner


def test_token_advantages_put_each_turn_credit_on_its_own_tokens() -> None:
    rng = random.Random(2)
    for _ in range(300):
        turns = rng.randint(1, 5)
        mask, owner = _response(rng, turns)
        assert len(turn_spans(mask)) == turns
        outcome, weight = rng.uniform(-2, 2), rng.choice([0.0, 0.25, 0.5, 1.0])
        turn_adv = [rng.uniform(-1, 1) for _ in range(turns)]
        got = token_advantages(outcome, turn_adv, mask, weight)
        want = [outcome + (weight * turn_adv[o] if o >= 0 else 0.0) for o in owner]
        assert got == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="2 turn advantage"):
        token_advantages(0.0, [0.0, 0.0], [1, 1, 1], 0.5)


def test_per_token_advantages_equal_to_the_trajectory_one_give_the_same_loss() -> None:
    """policy_loss with [B, T] advantages that repeat each trajectory's [B] value is the same loss."""
    from prompt_r1.core.grpo import policy_loss

    gen = torch.Generator().manual_seed(0)
    for agg in ("token-mean", "seq-mean-token-sum-norm"):
        lp = torch.randn(4, 7, generator=gen) * 0.1 - 1
        old = lp + torch.randn(4, 7, generator=gen) * 0.2
        ref = lp + torch.randn(4, 7, generator=gen) * 0.1
        mask = (torch.rand(4, 7, generator=gen) > 0.3).float()
        adv = torch.randn(4, generator=gen)
        a, sa = policy_loss(lp, old, ref, adv, mask, agg=agg, clip_ratio_c=3.0)
        b, sb = policy_loss(lp, old, ref, adv.unsqueeze(-1).expand(4, 7).clone(), mask, agg=agg, clip_ratio_c=3.0)
        assert a.item() == pytest.approx(b.item(), abs=1e-7)
        assert sa == pytest.approx(sb)


# ---------------------------------------------------------------- the scorer's contract

def _question(text: str = "q?") -> QuestionRow:
    return QuestionRow("qid-1", "ds", "train", text, ["a"], "qa", "f1")


def test_a_scorer_is_named_by_import_path_and_bad_paths_name_the_setting() -> None:
    assert load_turn_scorer("prompt_r1.data.compositional:follow_up_turn_rewards").__name__ == "follow_up_turn_rewards"
    for bad, words in [("prompt_r1.data.compositional", "not an import path"),
                       ("no_such_module_xyz:f", "cannot import module `no_such_module_xyz`"),
                       ("prompt_r1.data.compositional:no_such_function", "has no function `no_such_function`"),
                       ("prompt_r1.data.compositional:COUNTRIES", "has no function `COUNTRIES`")]:
        with pytest.raises(TurnRewardError, match="reward.turn.scorer") as err:
            load_turn_scorer(bad)
        assert words in str(err.value)


@pytest.mark.parametrize("returned, words", [
    ([0.5], "1 value(s) for 2 agent turn(s)"),
    ([None, 1.5], "1.5"), ([None, -0.1], "-0.1"), ([None, math.nan], "nan"), ([None, math.inf], "inf"),
    ([None, True], "True"), ([None, "1"], "'1'"),
])
def test_a_scorer_answering_out_of_contract_stops_naming_the_question(returned, words) -> None:
    trajectory = Trajectory("qid-1", 0, [], agent_turns=["a", "b"])
    with pytest.raises(TurnRewardError) as err:
        score_turns(lambda q, t: returned, _question(), trajectory)
    assert "reward.turn.scorer" in str(err.value) and "'qid-1'" in str(err.value) and words in str(err.value)


def test_a_scorer_that_raises_stops_the_run_and_is_never_a_zero() -> None:
    def broken(question, trajectory):
        raise KeyError("no such row")

    with pytest.raises(TurnRewardError, match="raised KeyError"):
        score_turns(broken, _question(), Trajectory("qid-1", 0, [], agent_turns=["a"]))
    assert score_turns(lambda q, t: [None, 1], _question(), Trajectory("qid-1", 0, [], agent_turns=["a", "b"])) \
        == [None, 1.0]


def test_the_two_hop_scorer_rewards_the_follow_up_call() -> None:
    from prompt_r1.data.compositional import follow_up_turn_rewards, generate

    known = next(q for q in generate(0) if q.chain == "capital>continent" and q.source == "Oslo")
    question = _question(known.question)
    ask = "<think>t</think><interaction_prompt>{}</interaction_prompt>"
    first = ask.format(known.question)
    reply = "The capital of Norway is Oslo, said Bergen Times."
    cases = [
        ([first, ask.format("On which continent is Norway?"), "<think>t</think><answer>Europe</answer>"], 1.0),
        ([first, ask.format("What is Bergen Times?"), "<think>t</think><answer>x</answer>"], 0.5),
        ([first, ask.format("On which continent is it?"), "<think>t</think><answer>x</answer>"], 0.0),
        ([first, "<think>t</think><answer>Norway</answer>"], 0.0),   # answered instead of asking again
    ]
    for turns, want in cases:
        replies = [reply, "Europe."][: sum("<interaction_prompt>" in t for t in turns)]
        got = follow_up_turn_rewards(question, Trajectory("qid-1", 0, [], agent_turns=turns, env_replies=replies))
        assert got == [None, want] + [None] * (len(turns) - 2)
    assert follow_up_turn_rewards(question, Trajectory("qid-1", 0, [], agent_turns=[first])) == [None]
    assert follow_up_turn_rewards(question, Trajectory("qid-1", 0, [])) == []
    with pytest.raises(ValueError, match="not a generated two-hop question"):
        follow_up_turn_rewards(_question("What is the capital of France?"), Trajectory("qid-1", 0, []))


def test_turn_rewards_are_logged_per_turn_and_left_out_of_records_without_a_scorer() -> None:
    ts = [Trajectory("q", 0, [], turn_rewards=[None, 1.0]), Trajectory("q", 1, [], turn_rewards=[None, 0.0]),
          Trajectory("q", 2, [], turn_rewards=[None])]
    stats = rollout_stats(ts, 1.0)
    assert stats["turn_reward_t1"] == 0.5 and "turn_reward_t0" not in stats
    assert "turn_reward_t1" not in rollout_stats([Trajectory("q", 0, [])], 1.0)
    assert "turn_rewards" not in Trajectory("q", 0, []).to_record()
    assert Trajectory("q", 0, [], turn_rewards=[None, 0.5]).to_record()["turn_rewards"] == [None, 0.5]


def test_no_turn_scorer_keeps_the_run_hash_and_a_scorer_changes_it() -> None:
    today = parse_config({}).hash()
    assert parse_config({"reward": {"turn": {"weight": 0.9}}}).hash() == today
    scored = parse_config({"reward": {"turn": {"scorer": "prompt_r1.data.compositional:follow_up_turn_rewards"}}})
    assert scored.hash() != today and scored.reward.turn_credit
    measured = parse_config({"reward": {"turn": {"scorer": "a.b:c", "weight": 0}}})
    assert not measured.reward.turn_credit
    for bad in ["a.b", "a b:c", ":c", "a:", "a:b:c"]:
        with pytest.raises(Exception, match="scorer"):
            parse_config({"reward": {"turn": {"scorer": bad}}})


# ---------------------------------------------------------------- the learner

def _with_turns(trajectories: list[Trajectory], values: list[float]) -> list[Trajectory]:
    for t, v in zip(trajectories, values):
        t.turn_rewards = [None, v]
    return trajectories


def _turn_config(weight: float, **train):
    cfg = make_config(**train)
    return cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"turn": cfg.reward.turn.model_copy(
        update={"scorer": "prompt_r1.data.compositional:follow_up_turn_rewards", "weight": weight})})})


def test_the_learner_credits_each_turn_on_its_own_tokens(tiny_model_path, monkeypatch) -> None:
    from prompt_r1.core.grpo import group_advantages
    from prompt_r1.learner.grpo_learner import GRPOLearner

    learner = GRPOLearner(_turn_config(0.5, micro_batch_size=8, scale_by_std=False), tiny_model_path)
    calls = spy_policy_loss(monkeypatch)
    values = [1.0, 0.5, 0.0, 0.0, 0.0, 1.0]
    trajectories = _with_turns(hand_trajectories(learner.tokenizer), values)
    learner.step(trajectories)
    outcome = group_advantages(torch.tensor([t.reward.total for t in trajectories]),
                               torch.tensor([0, 0, 0, 1, 1, 1]), scale_by_std=False).tolist()
    mean = {0: 0.5, 1: 1 / 3}
    (call,) = calls
    adv, mask = call["adv"], call["mask"]
    for row, t in enumerate(trajectories):
        agent = [col for col in range(mask.shape[1]) if mask[row, col] == 1]
        first = len(agent) - 3   # hand trajectories: an agent turn, an inserted reply, then 3 agent tokens
        want_second = outcome[row] + 0.5 * (values[row] - mean[row // 3])
        assert adv[row, agent[:first]].tolist() == pytest.approx([outcome[row]] * first, abs=1e-6)
        assert adv[row, agent[first:]].tolist() == pytest.approx([want_second] * 3, abs=1e-6)


def _weights_after_step(path, cfg, trajectories) -> dict[str, torch.Tensor]:
    from prompt_r1.learner.grpo_learner import GRPOLearner

    learner = GRPOLearner(cfg, path)
    learner.step(trajectories)
    return {k: v.clone() for k, v in learner.model.state_dict().items()}


def test_uniform_turn_rewards_change_nothing_and_varied_ones_train_uniform_outcomes(tiny_model_path) -> None:
    """Equal turn rewards in every group: the same update as plain GRPO. Equal outcomes but varied
    turn rewards: plain GRPO (dropping uniform groups) has nothing to learn; turn credit does."""
    from prompt_r1.core.reward import RewardBreakdown
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    plain = _weights_after_step(tiny_model_path, make_config(), hand_trajectories(tokenizer))
    uniform = _weights_after_step(tiny_model_path, _turn_config(0.5),
                                  _with_turns(hand_trajectories(tokenizer), [0.5] * 3 + [1.0] * 3))
    assert all(torch.allclose(plain[k], uniform[k], atol=1e-6) for k in plain)

    def flat_outcomes():
        ts = hand_trajectories(tokenizer)
        for t in ts:
            t.reward = RewardBreakdown(1.0, 0.5, 0.5)
        return _with_turns(ts, [1.0, 0.0, 0.5, 0.0, 0.0, 1.0])

    from prompt_r1.learner.grpo_learner import GRPOLearner

    start = GRPOLearner(make_config(), tiny_model_path).model.state_dict()
    skipped = GRPOLearner(make_config(drop_uniform_groups=True), tiny_model_path).step(flat_outcomes())
    assert skipped.get("update_skipped") == 1.0
    credited = GRPOLearner(_turn_config(0.5, drop_uniform_groups=True), tiny_model_path)
    metrics = credited.step(flat_outcomes())
    assert "update_skipped" not in metrics and metrics["groups_informative"] == 2
    moved = max((credited.model.state_dict()[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-4


def test_turn_credit_without_turn_rewards_is_an_error(tiny_model_path) -> None:
    from prompt_r1.learner.grpo_learner import GRPOLearner
    from transformers import AutoTokenizer

    learner = GRPOLearner(_turn_config(0.5), tiny_model_path)
    with pytest.raises(ValueError, match="carry no turn rewards"):
        learner.step(hand_trajectories(AutoTokenizer.from_pretrained(tiny_model_path)))


# ---------------------------------------------------------------- a training run

SCORER = "prompt_r1.data.compositional:follow_up_turn_rewards"


def test_train_refuses_a_pool_the_scorer_does_not_define_before_any_model_loads(home, monkeypatch) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml", "--run-id", "turns",
                                      "--set", f"reward.turn.scorer={SCORER}"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text[-2000:]
    assert "Traceback" not in result.output
    assert "reward.turn.scorer" in text and "not a generated two-hop question" in text
    assert not list(home.rglob("checkpoints/*"))


def _run(home, cfg, run_id, monkeypatch):
    from prompt_r1.data.ingest import ingest
    from prompt_r1.training.session import TrainingSession
    from tests.training.test_determinism import recording_hooks
    from warehouse.store import Warehouse

    monkeypatch.setenv("PROMPT_R1_HOME", str(home))
    hooks, metrics, trajectories = recording_hooks()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, ["data/compositional"])
        with TrainingSession(cfg, wh, run_id, home / run_id) as session:
            agent = session.run(hooks).agent
    return metrics, trajectories, (agent / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_measured_turn_rewards_leave_the_run_as_it_was(tmp_path, monkeypatch) -> None:
    """A scorer at weight 0 (turn rewards computed and logged, not credited) trains the run that
    no scorer trains: the same trajectories, metrics and exported weights, byte for byte; every
    scored trajectory carries one turn reward per agent turn."""
    import ray

    from prompt_r1.config.experiment import load_config

    base = load_config("configs/smoke.yaml", {"data.sources": ["data/compositional"],
                                              "data.train_datasets": ["compositional_train"]})
    measured = load_config("configs/smoke.yaml", {"data.sources": ["data/compositional"],
                                                  "data.train_datasets": ["compositional_train"],
                                                  "reward.turn.scorer": SCORER, "reward.turn.weight": 0.0})
    try:
        off = _run(tmp_path / "off", base, "off", monkeypatch)
        on = _run(tmp_path / "on", measured, "on", monkeypatch)
    finally:
        ray.shutdown()
    scored = [t for step in on[1] for t in step if t["reward"] is not None]
    assert scored and all(len(t.pop("turn_rewards")) == len(t["agent_turns"]) for t in scored)
    assert on[1] == off[1]
    assert [{k: v for k, v in m.items() if not k.startswith("turn_reward_")} for m in on[0]] == off[0]
    assert on[2] == off[2]
