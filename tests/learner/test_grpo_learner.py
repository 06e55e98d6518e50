"""GRPOLearner on real tiny models: weights move, LoRA keeps its base, accumulation is exact, it learns;
float32 master weights under bf16 autocast, device and training-config checks (tempered log-probs:
test_policy.py, per backend)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from grpo_helpers import hand_trajectories, make_config, rollout, spy_policy_loss
from transformers import AutoModelForCausalLM

from prompt_r1.config.experiment import load_config, parse_config
from prompt_r1.config.base import ConfigError
from prompt_r1.models.bundled import build_tiny_model
from prompt_r1.learner.devices import resolve_device
from prompt_r1.learner.grpo_learner import GRPOLearner
from prompt_r1.core.trajectory import rollout_stats


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_step_changes_weights_and_reports_metrics(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(micro_batch_size=2), tiny_model_path)
    before = _params(learner.model)
    trajectories = hand_trajectories(learner.tokenizer)
    metrics = learner.step(trajectories)
    after = _params(learner.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for key in ("pg_loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "lr", "logprob_diff", "step_time_s",
                "tokens_per_s"):
        assert isinstance(metrics[key], float), key
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # one epoch, one mini-batch: on-policy
    assert metrics["clip_fraction"] == 0.0
    # the batch's own statistics are the schedule's (TrainingSession.update), whichever the learner
    assert not set(rollout_stats(trajectories, format_cap=learner.cfg.reward.format_cap)) & set(metrics)
    assert metrics["logprob_diff"] > 0  # the hand-made sampling log-probs (-5) are not the model's
    # full fine-tuning: the frozen reference keeps the initial weights
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for name, value in fresh.named_parameters():
        assert torch.equal(dict(learner.reference.named_parameters())[name], value)


def test_a_training_step_reports_the_batchs_rollout_stats_beside_the_learners_metrics(tiny_model_path,
                                                                                     tmp_path) -> None:
    """`TrainingSession.update` adds the `rollout_stats` of the trajectories it trained on (the one
    batch-statistics rule) to whatever its learner returns, in this process or on ranks."""
    from prompt_r1.learner.base import LocalLearner
    from prompt_r1.training.session import TrainingSession

    cfg = make_config(micro_batch_size=2)
    session = TrainingSession(cfg, warehouse=None, run_id="r", run_dir=tmp_path)  # not entered: no I/O
    session.learner = LocalLearner(cfg, tiny_model_path)
    trajectories = hand_trajectories(session.learner.learner.tokenizer)
    metrics = session.update(trajectories)
    stats = rollout_stats(trajectories, format_cap=cfg.reward.format_cap)
    assert {k: metrics[k] for k in stats} == stats
    assert metrics["response_length"] == pytest.approx(sum(sum(t.loss_mask) for t in trajectories) / 6)
    assert {"pg_loss", "kl", "grad_norm", "groups_informative", "trajectories_used", "policy_age_mean"} <= set(metrics)


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
    merged.load_state_dict(learner.merged_state_dict())
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
        learner.step(trajectories)
        curve.append(rollout_stats(trajectories, format_cap=learner.cfg.reward.format_cap)["reward_mean"])
    torch.set_num_threads(threads)
    print(f"reward curve ({time.perf_counter() - start:.1f} s):", [round(r, 3) for r in curve])
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last > first + 0.3, curve


# -- precision, device, temperature, training checks ----------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _paper_precision_config():
    """configs/paper.yaml as it is (bf16 agent, lr 1e-6, weight decay, autocast), on CPU, tiny sizes."""
    return load_config(ROOT / "configs" / "paper.yaml", {
        "train.device": "cpu", "train.micro_batch_size": 3, "agent.max_response_tokens": 16})


def _changed_share(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    changed = sum((before[k] != after[k]).sum().item() for k in before)
    return changed / sum(v.numel() for v in before.values())


def test_paper_precision_one_step_at_lr_1e6_changes_nearly_all_weights(tiny_model_path) -> None:
    cfg = _paper_precision_config()
    assert (cfg.agent.dtype, cfg.train.lr, cfg.train.weight_decay) == ("bfloat16", 1e-6, 0.01)
    learner = GRPOLearner(cfg, tiny_model_path)
    assert learner.compute_dtype == torch.bfloat16  # bf16 compute under autocast on CPU
    assert all(p.dtype == torch.float32 for p in learner.params)
    before = _params(learner.model)
    learner.step(hand_trajectories(learner.tokenizer))
    share = _changed_share(before, _params(learner.model))
    assert share > 0.99, share
    for state in learner.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    # rollouts get the weights in their own dtype
    sent = learner.merged_state_dict()
    assert {v.dtype for v in sent.values()} == {torch.bfloat16}
    assert torch.equal(sent["lm_head.weight"], learner.model.lm_head.weight.detach().bfloat16())


def test_adamw_on_bf16_weights_loses_the_update_that_fp32_masters_keep(tiny_model_path) -> None:
    """The failure the master weights prevent: the same AdamW step applied to bf16 weights."""
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16)
    before = _params(bf16)
    optimizer = torch.optim.AdamW(bf16.parameters(), lr=1e-6, weight_decay=0.01)
    ids = torch.tensor([list(range(40))])
    bf16(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert _changed_share(before, _params(bf16)) < 0.1  # measured: about 2%


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_path) -> None:
    norms = {}
    for checkpointing in (False, True):
        learner = GRPOLearner(make_config(gradient_checkpointing=checkpointing, kl_coef=0.05), tiny_model_path)
        assert learner.model.is_gradient_checkpointing == checkpointing
        norms[checkpointing] = learner.step(hand_trajectories(learner.tokenizer))["grad_norm"]
    assert norms[True] == pytest.approx(norms[False], rel=1e-5)


@pytest.mark.parametrize("lora,checkpointing", [(False, False), (True, False), (False, True)])
def test_logits_in_chunks_give_the_same_update(tiny_model_path, lora, checkpointing) -> None:
    """`train.logits_chunk_tokens`: the same step's loss terms and the same gradient the optimiser
    is handed as with the whole logits tensor, with full weights or LoRA, with or without gradient
    checkpointing. (Gradients, not the weights after AdamW: its first step divides each gradient
    by its own size, so an element near zero turns float rounding into a visible difference.)"""
    results = {chunk: _update_and_gradients(make_config(lora=lora, kl_coef=0.05, lr=1e-2,
                                                        gradient_checkpointing=checkpointing,
                                                        logits_chunk_tokens=chunk), tiny_model_path)
               for chunk in (0, 3)}
    (plain, plain_grads), (chunked, chunked_grads) = results[0], results[3]
    for key in ("pg_loss", "kl", "clip_fraction", "grad_norm"):
        assert chunked[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-7), key
    assert len(plain_grads) == len(chunked_grads) >= 1
    for a, b in zip(plain_grads, chunked_grads):
        assert (a - b).norm() <= 1e-5 * a.norm() + 1e-8


def _update_and_gradients(cfg, model_path):
    """A learner's step on the hand trajectories: its metrics and each gradient handed to AdamW."""
    learner = GRPOLearner(cfg, model_path)
    handed: list[torch.Tensor] = []
    learner.optimizer.register_step_pre_hook(  # what the optimiser is about to apply
        lambda _opt, _args, _kwargs, params=learner.params, out=handed:
        out.append(torch.cat([p.grad.flatten() for p in params]).clone()))
    return learner.step(hand_trajectories(learner.tokenizer)), handed


