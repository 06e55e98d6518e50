"""How one rollout batch becomes optimiser steps: the mini-batch plan, its split over learner
ranks, and the padded micro-batches a forward pass takes.

A GRPO update walks the batch's questions in order, `train.mini_batch_questions` questions per
optimiser step (`plan_mini_batches`; with `train.drop_uniform_groups` the groups of equal
rewards are left out first). A learner group of N ranks trains the same plan: every mini-batch
is split by WHOLE questions over the ranks (`split_plan`), so a GRPO group never spans two
ranks and its advantages (a function of its own rewards only) are those one learner computes.
Each rank then cuts its share of a mini-batch into micro-batches of `train.micro_batch_size`
trajectories (`collate`: right-padded prompt + response ids), or with `train.pack_tokens` into
packed sequences (`pack`: whole trajectories one after another up to that many tokens, each
attending only to itself, its positions counted from 0), so no compute goes to padding.

Kept apart from the learner because both sides use it: `GRPOLearner` (one rank or each rank of
a group) and `LearnerGroup` (the driver, which plans and splits but holds no model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from prompt_r1.config.base import ConfigError
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import informative as turn_informative


@dataclass
class MicroBatch:
    """Prompt+response ids of a few trajectories; response tensors are [b, L - start], and
    trajectory `indices[k]`'s response lies in row `rows[k]` from column `offsets[k]` of them.

    Padded (`collate`): one right-padded row per trajectory. Packed (`pack`): one row of whole
    trajectories, `attention_mask` a [1, 1, L, L] block-diagonal causal mask, `position_ids`
    restarting at 0 for each, `start` 1. An empty micro-batch (`indices == []`, see
    `empty_micro_batch`) holds one dummy row: ranks whose forward passes are collectives (FSDP)
    run it so that every rank runs as many passes."""

    indices: list[int]              # positions in the step's trajectory list
    input_ids: torch.Tensor         # [b, L]
    attention_mask: torch.Tensor    # [b, L], or [1, 1, L, L] packed
    start: int                      # first response column (min prompt length; 1 packed)
    loss_mask: torch.Tensor         # [b, L - start], 1 = agent-sampled response token
    sampling_logprobs: torch.Tensor  # [b, L - start]
    rows: list[int] = field(default_factory=list)     # each trajectory's row
    offsets: list[int] = field(default_factory=list)  # each trajectory's first response column, from `start`
    position_ids: torch.Tensor | None = None          # [1, L] packed, else None (the model counts from 0)
    response: torch.Tensor | None = None              # [1, L - start] bool packed: columns that hold a response token

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def scatter(self, per_traj: Mapping[int, torch.Tensor] | Sequence[torch.Tensor]) -> torch.Tensor:
        """Place per-trajectory response vectors (indexed by trajectory) into this batch's layout."""
        out = torch.zeros(self.loss_mask.shape, dtype=torch.float32)
        for i, row, offset in zip(self.indices, self.rows, self.offsets):
            out[row, offset:offset + per_traj[i].numel()] = per_traj[i]
        return out

    def split(self, values: torch.Tensor, resp_lens: list[int]) -> list[torch.Tensor]:
        """Inverse of `scatter`: one response vector per trajectory, in `indices` order."""
        return [values[row, offset:offset + resp_lens[i]].detach().float().cpu()
                for i, row, offset in zip(self.indices, self.rows, self.offsets)]


def collate(trajectories: list[Trajectory], indices: list[int], pad_id: int,
            device: torch.device | str) -> MicroBatch:
    """Right-pad `prompt_ids + token_ids` of the chosen trajectories."""
    chosen = [trajectories[i] for i in indices]
    length = max(len(t.prompt_ids) + len(t.token_ids) for t in chosen)
    start = min(len(t.prompt_ids) for t in chosen)
    ids = torch.full((len(chosen), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(chosen), length), dtype=torch.long)
    mask = torch.zeros((len(chosen), length - start), dtype=torch.float32)
    sampled = torch.zeros((len(chosen), length - start), dtype=torch.float32)
    for row, t in enumerate(chosen):
        n_prompt, n_resp = len(t.prompt_ids), len(t.token_ids)
        ids[row, :n_prompt + n_resp] = torch.tensor(t.prompt_ids + t.token_ids, dtype=torch.long)
        attn[row, :n_prompt + n_resp] = 1
        offset = n_prompt - start
        mask[row, offset:offset + n_resp] = torch.tensor(t.loss_mask, dtype=torch.float32)
        if t.logprobs:
            sampled[row, offset:offset + n_resp] = torch.tensor(t.logprobs, dtype=torch.float32)
    return MicroBatch(indices, ids.to(device), attn.to(device), start, mask.to(device), sampled.to(device),
                      rows=list(range(len(chosen))), offsets=[len(t.prompt_ids) - start for t in chosen])


