"""The learner's sampler/learner correction (`train.rollout_correction`, `core.rollout_correction`):
off is today's update, each mode weights the policy term as its rule says, the metrics reach the
step's metrics beside the reward, and the learner's log-probs of the sampled agent tokens of a
two-turn trajectory are the sampler's through the padded, packed and chunked-logits paths, to
float rounding only (the micro-batch's shape must not change them; verl#2996)."""

from __future__ import annotations

import random

import pytest
import torch
from grpo_helpers import hand_trajectories, prompt_ids, reward_of, spy_policy_loss

from prompt_r1.config.experiment import parse_config
from prompt_r1.core.grpo import truncated_is_weights
from prompt_r1.core.rollout_correction import geometric_keep
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.learner.grpo_learner import GRPOLearner

TEMPERATURE = 0.7
# every metric a step reported before rollout correction existed (max_staleness 0): off keeps exactly these
TODAYS_KEYS = {"clip_fraction", "dual_clip_fraction", "grad_norm", "groups", "groups_informative",
               "informative_share", "kl", "logprob_diff", "lr", "pg_loss", "ratio_mean", "step_time_s",
               "tokens_per_s"}
CORRECTION_KEYS = {f"rollout_corr/{k}" for k in ("kl", "k3_kl", "chi2_token", "chi2_seq", "ess", "token_capped_share",
                                                 "seq_masked_share", "token_masked_share")}


def _config(mode: str = "off", staleness: int = 0, temperature: float = 1.0, **train):
    settings = {"lr": 1e-3, "micro_batch_size": 3, "mini_batch_questions": 64, "kl_coef": 0.001, "device": "cpu",
                "tis_cap": 1.5, "rollout_correction": {"mode": mode, "geo_low": 0.9, "geo_high": 1.1}}
    settings.update(train)
    return parse_config({"seed": 0, "agent": {"model": "tiny", "max_response_tokens": 64, "temperature": temperature},
                         "rollout": {"max_staleness": staleness}, "train": settings})


def _moved(learner: GRPOLearner) -> list[Trajectory]:
    """hand_trajectories whose sampler log-probs are the learner's own, moved per agent token by
    +-0.6 (first question: TIS caps some, the geometric mean leaves [0.9, 1.1]) or by 1e-3 (second)."""
    trajectories = hand_trajectories(learner.tokenizer)
    rng = random.Random(4)
    for t, lp in zip(trajectories, learner.response_logprobs(trajectories)):
        step = 0.6 if t.question_id == "q0" else 1e-3
        t.logprobs = [v + rng.choice([-step, step]) if m else 0.0 for v, m in zip(lp.tolist(), t.loss_mask)]
    return trajectories


