"""The GRPO objective as pure torch functions: group advantages, the clipped loss, token log-probs.

Kept free of models, configs and I/O so the maths that must be exactly right (the rules listed
below, as in the Prompt-R1 reference) can be checked against hand-computed values in isolation:

- advantage of trajectory i = (r_i - mean(r_group)) / (std(r_group) + eps), unbiased std, or
  r_i - mean(r_group) without std scaling ("Dr.GRPO"); a group of one gets 0; with
  `reward.normalize_parts` (GDPO) the sum of that advantage taken over each reward part alone;
- a group is informative when it has >= 2 members whose rewards are not all equal; the others
  have advantage 0 everywhere (DAPO's dynamic sampling drops them, `informative_groups`);
- loss per token = max(-A*rho, -A*clip(rho, 1-eps_low, 1+eps_high)) + beta * k3-KL to the
  reference, k3 = exp(ref - logp) - (ref - logp) - 1 clamped to [-10, 10]; optional dual clip
  for A < 0: the policy term is capped at -c*A (as in verl's `clip_ratio_c`);
- aggregation "token-mean" over all mask-1 tokens, or "seq-mean-token-sum-norm" (Dr.GRPO);
- log-probs are those of the sampling distribution, softmax(logits / temperature), so the
  ratio compares the policy that sampled with the one being optimised;
- asynchronous rollouts (`rollout.max_staleness` >= 1): the batch was sampled by older weights
  (the behaviour policy, log-probs b recorded by the engine). The ratio rho = exp(logp - old) stays
  against the learner's own log-probs before the update (old: the trust region is around the
  current weights), and each token's policy term is multiplied by the truncated importance weight
  w = min(exp(old - b), tis_cap), a constant (no gradient). Untruncated, w * rho = pi / behaviour:
  the ratio to the policy that sampled; the cap bounds the variance when the engine gave a token
  far less probability than the learner does (stale weights, or engine-vs-learner numerics).
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-sum-norm"]
KL_CLAMP = 10.0


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages, one per trajectory.

    `group_ids` are any integer labels (one per trajectory, need not be contiguous).

    >>> adv = group_advantages(torch.tensor([1.0, 0.0, 5.0, 5.0, 2.0]), torch.tensor([7, 7, 3, 3, 9]))
    >>> [round(a, 4) for a in adv.tolist()]
    [0.7071, -0.7071, 0.0, 0.0, 0.0]
    >>> group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), scale_by_std=False).tolist()
    [0.5, -0.5]
    """
    rewards = rewards.to(torch.float32).flatten()
    _, inverse, counts = torch.unique(group_ids.flatten(), return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    counts_f = counts.to(torch.float32)
    sums = torch.zeros(n_groups, dtype=torch.float32).index_add_(0, inverse, rewards)
    means = sums / counts_f
    centered = rewards - means[inverse]
    if scale_by_std:
        squares = torch.zeros(n_groups, dtype=torch.float32).index_add_(0, inverse, centered ** 2)
        std = torch.sqrt(squares / (counts_f - 1).clamp(min=1.0))  # unbiased, like torch.std
        centered = centered / (std[inverse] + eps)
    return torch.where(counts[inverse] > 1, centered, torch.zeros_like(centered))


def decoupled_advantages(parts: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True,
                         eps: float = 1e-6) -> torch.Tensor:
    """GDPO (arXiv 2601.05242): the sum over reward parts (columns of `parts`, [N, K]) of each
    part's own group advantage, so distinct combinations of parts keep distinct advantages.

    Group 0: one trajectory has both parts; group 1: one has only the first. GRPO on the sums
    gives both the same advantage, GDPO gives the first twice as much:

    >>> parts = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    >>> ids = torch.tensor([0, 0, 1, 1])
    >>> [round(a, 3) for a in group_advantages(parts.sum(1), ids).tolist()]
    [0.707, -0.707, 0.707, -0.707]
    >>> [round(a, 3) for a in decoupled_advantages(parts, ids).tolist()]
    [1.414, -1.414, 0.707, -0.707]
    """
    if parts.dim() != 2:
        raise ValueError(f"parts must be [trajectories, parts], got shape {tuple(parts.shape)}")
    out = torch.zeros(parts.shape[0], dtype=torch.float32)
    for k in range(parts.shape[1]):
        out += group_advantages(parts[:, k], group_ids, scale_by_std=scale_by_std, eps=eps)
    return out


def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per trajectory: does its group carry a learning signal (>= 2 members, rewards not all equal)?

    Rewards are compared as float32, the precision `group_advantages` works in, so a group it
    gives all-zero advantages (equal rewards, or one member) is exactly a group marked False here.

    >>> informative_groups(torch.tensor([1.0, 0.0, 5.0, 5.0, 2.0]), torch.tensor([7, 7, 3, 3, 9])).tolist()
    [True, True, False, False, False]
    """
    rewards = rewards.to(torch.float32).flatten()
    _, inverse, counts = torch.unique(group_ids.flatten(), return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    high = torch.full((n_groups,), -torch.inf).scatter_reduce_(0, inverse, rewards, "amax")
    low = torch.full((n_groups,), torch.inf).scatter_reduce_(0, inverse, rewards, "amin")
    return ((high > low) & (counts > 1))[inverse]


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token "low_var_kl" estimate of KL(pi || ref), clamped to [-10, 10].

    >>> k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item()
    0.0
    """
    log_ratio = ref_logprobs - logprobs
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


def truncated_is_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token w = min(exp(old - behaviour), cap): how much likelier the learner's weights before
    the update make a token than the (older, or other-engine) weights that sampled it, truncated.

    >>> [round(w, 4) for w in truncated_is_weights(torch.tensor([-1.0, -1.0, -0.1]),
    ...                                            torch.tensor([-1.0, -0.5, -3.0]), cap=2.0).tolist()]
    [1.0, 0.6065, 2.0]
    """
    if cap < 1.0:
        raise ValueError(f"tis_cap must be >= 1 (a cap below 1 would down-weight on-policy tokens), got {cap}")
    return torch.exp(old_logprobs.float() - behaviour_logprobs.float()).clamp(max=cap).detach()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: LossAgg = "token-mean",
              max_len: int | None = None) -> torch.Tensor:
    """One scalar from [B, T] per-token values over the mask-1 tokens: "token-mean" averages over
    every such token of the batch, "seq-mean-token-sum-norm" sums each row, divides by `max_len`
    (default T) and averages the rows.

    >>> aggregate(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])).item()
    3.0
    >>> aggregate(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
    ...           "seq-mean-token-sum-norm").item()
    2.25
    """
    if agg == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if agg == "seq-mean-token-sum-norm":
        norm = float(max_len if max_len is not None else per_token.shape[-1])
        return ((per_token * mask).sum(-1) / norm).mean()
    raise ValueError(f"unknown loss aggregation {agg!r}; use 'token-mean' or 'seq-mean-token-sum-norm'")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None,
                advantages: torch.Tensor, mask: torch.Tensor, clip_low: float = 0.2,
                clip_high: float = 0.2, kl_coef: float = 0.001, agg: LossAgg = "token-mean",
                max_len: int | None = None, clip_ratio_c: float | None = None,
                is_weights: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO loss with a k3 KL penalty; per-token tensors are [B, T], advantages [B] (one
    per trajectory) or [B, T] (one per token, under turn-level credit, `core.turn_credit`).

    Returns `(loss, stats)`; stats (floats): pg_loss and kl (aggregated like the loss),
    clip_fraction (share of mask-1 tokens taking the clipped branch), dual_clip_fraction
    (share capped by `clip_ratio_c`), ratio_mean, tokens.
    `ref_logprobs=None` (or kl_coef 0 with None) leaves the KL term out.
    `is_weights` ([B, T], from `truncated_is_weights`) multiply each token's policy term after
    clipping (the KL term is not weighted); None = 1 everywhere, the on-policy loss.

    >>> lp = torch.log(torch.tensor([[0.5, 0.5]]))
    >>> loss, stats = policy_loss(lp, lp, lp, torch.tensor([2.0]), torch.tensor([[1.0, 0.0]]))
    >>> round(loss.item(), 4), stats["clip_fraction"], stats["ratio_mean"]
    (-2.0, 0.0, 1.0)

    Dual clip: with A = -1 and ratio 5, plain clipping gives 5; the bound c = 3 caps it at 3.

    >>> far = torch.log(torch.tensor([[5.0]]))
    >>> policy_loss(far, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1), clip_ratio_c=3.0)[0].item()
    3.0
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the reference uses 3.0), got {clip_ratio_c}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    adv = adv if adv.dim() == 2 else adv.unsqueeze(-1)  # [B, T] per token (turn credit), or [B] per trajectory
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(pg, dtype=torch.bool)
    if clip_ratio_c is not None:
        cap = -adv * clip_ratio_c
        dual_clipped = (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype)
    kl = k3_kl(logprobs, ref_logprobs) if ref_logprobs is not None else torch.zeros_like(pg)
    n_tokens = mask.sum()
    safe_tokens = n_tokens.clamp(min=1.0)
    pg_term = aggregate(pg, mask, agg, max_len)
    kl_term = aggregate(kl, mask, agg, max_len)
    loss = pg_term + kl_coef * kl_term
    with torch.no_grad():
        took_clipped = (clipped > unclipped).to(mask.dtype)
        stats = {
            "pg_loss": pg_term.item(),
            "kl": kl_term.item(),
            "clip_fraction": ((took_clipped * mask).sum() / safe_tokens).item(),
            "dual_clip_fraction": ((dual_clipped.to(mask.dtype) * mask).sum() / safe_tokens).item(),
            "ratio_mean": ((ratio * mask).sum() / safe_tokens).item() if n_tokens > 0 else 1.0,
            "tokens": n_tokens.item(),
        }
    return loss, stats


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 4,
                    temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] in float32 via logsumexp, `chunk_rows` rows at a time.

    Avoids holding a full-vocabulary float32 log_softmax for the whole batch. The temperature is
    the sampling one, so these are the log-probs of the distribution the tokens were drawn from.

    >>> logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])
    >>> [round(x, 4) for x in gather_logprobs(logits, torch.tensor([[1, 0]]))[0].tolist()]
    [-0.6931, -0.1269]
    >>> [round(x, 4) for x in gather_logprobs(logits, torch.tensor([[1, 0]]), temperature=2.0)[0].tolist()]
    [-0.6931, -0.3133]
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (greedy decoding has no log-probs to train on), got {temperature}")
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        rows = logits[start:start + chunk_rows].float()
        if temperature != 1.0:
            rows = rows / temperature
        picked = rows.gather(-1, targets[start:start + chunk_rows].unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(rows, dim=-1))
    return torch.cat(out, dim=0)


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """Leading columns in which every row holds the same real (unpadded) token, at most `limit`.

    >>> ids = torch.tensor([[5, 6, 7, 1], [5, 6, 8, 0]])
    >>> shared_prefix_length(ids, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), 3)
    2
    >>> shared_prefix_length(ids, torch.ones(2, 4, dtype=torch.long), 1)
    1
    """
    same = (input_ids == input_ids[:1]).all(dim=0) & (attention_mask == 1).all(dim=0)
    return int(same[:max(0, limit)].long().cumprod(dim=0).sum())


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """Log-probs of `targets` from the hidden states that predict them, through the output layer."""
    return gather_logprobs(head(hidden), targets, chunk_rows=hidden.shape[0], temperature=temperature)


def chunked_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                     chunk_tokens: int) -> torch.Tensor:
    """`gather_logprobs(head(hidden), targets)` without the whole [B, T, V] logits tensor: the output
    layer and the log-softmax run `chunk_tokens` positions at a time under activation checkpointing,
    so the forward keeps only the hidden states and the backward recomputes one chunk's logits at a
    time. At most B x chunk_tokens x V logits exist at once, where the plain path holds B x T x V
    (at a 150k vocabulary and 4k-token responses, GiBs a trajectory). Same numbers: each position's
    logits are the same matmul row either way (tests/core/test_grpo.py checks log-probs and
    gradients against the plain path)."""
    from torch.utils.checkpoint import checkpoint

    parts = [checkpoint(_chunk_logprobs, head, hidden[:, i:i + chunk_tokens], targets[:, i:i + chunk_tokens],
                        temperature, use_reentrant=False)
             for i in range(0, hidden.shape[1], chunk_tokens)]
    return torch.cat(parts, dim=1)


def _check_plain_output_layer(model: torch.nn.Module) -> None:
    """The paths that apply the output layer themselves need logits that come from it alone."""
    config = getattr(model, "config", None)
    if any(getattr(config, key, None) not in (None, 1.0)
           for key in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        raise ValueError("train.logits_chunk_tokens: this model scales or soft-caps its logits after the "
                         "output layer, which the chunked path does not; set it to 0")


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_start: int, temperature: float = 1.0, share_prefix: bool = False,
                   chunk_tokens: int = 0) -> torch.Tensor:
    """Log-probs [B, L - response_start] of `input_ids[:, response_start:]` under `model` at
    sampling `temperature`.

    Only the logits that predict those tokens are computed (`logits_to_keep`), so a long shared
    prompt costs no vocabulary projection. `response_start` must be >= 1 (the first token has no
    prediction); sequences are right-padded, so one start works for the whole batch.

    `share_prefix`: the leading tokens all rows share (a GRPO group's prompt, most of a
    trajectory's tokens) run once and their keys and values are repeated over the rows, so a
    micro-batch of one question's samples costs about one prompt plus its responses. Under a causal
    mask those positions' states are the same in every row, so the log-probs, and the gradients
    (the rows' contributions sum into the one prefix), are the full batch's up to float rounding
    (tests/core/test_grpo.py). It runs two forward passes, so callers whose forward passes must
    match across ranks (FSDP) or that cannot keep a cache (gradient checkpointing) leave it off.

    `chunk_tokens` > 0: the decoder runs alone and `chunked_logprobs` applies the output layer, so
    the response's full logits tensor never exists (FSDP, whose root unit gathers the output layer
    in the model's own forward, leaves it at 0).
    """
    if response_start < 1:
        raise ValueError("response_start must be >= 1: the first token has no predicting logits")
    n_keep = input_ids.shape[1] - response_start + 1
    # at most response_start - 1 shared columns: the logit predicting the first response token stays in the rest
    shared = shared_prefix_length(input_ids, attention_mask, response_start - 1) if share_prefix else 0
    if chunk_tokens > 0:
        _check_plain_output_layer(model)
    targets = input_ids[:, response_start:]
    # the decoder alone returns hidden states; the whole model, the logits of the kept positions
    forward = model.get_decoder() if chunk_tokens > 0 else model
    keep = {} if chunk_tokens > 0 else {"logits_to_keep": n_keep}
    if shared == 0 or input_ids.shape[0] == 1:
        out = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **keep)
    else:
        cache = model(input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared],
                      use_cache=True).past_key_values
        cache.batch_repeat_interleave(input_ids.shape[0])
        out = forward(input_ids=input_ids[:, shared:], attention_mask=attention_mask, past_key_values=cache,
                      use_cache=True, **keep)
    if chunk_tokens > 0:
        hidden = out.last_hidden_state[:, -n_keep:-1]
        return chunked_logprobs(model.get_output_embeddings(), hidden, targets, temperature, chunk_tokens)
    return gather_logprobs(out.logits[:, :-1], targets, temperature=temperature)


def packed_token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          position_ids: torch.Tensor, response: torch.Tensor, temperature: float = 1.0,
                          chunk_tokens: int = 0) -> torch.Tensor:
    """Log-probs [1, L - 1] of `input_ids[:, 1:]` for a packed row (several trajectories one after
    another, `attention_mask` [1, 1, L, L] keeping each to itself, `position_ids` restarting for
    each), computed at the `response` columns only and 0 elsewhere.

    The decoder runs on the whole row; only the hidden states that predict a response token go
    through the output layer (in `chunk_tokens` pieces when set), so the prompts cost no
    vocabulary projection, as `logits_to_keep` spares them in `token_logprobs`.
    """
    if chunk_tokens > 0:
        _check_plain_output_layer(model)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 use_cache=False).last_hidden_state[:, :-1]
    picked = hidden[response][None]  # [1, n, h]: the positions that predict a response token
    targets = input_ids[:, 1:][response][None]
    head = model.get_output_embeddings()
    if chunk_tokens > 0:
        values = chunked_logprobs(head, picked, targets, temperature, chunk_tokens)
    else:
        values = _chunk_logprobs(head, picked, targets, temperature)
    out = torch.zeros(response.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(response, values[0])