def pack(trajectories: list[Trajectory], indices: list[int], device: torch.device | str) -> MicroBatch:
    """The chosen trajectories' prompt + response ids one after another in one row, each attending
    only to its own earlier tokens and counting its positions from 0: under that mask and those
    positions every trajectory's states, log-probs and gradients are the ones it has alone
    (tests/learner/test_batches.py checks against padded micro-batches)."""
    chosen = [trajectories[i] for i in indices]
    seqs = [t.prompt_ids + t.token_ids for t in chosen]
    length = sum(map(len, seqs))
    segment = torch.cat([torch.full((len(seq),), k, dtype=torch.long) for k, seq in enumerate(seqs)])
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    attention = ((segment[:, None] == segment[None, :]) & causal)[None, None]
    positions = torch.cat([torch.arange(len(seq)) for seq in seqs])[None]
    mask = torch.zeros((1, length - 1), dtype=torch.float32)
    sampled = torch.zeros_like(mask)
    response = torch.zeros((1, length - 1), dtype=torch.bool)
    offsets, at = [], 0
    for t, seq in zip(chosen, seqs):
        offset = at + len(t.prompt_ids) - 1  # response columns count from `start` = 1
        n_resp = len(t.token_ids)
        mask[0, offset:offset + n_resp] = torch.tensor(t.loss_mask, dtype=torch.float32)
        if t.logprobs:
            sampled[0, offset:offset + n_resp] = torch.tensor(t.logprobs, dtype=torch.float32)
        response[0, offset:offset + n_resp] = True
        offsets.append(offset)
        at += len(seq)
    ids = torch.tensor([tok for seq in seqs for tok in seq], dtype=torch.long)[None]
    return MicroBatch(indices, ids.to(device), attention.to(device), 1, mask.to(device), sampled.to(device),
                      rows=[0] * len(chosen), offsets=offsets, position_ids=positions.to(device),
                      response=response.to(device))


PACKABLE_ATTENTION = ("sdpa",)  # reads `pack`'s boolean mask as "may attend"
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")  # applied after the output layer