def _weights(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


def test_off_keeps_todays_loss_and_metrics_and_measuring_changes_no_weight(tiny_model_path, monkeypatch) -> None:
    calls = spy_policy_loss(monkeypatch)
    off = GRPOLearner(_config("off"), tiny_model_path)
    trajectories = _moved(off)
    m_off = off.step(trajectories)
    assert all(call["is_weights"] is None for call in calls)
    assert set(m_off) == TODAYS_KEYS
    measured = GRPOLearner(_config("metrics"), tiny_model_path)
    m_measured = measured.step(trajectories)
    assert set(m_measured) == TODAYS_KEYS | CORRECTION_KEYS
    assert all(call["is_weights"] is None for call in calls)
    for key in TODAYS_KEYS - {"step_time_s", "tokens_per_s"}:
        assert m_measured[key] == m_off[key], key  # exactly: the metrics mode only looks
    after_off, after_measured = _weights(off), _weights(measured)
    assert all(torch.equal(after_off[k], after_measured[k]) for k in after_off)


def test_stale_off_is_token_tis_and_token_tis_applies_it_at_staleness_0(tiny_model_path, monkeypatch) -> None:
    calls = spy_policy_loss(monkeypatch)
    results = {}
    for name, cfg in {"stale": _config("off", staleness=1, micro_batch_size=6),
                      "tis": _config("token-tis", micro_batch_size=6)}.items():
        learner = GRPOLearner(cfg, tiny_model_path)
        trajectories = _moved(learner)
        calls.clear()
        metrics = learner.step(trajectories)
        (call,) = calls
        want = truncated_is_weights(call["old"], _sampled(learner, trajectories), 1.5)
        assert torch.equal(call["is_weights"] * call["mask"], want * call["mask"])
        results[name] = (metrics, _weights(learner))
        assert {"tis_mean", "tis_capped_fraction"} <= set(metrics)
    assert not CORRECTION_KEYS & set(results["stale"][0])  # off: no new metric at any staleness
    assert CORRECTION_KEYS <= set(results["tis"][0])
    # the same weights from the same batch: one code path for both causes
    assert all(torch.equal(results["stale"][1][k], results["tis"][1][k]) for k in results["tis"][1])
    assert results["tis"][0]["tis_capped_fraction"] == results["stale"][0]["tis_capped_fraction"] > 0


def _sampled(learner: GRPOLearner, trajectories: list[Trajectory]) -> torch.Tensor:
    """The batch's sampler log-probs in the layout of its one micro-batch."""
    batch = learner.prepare(trajectories, None)
    ((micro, *rest),) = batch.mini_batches
    assert not rest
    return micro.sampling_logprobs


def test_geo_mask_zeroes_whole_trajectories_and_both_multiplies(tiny_model_path, monkeypatch) -> None:
    calls = spy_policy_loss(monkeypatch)
    for mode in ("geo-mask", "both"):
        learner = GRPOLearner(_config(mode, micro_batch_size=6), tiny_model_path)
        trajectories = _moved(learner)
        calls.clear()
        metrics = learner.step(trajectories)
        (call,) = calls
        batch = learner.prepare(trajectories, None)
        ((micro,),) = batch.mini_batches
        seq = batch.sequence_ids(micro)
        keep = geometric_keep(call["old"], micro.sampling_logprobs, micro.loss_mask, seq, (0.9, 1.1))
        tis = truncated_is_weights(call["old"], micro.sampling_logprobs, 1.5) if mode == "both" else 1.0
        agent = call["mask"].bool()
        assert torch.equal(call["is_weights"][agent], (keep * tis)[agent])
        # one trajectory a row: each row's agent tokens all kept or all masked; the second question's
        # (moved by 1e-3) kept, some of the first's (moved by 0.6) masked
        rows = [set(keep[r][micro.loss_mask[r] > 0].tolist()) for r in range(6)]
        assert rows[3:] == [{1.0}] * 3 and {0.0} in rows[:3] and all(len(r) == 1 for r in rows)
        assert metrics["rollout_corr/seq_masked_share"] == pytest.approx(rows.count({0.0}) / 6)
        assert ("tis_mean" in metrics) == (mode == "both")


def test_a_correction_needs_the_samplers_log_probs(tiny_model_path) -> None:
    learner = GRPOLearner(_config("metrics"), tiny_model_path)
    trajectories = hand_trajectories(learner.tokenizer)
    for t in trajectories:
        t.logprobs = []
    with pytest.raises(ValueError, match="rollout_correction"):
        learner.step(trajectories)
    GRPOLearner(_config("off"), tiny_model_path).step(trajectories)  # off: not needed, as before


def test_the_mismatch_metrics_reach_the_step_beside_the_reward(tiny_model_path, tmp_path) -> None:
    from prompt_r1.learner.base import LocalLearner
    from prompt_r1.training.session import TrainingSession

    cfg = _config("metrics")
    session = TrainingSession(cfg, warehouse=None, run_id="r", run_dir=tmp_path)  # not entered: no I/O
    session.learner = LocalLearner(cfg, tiny_model_path)
    metrics = session.update(_moved(session.learner.learner))
    assert {"reward_mean", "logprob_diff"} | CORRECTION_KEYS <= set(metrics)
    assert metrics["rollout_corr/k3_kl"] > 0 and 0 < metrics["rollout_corr/ess"] < 1


# -- the sampler's log-probs against the learner's, through every micro-batch layout ----------------

@torch.no_grad()
def _two_turn_rollouts(model, tokenizer, questions: int, group: int, seed: int) -> list[Trajectory]:
    """Two agent turns around an environment reply (loss mask 0), sampled one token at a time at
    TEMPERATURE by a plain loop over the model (batch 1, the whole context each token: another shape
    than any learner micro-batch), with the sampler's own log-probs of what it drew."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    model.eval()
    out = []
    for q in range(questions):
        prompt = prompt_ids(tokenizer, f"question {q}: " + "which entity links the two? " * (q + 1))
        for g in range(group):
            ids, token_ids, mask, logprobs = list(prompt), [], [], []
            for turn in range(2):
                for _ in range(rng.randint(3, 9)):
                    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
                    lp = torch.log_softmax(logits / TEMPERATURE, -1)
                    token = int(torch.multinomial(lp.exp(), 1, generator=gen))
                    ids.append(token)
                    token_ids.append(token)
                    mask.append(1)
                    logprobs.append(lp[token].item())
                if turn == 0:
                    reply = tokenizer.encode(f" the environment says {g} and more" * (g + 1))
                    ids += reply
                    token_ids += reply
                    mask += [0] * len(reply)
                    logprobs += [0.0] * len(reply)
            out.append(Trajectory(question_id=f"q{q}", group_index=g, prompt_ids=prompt, token_ids=token_ids,
                                  loss_mask=mask, logprobs=logprobs, agent_turns=["a", "b"],
                                  reward=reward_of(0.3 * g)))
    return out


LAYOUTS = {"padded": {}, "padded-chunked": {"logits_chunk_tokens": 4}, "packed": {"pack_tokens": 512},
           "packed-chunked": {"pack_tokens": 512, "logits_chunk_tokens": 3}, "padded-one": {"micro_batch_size": 1}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_learner_log_probs_of_sampled_agent_tokens_are_the_samplers(tiny_model_path, layout) -> None:
    learner = GRPOLearner(_config("metrics", temperature=TEMPERATURE, **LAYOUTS[layout]), tiny_model_path)
    trajectories = _two_turn_rollouts(learner.model, learner.tokenizer, questions=2, group=3, seed=11)
    batch = learner.prepare(trajectories, None)
    got: dict[int, torch.Tensor] = {}
    for mini in batch.mini_batches:
        for micro in mini:
            assert micro.packed == ("pack_tokens" in LAYOUTS[layout])
            for i, v in zip(micro.indices, batch.split(micro, learner._logprobs_no_grad(micro, reference=False))):
                got[i] = v
    assert sorted(got) == list(range(len(trajectories)))
    worst = 0.0
    for i, t in enumerate(trajectories):
        agent = torch.tensor(t.loss_mask, dtype=torch.bool)
        worst = max(worst, (got[i] - torch.tensor(t.logprobs))[agent].abs().max().item())
    assert worst < 2e-5, worst  # float32 rounding of another shape's matmuls, no more
    metrics = learner.step(trajectories)  # and the step's own view of the same gap, agent tokens only
    assert metrics["logprob_diff"] < 2e-5
    assert metrics["rollout_corr/k3_kl"] < 1e-9 and metrics["rollout_corr/ess"] > 1 - 1e-9
    assert metrics["rollout_corr/seq_masked_share"] == 0.0 and metrics["rollout_corr/token_capped_share"] == 0.0


def test_the_comparison_has_teeth(tiny_model_path) -> None:
    """A learner at another temperature than the sampler's is caught: its log-probs are far off."""
    learner = GRPOLearner(_config("metrics", temperature=1.0), tiny_model_path)
    trajectories = _two_turn_rollouts(learner.model, learner.tokenizer, questions=1, group=2, seed=3)
    metrics = learner.step(trajectories)
    assert metrics["logprob_diff"] > 1e-2 and metrics["rollout_corr/k3_kl"] > 1e-4
