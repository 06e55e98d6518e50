"""Test helpers for the learner: configs, real sampling from the policy, a learnable reward.

Sampling is a plain loop over the real model (no KV cache; responses are a few tokens), so
the trajectories carry true sampling log-probs and depend only on the torch RNG.
"""

from __future__ import annotations

from typing import Any

import torch

from prompt_r1.config.experiment import Config, parse_config
from prompt_r1.core.reward import RewardBreakdown
from prompt_r1.core.trajectory import Trajectory


def make_config(lora: bool = False, temperature: float = 1.0, **train: Any) -> Config:
    """A learner config on the tiny model; keyword arguments are `train.*` settings."""
    settings = {"lr": 1e-3, "micro_batch_size": 4, "mini_batch_questions": 64, "kl_coef": 0.001, "device": "cpu"}
    settings.update(train)
    agent = {"model": "tiny", "max_response_tokens": 16, "temperature": temperature}
    if lora:
        agent["lora"] = {"enabled": True, "r": 4, "alpha": 8}
    return parse_config({"seed": 0, "agent": agent, "train": settings})


def prompt_ids(tokenizer, question: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)


def letter_ids(tokenizer) -> set[int]:
    """Ids of the single-byte tokens 'a'..'z' (about a tenth of the tiny vocabulary)."""
    return {tokenizer.convert_tokens_to_ids(ch) for ch in "abcdefghijklmnopqrstuvwxyz"}


def reward_of(total: float) -> RewardBreakdown:
    return RewardBreakdown(format=1.0 if total > 0.5 else 0.0, answer=total, total=total)


@torch.no_grad()
def sample(model, prompt: list[int], n: int, new_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """`n` sampled continuations of `prompt` (temperature 1) and their log-probs."""
    ids = torch.tensor([prompt] * n)
    logps: list[torch.Tensor] = []
    for _ in range(new_tokens):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        logprobs = torch.log_softmax(logits, -1)
        nxt = torch.multinomial(logprobs.exp(), 1)
        logps.append(logprobs.gather(-1, nxt).squeeze(-1))
        ids = torch.cat([ids, nxt], dim=1)
    tokens = ids[:, len(prompt):].tolist()
    return tokens, torch.stack(logps, 1).tolist()


def rollout(learner, questions: list[str], group_size: int, new_tokens: int) -> list[Trajectory]:
    """Real trajectories for `questions`; reward = share of sampled tokens that are letters."""
    letters = letter_ids(learner.tokenizer)
    learner.model.eval()
    out = []
    for qid in questions:
        prompt = prompt_ids(learner.tokenizer, f"question {qid}")
        tokens, logps = sample(learner.model, prompt, group_size, new_tokens)
        for g, (tok, lp) in enumerate(zip(tokens, logps)):
            score = sum(t in letters for t in tok) / len(tok)
            out.append(Trajectory(question_id=qid, group_index=g, prompt_ids=prompt, token_ids=tok,
                                  loss_mask=[1] * len(tok), logprobs=lp, agent_turns=["x"],
                                  reward=reward_of(score)))
    return out


def hand_trajectories(tokenizer) -> list[Trajectory]:
    """Two questions x 3 trajectories, uneven lengths, an inserted (mask 0) span, unequal rewards."""
    trajs = []
    for q, question in enumerate(["what is two plus two?", "name a colour"]):
        prompt = prompt_ids(tokenizer, question)
        for g in range(3):
            agent = tokenizer.encode(f"<think>t{g}</think><answer>{q + g}</answer>")[: 6 + 2 * g]
            inserted = tokenizer.encode(" env says hi")
            token_ids = agent + inserted + agent[:3]
            mask = [1] * len(agent) + [0] * len(inserted) + [1] * 3
            trajs.append(Trajectory(question_id=f"q{q}", group_index=g, prompt_ids=prompt, token_ids=token_ids,
                                    loss_mask=mask, logprobs=[-5.0 if m else 0.0 for m in mask],
                                    agent_turns=["a", "b"], reward=reward_of(0.3 * g + q)))
    return trajs


def spy_policy_loss(monkeypatch) -> list[dict]:
    """Record every policy_loss call the learner makes (its inputs and what it returned) while the
    real loss runs: the spy observes, it never replaces the loss."""
    import prompt_r1.learner.grpo_learner as learner_module

    calls: list[dict] = []
    real = learner_module.policy_loss

    def spy(logprobs, old, ref, adv, mask, *args, **kwargs):
        loss, stats = real(logprobs, old, ref, adv, mask, *args, **kwargs)
        calls.append({"logprobs": logprobs.detach().clone(), "old": old.clone(), "ref": ref, "adv": adv.clone(),
                      "mask": mask.clone(), "args": args, "kwargs": kwargs, "is_weights": kwargs.get("is_weights"),
                      "loss": loss.item(), "stats": stats})
        return loss, stats

    monkeypatch.setattr(learner_module, "policy_loss", spy)
    return calls


def tiny_llama(seed: int) -> torch.nn.Module:
    """A randomly initialised 2-layer Llama (vocabulary 97) in float32, for the log-prob paths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).float()
