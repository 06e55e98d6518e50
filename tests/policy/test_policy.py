"""Policy backends: stops at (multi-token) tags and EOS, per-row limits, log-probs, weight loading;
the learner's log-probs equal the ones each backend sampled with (tempered distribution)."""

from __future__ import annotations

import pytest
import torch

from prompt_r1.config.experiment import AgentConfig, parse_config
from prompt_r1.core.seeding import derive_seed
from prompt_r1.policy import make_policy
from prompt_r1.policy.hf import TransformersPolicy, top_p_filter
from prompt_r1.core.tokens import agent_prompt_ids
from prompt_r1.core.weights import WeightUpdate
from sync_helpers import as_received

NEVER = ("\x00never\x00",)


def prompts_for(tokenizer, questions=("hi", "What is the capital of France, please tell me?")):
    return [agent_prompt_ids(tokenizer, q) for q in questions]


def recompute(policy, prompt, sample, temperature=1.0, top_p=1.0):
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + sample.token_ids])).logits[0, len(prompt) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
        if top_p < 1:
            logits = top_p_filter(logits, top_p)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_match_a_fresh_forward_with_left_padding(tiny_model_path, temperature, top_p, batch_invariant):
    policy = TransformersPolicy(tiny_model_path, temperature=temperature, top_p=top_p, stop_strings=NEVER,
                                batch_invariant=batch_invariant)
    prompts = prompts_for(policy.tokenizer)
    assert len(prompts[0]) != len(prompts[1])  # batched: the shorter one is left-padded
    samples = policy.generate(prompts, [30, 17], seeds=[3, 4])
    assert [len(s.token_ids) for s in samples] == [30, 17]
    assert [s.finish_reason for s in samples] == ["length", "length"]
    for prompt, sample in zip(prompts, samples):
        assert len(sample.logprobs) == len(sample.token_ids)
        assert sample.text == policy.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        assert torch.allclose(recompute(policy, prompt, sample, temperature, top_p),
                              torch.tensor(sample.logprobs), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_batch_rows_differ(tiny_model_path):
    policy = TransformersPolicy(tiny_model_path, temperature=1.0, stop_strings=NEVER)
    prompt = prompts_for(policy.tokenizer)[0]
    first = policy.generate([prompt, prompt], 20, seeds=[7, 8])
    again = policy.generate([prompt, prompt], 20, seeds=[7, 8])
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert first[0].token_ids != first[1].token_ids  # a GRPO group must not be one sample repeated


@pytest.mark.parametrize("model_name", ["tiny", "tiny-smollm2"])
def test_stops_at_a_stop_string_even_when_it_spans_tokens(model_name, _model_cache):
    from prompt_r1.models.bundled import resolve_model

    path = resolve_model(model_name)
    free = TransformersPolicy(path, temperature=1.0, stop_strings=NEVER)
    prompt = prompts_for(free.tokenizer)[1]
    ids = free.generate([prompt], 40, seeds=[5])[0].token_ids
    for end in range(6, 40):  # a stop string made of tokens 3..end-1 that first occurs there
        stop = free.tokenizer.decode(ids[3:end])
        if len(stop) >= 3 and len(set(ids[3:end])) > 1 and stop not in free.tokenizer.decode(ids[:end - 1]):
            break
    else:
        pytest.fail("no usable stop string in the reference sample")
    stopping = TransformersPolicy(path, temperature=1.0, stop_strings=(stop,))
    sample = stopping.generate([prompt], 40, seeds=[5])[0]
    assert sample.token_ids == ids[:end] and sample.finish_reason == "stop"
    assert sample.text.endswith(stop)
    short = stopping.generate([prompt], 2, seeds=[5])[0]
    assert short.token_ids == ids[:2] and short.finish_reason == "length"
    # the real protocol tags: one token in the tiny tokenizer, several in SmolLM2's
    protocol = TransformersPolicy(path, temperature=0.0)
    turn = protocol.tokenizer.encode("<think>a</think><answer>b</answer>", add_special_tokens=False)
    closing = protocol.tokenizer.encode("</answer>", add_special_tokens=False)
    assert (len(closing) > 1) == (model_name == "tiny-smollm2")
    assert protocol._hit_stop_string(turn) and not protocol._hit_stop_string(turn[:-1])


def test_protocol_tags_and_eos_stop(tiny_model_path):
    policy = TransformersPolicy(tiny_model_path, temperature=1.0, stop_strings=NEVER)
    tok = policy.tokenizer
    prompt = prompts_for(tok)[0]
    ids = policy.generate([prompt], 12, seeds=[2])[0].token_ids
    # the protocol tags are single tokens in the tiny tokenizer; the tail check sees them
    default = TransformersPolicy(tiny_model_path, temperature=0.0)
    assert default._hit_stop_string(tok.encode("<think>a</think><answer>b</answer>", add_special_tokens=False))
    assert default._hit_stop_string(tok.encode("x</interaction_prompt>", add_special_tokens=False))
    assert not default._hit_stop_string(tok.encode("<answer>b</answe", add_special_tokens=False))
    # EOS: pretend a sampled token is EOS; generation ends there and keeps it in token_ids
    cut = ids.index(ids[4]) + 1
    policy.stop_ids = {ids[4]}
    sample = policy.generate([prompt], 12, seeds=[2])[0]
    assert sample.token_ids == ids[:cut] and sample.finish_reason == "stop"
    assert len(sample.logprobs) == cut


def test_eos_is_kept_in_ids_but_not_in_text(tiny_model_path):
    policy = TransformersPolicy(tiny_model_path, temperature=0.0, stop_strings=NEVER)
    eos = policy.tokenizer.eos_token_id
    assert eos in policy.stop_ids and policy.tokenizer.convert_tokens_to_ids("<|im_end|>") in policy.stop_ids
    assert policy.tokenizer.decode([65, eos], skip_special_tokens=True) == "b"


def test_load_weights_changes_greedy_output(tiny_model_path):
    policy = make_policy(AgentConfig(model="tiny", temperature=0.0), tiny_model_path)
    prompt = prompts_for(policy.tokenizer)[1]
    before = policy.generate([prompt], 16)[0]
    torch.manual_seed(0)
    new_state = {k: v + 0.5 * torch.randn_like(v) for k, v in policy.state_dict().items()}
    policy.load_weights(new_state)
    after = policy.generate([prompt], 16)[0]
    assert after.token_ids != before.token_ids
    with pytest.raises(ValueError, match="unknown parameter names"):
        policy.load_weights({"module.lm_head.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="missing"):
        policy.load_weights({"lm_head.weight": new_state["lm_head.weight"]})


def test_per_row_limits_are_checked(tiny_model_path):
    policy = TransformersPolicy(tiny_model_path)
    with pytest.raises(ValueError, match="entries for 2 prompts"):
        policy.generate(prompts_for(policy.tokenizer), [3])
    assert policy.generate([], 5) == []


@pytest.mark.slow
def test_vllm_policy_generates_and_reloads_weights(smollm2_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    # a 63-bit seed, as rollout actors derive them (vLLM seeds numpy, which takes 32 bits)
    policy = make_policy(AgentConfig(model="smollm2-135m-instruct", backend="vllm", temperature=0.0), smollm2_path,
                         seed=derive_seed("rollout_actor", 0, 0))
    try:
        prompts = prompts_for(policy.tokenizer)
        samples = policy.generate(prompts, [40, 6], seeds=[1, 2])
        assert samples[1].finish_reason == "length" and len(samples[1].token_ids) == 6
        reference = AutoModelForCausalLM.from_pretrained(smollm2_path)
        for prompt, sample in zip(prompts, samples):
            assert len(sample.logprobs) == len(sample.token_ids) > 0
            with torch.no_grad():
                logits = reference(torch.tensor([prompt + sample.token_ids])).logits[0, len(prompt) - 1:-1]
            expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sample.token_ids)[:, None])
            assert torch.allclose(expected.squeeze(-1), torch.tensor(sample.logprobs), atol=1e-3)
        torch.manual_seed(0)
        new = {k: v + 0.05 * torch.randn_like(v) for k, v in reference.state_dict().items()}
        received = as_received(WeightUpdate.make(1, "full", new))  # read-only, as an engine receives it
        policy.load_weights(received.tensors)
        changed = policy.generate(prompts, [40, 6], seeds=[1, 2])
        assert [s.token_ids for s in changed] != [s.token_ids for s in samples]
        assert all(torch.equal(received.tensors[k], new[k]) for k in new)  # vLLM copied them, never wrote
    finally:
        policy.close()


@pytest.mark.parametrize("backend,model", [
    ("transformers", "tiny"),
    pytest.param("vllm", "smollm2-135m-instruct", marks=pytest.mark.slow),
])
def test_learner_logprobs_equal_the_sampled_ones_at_temperature_07(backend, model, _model_cache):
    """Old/new/reference log-probs must be those of the distribution the backend sampled from."""
    if backend == "vllm":
        pytest.importorskip("vllm")
    from grpo_helpers import reward_of

    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.learner.grpo_learner import GRPOLearner
    from prompt_r1.core.trajectory import Trajectory

    path = resolve_model(model)
    agent = {"model": model, "backend": backend, "temperature": 0.7}
    policy = make_policy(AgentConfig(**agent), path, seed=0)
    try:
        trajectories = []
        for q, prompt in enumerate(prompts_for(policy.tokenizer)):
            for g, sample in enumerate(policy.generate([prompt, prompt], [12, 7], seeds=[2 * q, 2 * q + 1])):
                trajectories.append(Trajectory(
                    question_id=f"q{q}", group_index=g, prompt_ids=prompt, token_ids=sample.token_ids,
                    loss_mask=[1] * len(sample.token_ids), logprobs=sample.logprobs, agent_turns=[sample.text],
                    reward=reward_of(0.5 * g)))
    finally:
        policy.close()
    tolerance = 1e-5 if backend == "transformers" else 2e-3  # vLLM's CPU kernels vs torch's
    train = {"lr": 1e-3, "device": "cpu", "micro_batch_size": 4}
    learner = GRPOLearner(parse_config({"agent": agent, "train": train}), path)
    for traj, mine in zip(trajectories, learner.response_logprobs(trajectories)):
        assert torch.allclose(mine, torch.tensor(traj.logprobs), atol=tolerance), (traj.logprobs, mine)
    metrics = learner.step(trajectories)
    assert metrics["logprob_diff"] < tolerance
    # raw logits (temperature 1) are another policy: the comparison above has teeth
    raw = GRPOLearner(parse_config({"agent": {**agent, "temperature": 1.0}, "train": train}), path)
    gaps = [(mine - torch.tensor(t.logprobs)).abs().mean().item()
            for t, mine in zip(trajectories, raw.response_logprobs(trajectories))]
    assert min(gaps) > 20 * tolerance, gaps