def check_packable(model: torch.nn.Module) -> None:
    """A `ConfigError` naming `train.pack_tokens` when packed rows would give other log-probs and
    gradients than padded ones: an attention that adds the mask to its scores (eager: True and
    False become +1 and +0, so a row attends across trajectories and to future tokens; flash ignores
    a 4D mask), or logits that the model soft-caps or scales after its output layer, which the
    packed path applies itself (`core.grpo.packed_token_logprobs`). Checked once, where the learner
    builds the model, before any update."""
    config = getattr(model, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKABLE_ATTENTION:
        raise ConfigError(f"train.pack_tokens: the agent model runs `{attention}` attention, where packed rows would "
                          f"attend across trajectories (packing needs {' or '.join(PACKABLE_ATTENTION)}); set "
                          "train.pack_tokens to 0 (padded micro-batches), or load the model with sdpa attention")
    transforms = {key: getattr(config, key) for key in LOGIT_TRANSFORMS if getattr(config, key, None) not in (None, 1.0)}
    if transforms:
        shown = ", ".join(f"{key}={value}" for key, value in transforms.items())
        raise ConfigError(f"train.pack_tokens: the agent model transforms its logits after the output layer ({shown}), "
                          "which the packed path does not apply; set train.pack_tokens to 0 (padded micro-batches)")


def check_pack_budget(budget: int, max_response_tokens: int, prompt_lengths: Mapping[str, int]) -> None:
    """A `ConfigError` naming `train.pack_tokens` when a trajectory of this pool could outgrow one
    packed row: the longest agent prompt (`prompt_lengths`: question id -> prompt tokens, with the
    environment's description line when the agent sees one) plus `agent.max_response_tokens`, which
    caps every response. Checked before any model or actor starts, so the mistake never waits for the
    first update; 0 (padded micro-batches) checks nothing.

    >>> check_pack_budget(100, 60, {"q1": 40, "q2": 12})
    >>> check_pack_budget(100, 60, {"q1": 41})
    Traceback (most recent call last):
    ...
    prompt_r1.config.base.ConfigError: train.pack_tokens 100 cannot hold question q1's trajectory: its prompt is 41 tokens and agent.max_response_tokens 60 comes on top; raise train.pack_tokens to at least 101, or set it to 0 (padded micro-batches)
    """
    if not budget or not prompt_lengths:
        return
    longest = max(prompt_lengths, key=lambda q: (prompt_lengths[q], q))
    need = prompt_lengths[longest] + max_response_tokens
    if need > budget:
        raise ConfigError(f"train.pack_tokens {budget} cannot hold question {longest}'s trajectory: its prompt is "
                          f"{prompt_lengths[longest]} tokens and agent.max_response_tokens {max_response_tokens} comes "
                          f"on top; raise train.pack_tokens to at least {need}, or set it to 0 (padded micro-batches)")


def pack_groups(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """`indices` cut in order into runs whose `lengths` (prompt + response tokens) add up to at most
    `budget`; a trajectory longer than the budget alone is an error naming both numbers.

    >>> pack_groups([0, 1, 2, 3], [5, 4, 6, 2], 10)
    [[0, 1], [2, 3]]
    """
    groups: list[list[int]] = []
    used = budget + 1
    for i, n in zip(indices, lengths):
        if n > budget:
            # a setting too small for this data, not a bug: one line and exit 2 (a ConfigError), then --resume
            raise ConfigError(f"a trajectory of {n} tokens (prompt and response) is longer than train.pack_tokens "
                              f"{budget}: raise train.pack_tokens to at least {n}, or set it to 0 (padded "
                              "micro-batches), and continue from the last checkpoint with `train --resume --force`")
        if used + n > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def empty_micro_batch(pad_id: int, device: torch.device | str) -> MicroBatch:
    """A micro-batch of no trajectory: one two-token dummy row with loss mask 0.

    >>> batch = empty_micro_batch(0, "cpu")
    >>> batch.indices, tuple(batch.input_ids.shape), batch.loss_mask.sum().item()
    ([], (1, 2), 0.0)
    """
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    zeros = torch.zeros((1, 1), dtype=torch.float32, device=device)
    return MicroBatch([], ids, torch.ones_like(ids), 1, zeros, zeros.clone(), rows=[], offsets=[])


def question_order(trajectories: Sequence[Trajectory]) -> list[str]:
    """Question ids in order of first appearance (the order GRPO groups are trained in).

    >>> question_order([Trajectory("b", 0, []), Trajectory("a", 0, []), Trajectory("b", 1, [])])
    ['b', 'a']
    """
    return list(dict.fromkeys(t.question_id for t in trajectories))


def informative_question_ids(trajectories: Sequence[Trajectory], with_turns: bool = False) -> set[str]:
    """Questions whose group carries a learning signal (>= 2 members, rewards not all equal; under
    turn credit, `with_turns`, also a group whose outcomes are equal but some turn's rewards differ)."""
    if not trajectories:
        return set()
    keep = turn_informative([t.reward.total if t.reward else 0.0 for t in trajectories],
                            [t.turn_rewards if with_turns else [] for t in trajectories],
                            [t.question_id for t in trajectories])
    return {t.question_id for t, k in zip(trajectories, keep) if k}


def plan_mini_batches(trajectories: Sequence[Trajectory], mini_batch_questions: int,
                      drop_uniform_groups: bool, with_turns: bool = False) -> list[list[str]]:
    """The questions of each optimiser step, in order: `mini_batch_questions` at a time, the
    uniform groups left out first when `drop_uniform_groups` (then possibly no step at all;
    `with_turns`: uniform in the outcome and in every turn reward)."""
    questions = question_order(trajectories)
    if drop_uniform_groups:
        informative = informative_question_ids(trajectories, with_turns)
        questions = [q for q in questions if q in informative]
    return [questions[i:i + mini_batch_questions] for i in range(0, len(questions), mini_batch_questions)]


def split_plan(plan: list[list[str]], world_size: int) -> list[list[list[str]]]:
    """Each rank's share of every mini-batch: whole questions, contiguous, sizes differing by at
    most one; a rank may get none of a mini-batch (it still takes part in its optimiser step).

    >>> split_plan([["a", "b", "c"], ["d"]], 2)
    [[['a', 'b'], ['d']], [['c'], []]]
    """
    from prompt_r1.cluster.actor_group import split_evenly  # the one contiguous split (rollout chunks too)

    shares: list[list[list[str]]] = [[] for _ in range(world_size)]
    for mini in plan:
        for rank, part in enumerate(split_evenly(mini, world_size)):
            shares[rank].append(part)
    return shares
