"""GRPOLearner on real tiny models: weights move, LoRA keeps its base, accumulation is exact, it learns."""

from __future__ import annotations

import time

import pytest
import torch
from grpo_helpers import hand_trajectories, make_config, rollout
from transformers import AutoModelForCausalLM

from prompt_r1.models import build_tiny_model
from prompt_r1.trainer import GRPOLearner


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_step_changes_weights_and_reports_metrics(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(micro_batch_size=2), tiny_model_path)
    before = _params(learner.model)
    trajectories = hand_trajectories(learner.tokenizer)
    metrics = learner.step(trajectories)
    after = _params(learner.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for key in ("reward_mean", "reward_std", "format_valid_rate", "answer_score", "turns", "env_calls",
                "response_length", "pg_loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "lr",
                "logprob_diff", "step_time_s", "tokens_per_s"):
        assert isinstance(metrics[key], float), key
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # one epoch, one mini-batch: on-policy
    assert metrics["clip_fraction"] == 0.0
    assert metrics["response_length"] == pytest.approx(sum(sum(t.loss_mask) for t in trajectories) / 6)
    assert metrics["logprob_diff"] > 0  # the hand-made sampling log-probs (-5) are not the model's
    # full fine-tuning: the frozen reference keeps the initial weights
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for name, value in fresh.named_parameters():
        assert torch.equal(dict(learner.reference.named_parameters())[name], value)


def test_lora_trains_only_the_adapter_and_reference_is_the_base(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(lora=True, lr=1e-2), tiny_model_path)
    before = _params(learner.model)
    learner.step(hand_trajectories(learner.tokenizer))
    after = _params(learner.model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    assert any("lora_B" in k for k in changed)
    # the reference (adapter disabled) equals the untouched base model; the policy differs
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    ids = torch.tensor([learner.tokenizer.encode("<think>hello</think>")])
    learner.model.eval()
    with torch.no_grad():
        with learner.model.disable_adapter():
            reference_logits = learner.model(input_ids=ids).logits
        policy_logits = learner.model(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    assert torch.allclose(reference_logits, base_logits, atol=1e-6)
    assert not torch.allclose(policy_logits, base_logits, atol=1e-4)
    # the broadcast state dict is a plain HF dict with the adapter merged in
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    merged.load_state_dict(learner.state_dict_for_broadcast())
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, policy_logits, atol=1e-5)


def test_micro_batches_accumulate_to_the_full_mini_batch_gradient(tiny_model_path) -> None:
    norms = {}
    for micro in (1, 6):
        learner = GRPOLearner(make_config(micro_batch_size=micro, kl_coef=0.05), tiny_model_path)
        norms[micro] = learner.step(hand_trajectories(learner.tokenizer))["grad_norm"]
    assert norms[1] == pytest.approx(norms[6], rel=1e-4)


def test_several_mini_batches_and_epochs_go_off_policy(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(mini_batch_questions=1, ppo_epochs=2, lr=1e-2), tiny_model_path)
    metrics = learner.step(hand_trajectories(learner.tokenizer))
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-7)  # later updates see moved weights
    assert metrics["kl"] > 0


def test_warmup_schedule(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(lr=1e-3, warmup_steps=4), tiny_model_path)
    lrs = [learner.step(hand_trajectories(learner.tokenizer))["lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_grpo_learns_a_simple_reward(tmp_path) -> None:
    """Reward = share of sampled tokens that are letters a-z (about 0.1 at random init)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread only adds contention on 2 cores
    model_path = build_tiny_model(tmp_path / "tiny-learn", hidden_size=64, seed=1)
    learner = GRPOLearner(make_config(lr=5e-3, micro_batch_size=4, kl_coef=0.001), model_path)
    curve = []
    start = time.perf_counter()
    for _ in range(30):
        trajectories = rollout(learner, ["a", "b"], group_size=8, new_tokens=12)
        curve.append(learner.step(trajectories)["reward_mean"])
    torch.set_num_threads(threads)
    print(f"reward curve ({time.perf_counter() - start:.1f} s):", [round(r, 3) for r in curve])
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last > first + 0.3, curve