@pytest.mark.parametrize("lora,budget,chunk", [(False, 400, 0), (False, 120, 0), (True, 120, 0), (False, 120, 4)])
def test_packed_micro_batches_give_the_same_update(tiny_model_path, lora, budget, chunk) -> None:
    """`train.pack_tokens`: whole trajectories packed into sequences (all in one, or several packs
    of a smaller budget; with LoRA; with the logits in chunks) against padded micro-batches: the
    same loss terms and the same gradient handed to the optimiser, over two mini-batches."""
    common = {"lora": lora, "kl_coef": 0.05, "lr": 1e-2, "mini_batch_questions": 1, "logits_chunk_tokens": chunk}
    plain, plain_grads = _update_and_gradients(make_config(**common), tiny_model_path)
    packed, packed_grads = _update_and_gradients(make_config(pack_tokens=budget, **common), tiny_model_path)
    for key in ("pg_loss", "kl", "clip_fraction", "grad_norm", "logprob_diff"):
        assert packed[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-7), key
    assert len(plain_grads) == len(packed_grads) == 2
    for a, b in zip(plain_grads, packed_grads):
        assert (a - b).norm() <= 1e-5 * a.norm() + 1e-8


def test_device_setting(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(device="cpu"), tiny_model_path)
    assert learner.device == torch.device("cpu") and learner.compute_dtype is None  # float32 agent
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="train.device"):
        make_config(device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            GRPOLearner(make_config(device="cuda:0"), tiny_model_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_learner_and_reference_run_on_the_gpu(tiny_model_path) -> None:
    cfg = _paper_precision_config().model_copy(deep=True)
    cfg.train.device = "cuda"
    learner = GRPOLearner(cfg, tiny_model_path)
    assert {p.device.type for p in learner.model.parameters()} == {"cuda"}
    assert {p.device.type for p in learner.reference.parameters()} == {"cuda"}
    # the frozen reference in the compute dtype (half the memory), the policy's master weights float32
    assert {p.dtype for p in learner.reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}
    before = _params(learner.model)
    learner.step(hand_trajectories(learner.tokenizer))
    assert _changed_share(before, _params(learner.model)) > 0.99
    assert {v.device.type for v in learner.merged_state_dict().values()} == {"cpu"}


@pytest.mark.parametrize("setting,field", [
    ({"rollout": {"group_size": 1}}, "rollout.group_size"),
    ({"agent": {"top_p": 0.8}}, "agent.top_p"),
    ({"agent": {"temperature": 0.0}}, "agent.temperature"),
])
def test_configs_that_cannot_train_are_refused_where_training_starts(tiny_model_path, tmp_path, setting, field):
    from prompt_r1.training.session import TrainingSession

    cfg = parse_config({"agent": {"model": "tiny"}, **setting})  # still a valid (evaluation) config
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        GRPOLearner(cfg, tiny_model_path)
    session = TrainingSession(cfg, warehouse=None, run_id="r", run_dir=tmp_path)  # fails before any I/O
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        session.__enter__()
    assert parse_config({}).training_problems() == []


# -- learning options (issue #20): each one against a rule stated here ---------------------------
def _uniform_second_group(tokenizer):
    """hand_trajectories with the second question's three rewards made equal (an uninformative group)."""
    from grpo_helpers import reward_of

    trajectories = hand_trajectories(tokenizer)
    for t in trajectories:
        if t.question_id == "q1":
            t.reward = reward_of(0.7)
    return trajectories


def test_informative_groups_are_counted_every_step(tiny_model_path) -> None:
    learner = GRPOLearner(make_config(), tiny_model_path)
    metrics = learner.step(_uniform_second_group(learner.tokenizer))
    assert (metrics["groups"], metrics["groups_informative"], metrics["informative_share"]) == (2.0, 1.0, 0.5)
    metrics = learner.step(hand_trajectories(learner.tokenizer))
    assert (metrics["groups"], metrics["groups_informative"], metrics["informative_share"]) == (2.0, 2.0, 1.0)


def test_dropping_uniform_groups_trains_as_if_they_were_never_sampled(tiny_model_path) -> None:
    """Dropped groups add no loss, KL or tokens: the update equals one on the informative groups alone."""
    def weights_after(drop: bool, only_informative: bool):
        learner = GRPOLearner(make_config(drop_uniform_groups=drop, kl_coef=0.05), tiny_model_path)
        trajectories = _uniform_second_group(learner.tokenizer)
        if only_informative:
            trajectories = [t for t in trajectories if t.question_id == "q0"]
        metrics = learner.step(trajectories)
        return _params(learner.model), metrics

    dropped, metrics = weights_after(drop=True, only_informative=False)
    alone, _ = weights_after(drop=False, only_informative=True)
    kept, _ = weights_after(drop=False, only_informative=False)
    assert all(torch.allclose(dropped[k], alone[k], rtol=0, atol=1e-7) for k in dropped)
    # without the option the uniform group's tokens dilute the token mean: another update
    assert any(not torch.allclose(kept[k], alone[k], rtol=0, atol=1e-7) for k in kept)
    assert (metrics["groups"], metrics["groups_informative"], metrics["informative_share"]) == (2.0, 1.0, 0.5)


def test_a_batch_of_uniform_groups_makes_no_update_when_dropping(tiny_model_path) -> None:
    from grpo_helpers import reward_of

    learner = GRPOLearner(make_config(drop_uniform_groups=True), tiny_model_path)
    trajectories = hand_trajectories(learner.tokenizer)
    for t in trajectories:
        t.reward = reward_of(0.25 if t.question_id == "q0" else -1.0)
    before = _params(learner.model)
    metrics = learner.step(trajectories)
    assert metrics["update_skipped"] == 1.0 and metrics["informative_share"] == 0.0 and metrics["groups"] == 2.0
    assert set(metrics) == {"groups", "groups_informative", "informative_share", "update_skipped", "lr", "step_time_s"}
    assert all(torch.equal(before[k], v) for k, v in _params(learner.model).items())


def test_lora_on_all_linear_layers_adapts_every_linear_but_the_output_head(tiny_model_path) -> None:
    from peft.tuners.lora import LoraLayer

    cfg = make_config(lora=True, lr=1e-2)
    cfg.agent.lora.target_modules = "all-linear"
    learner = GRPOLearner(cfg, tiny_model_path)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    linear = {name for name, m in base.named_modules() if isinstance(m, torch.nn.Linear)}
    adapted = {name for name, m in learner.model.get_base_model().named_modules() if isinstance(m, LoraLayer)}
    assert adapted == linear - {"lm_head"}
    assert any(".mlp." in name for name in adapted)  # not attention only, as the default list is
    learner.step(hand_trajectories(learner.tokenizer))
    # the broadcast weights carry every adapter's delta, the MLP's included
    ids = torch.tensor([learner.tokenizer.encode("<think>hello</think>")])
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    merged.load_state_dict(learner.merged_state_dict())
    learner.model.eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, learner.model(input_ids=ids).logits, atol=1e-5)
    sent = learner.merged_state_dict()
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(sent[name], dict(base.named_parameters())[name].detach())
    # a list still names modules; any other single string is refused where the config is read
    assert make_config(lora=True).agent.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(ConfigError, match="target_modules"):
        parse_config({"agent": {"lora": {"enabled": True, "target_modules": "all"}}})


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_kl_coef_zero_runs_no_reference_forward(tiny_model_path, monkeypatch, lora) -> None:
    """kl_coef 0: no reference copy is kept, no reference forward runs, the loss is the policy term alone."""
    def forwards(kl_coef: float):
        learner = GRPOLearner(make_config(lora=lora, kl_coef=kl_coef, micro_batch_size=6, lr=1e-2), tiny_model_path)
        count = []

        def count_pass(_module, _args, kwargs, _output) -> None:
            if kwargs.get("past_key_values") is None:  # a pass whose shared prompt ran first calls again with its cache
                count.append(1)

        for module in (learner.model, learner.reference):
            if module is not None:
                module.register_forward_hook(count_pass, with_kwargs=True)
        if lora and kl_coef == 0:  # the LoRA reference is the model with its adapter switched off
            monkeypatch.setattr(learner.model, "disable_adapter", lambda: pytest.fail("reference forward"))
        trajectories = hand_trajectories(learner.tokenizer)
        first = learner.step(trajectories)
        n_first = len(count)
        second = learner.step(trajectories)
        return learner, n_first, first, second

    calls = spy_policy_loss(monkeypatch)
    learner, n_forwards, first, second = forwards(0.0)
    assert learner.reference is None  # neither a frozen copy (full) nor a switched-off adapter used (lora)
    assert n_forwards == 1  # one micro-batch: the training forward alone (old log-probs come from it)
    assert first["kl"] == second["kl"] == 0.0
    assert calls and all(c["ref"] is None and c["args"][2] == 0.0 for c in calls)  # kl_coef passed as 0
    assert all(c["loss"] == c["stats"]["pg_loss"] for c in calls)  # loss = clipped policy term, nothing added
    with_kl, n_forwards, _, second_kl = forwards(0.05)
    assert n_forwards == 2 and (with_kl.reference is not None) != lora
    assert second_kl["kl"] > 0  # after the first update the policy has left the reference


def test_later_ppo_epochs_use_the_clipped_ratio_to_fixed_old_log_probs(tiny_model_path, monkeypatch) -> None:
    """ppo_epochs 2: the second pass sees the first pass's update as ratios != 1 against the same
    old log-probs, and its loss is the clipped objective (clip-higher bounds passed through)."""
    calls = spy_policy_loss(monkeypatch)
    learner = GRPOLearner(make_config(ppo_epochs=2, micro_batch_size=6, kl_coef=0.0, lr=1e-2, clip_high=0.28),
                          tiny_model_path)
    metrics = learner.step(hand_trajectories(learner.tokenizer))
    assert len(calls) == 2  # one micro-batch, one mini-batch, two epochs
    first, second = calls
    assert first["args"][:2] == second["args"][:2] == (0.2, 0.28)
    assert torch.equal(first["old"], second["old"])  # fixed before the first pass...
    agent = first["mask"].bool()
    assert torch.allclose(first["old"][agent], first["logprobs"][agent], atol=1e-6)  # ...as the policy that sampled
    assert first["stats"]["clip_fraction"] == 0.0 and first["stats"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    mask = second["mask"].bool()
    rho = torch.exp(second["logprobs"] - second["old"])[mask]
    assert (rho - 1).abs().max() > 0.28  # the weights moved: some ratios leave the clip range
    adv = second["adv"][:, None].expand_as(second["mask"])[mask]
    # the clipped objective, written out per token: A > 0 gains up to 1 + 0.28, A < 0 down to 1 - 0.2
    clipped = torch.where(adv > 0, -adv * torch.clamp(rho, max=1.28), -adv * torch.clamp(rho, min=0.8))
    assert second["loss"] == pytest.approx(clipped.mean().item(), rel=1e-5)
    assert second["loss"] != pytest.approx((-adv * rho).mean().item(), rel=1e-3)  # not the unclipped surrogate
    assert second["stats"]["clip_fraction"] > 0
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_fraction"] == pytest.approx(second["stats"]["clip_fraction"] / 2)  # mean over passes
