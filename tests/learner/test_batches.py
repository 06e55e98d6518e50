"""Micro-batches (`prompt_r1/learner/batches.py`): the padded and the packed layouts hold each
trajectory's response where `scatter` and `split` say, packs respect their budget and order, and a
packed row gives every trajectory the log-probs and gradients it has in a padded batch."""

import random

import pytest
import torch

from prompt_r1.config.base import ConfigError
from prompt_r1.core import grpo
from prompt_r1.core.trajectory import Trajectory
from grpo_helpers import tiny_llama
from prompt_r1.learner.batches import check_pack_budget, collate, pack, pack_groups


def _random_trajectories(seed: int, n: int) -> list[Trajectory]:
    """`n` trajectories with prompts of different lengths (some shared), responses with inserted
    (mask 0) spans and sampling log-probs."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 97) for _ in range(rng.randint(2, 9))] for _ in range(2)]
    out = []
    for g in range(n):
        response = [rng.randrange(1, 97) for _ in range(rng.randint(1, 10))]
        mask = [1 if rng.random() < 0.7 else 0 for _ in response]
        out.append(Trajectory(question_id=f"q{g % 2}", group_index=g, prompt_ids=prompts[g % 2] if g % 3 else
                              [rng.randrange(1, 97) for _ in range(rng.randint(2, 9))], token_ids=response,
                              loss_mask=mask, logprobs=[-rng.random() if m else 0.0 for m in mask]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_pack_groups_keep_order_and_budget_and_fill_greedily(seed) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 15))]
    budget = rng.randint(max(lengths), 70)
    indices = list(range(100, 100 + len(lengths)))
    groups = pack_groups(indices, lengths, budget)
    assert [i for g in groups for i in g] == indices
    size = dict(zip(indices, lengths))
    assert all(sum(size[i] for i in g) <= budget for g in groups)
    # greedy: each group's next trajectory would not have fitted into it
    assert all(sum(size[i] for i in a) + size[b[0]] > budget for a, b in zip(groups, groups[1:]))


@pytest.mark.parametrize("seed", range(200))
def test_the_pack_budget_check_refuses_exactly_the_pools_whose_longest_prompt_and_response_overflow(seed) -> None:
    """Restated: every trajectory (prompt + at most the response budget) fits a row iff the budget
    is at least the longest prompt plus that budget; when refused, the message names the question
    and the least budget that fits, and that budget is accepted."""
    rng = random.Random(seed)
    lengths = {f"q{i}": rng.randint(1, 300) for i in range(rng.randint(1, 30))}
    response, budget = rng.randint(1, 300), rng.randint(1, 700)
    fits = all(n + response <= budget for n in lengths.values())
    if fits:
        check_pack_budget(budget, response, lengths)
        return
    with pytest.raises(ConfigError) as caught:
        check_pack_budget(budget, response, lengths)
    need = max(lengths.values()) + response
    assert f"train.pack_tokens {budget} cannot hold question" in str(caught.value)
    assert f"at least {need}," in str(caught.value)
    named = str(caught.value).split("question ")[1].split("'s")[0]
    assert lengths[named] == max(lengths.values())
    check_pack_budget(need, response, lengths)
    check_pack_budget(0, response, lengths)  # padded micro-batches: nothing to hold


def test_a_trajectory_longer_than_the_pack_is_named_with_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"a trajectory of 12 tokens .* longer than train.pack_tokens 10"):
        pack_groups([0, 1], [5, 12], 10)


@pytest.mark.parametrize("seed", range(10))
def test_both_layouts_hold_each_response_where_split_finds_it(seed) -> None:
    trajectories = _random_trajectories(seed, 5)
    indices = [0, 2, 3, 4]
    resp_lens = [len(t.token_ids) for t in trajectories]
    for micro in (collate(trajectories, indices, 0, "cpu"), pack(trajectories, indices, "cpu")):
        values = {i: torch.rand(resp_lens[i]) for i in indices}
        assert all(torch.equal(a, values[i]) for i, a in zip(indices, micro.split(micro.scatter(values), resp_lens)))
        masks = micro.split(micro.loss_mask, resp_lens)
        assert [m.tolist() for m in masks] == [[float(x) for x in trajectories[i].loss_mask] for i in indices]
        sampled = micro.split(micro.sampling_logprobs, resp_lens)
        assert all(torch.allclose(s, torch.tensor(trajectories[i].logprobs)) for i, s in zip(indices, sampled))
    packed = pack(trajectories, indices, "cpu")
    assert packed.input_ids.shape == (1, sum(len(trajectories[i].prompt_ids) + resp_lens[i] for i in indices))
    assert int(packed.response.sum()) == sum(resp_lens[i] for i in indices)


def _per_trajectory(model, micro, resp_lens, temperature, chunk=0):
    if micro.packed:
        lp = grpo.packed_token_logprobs(model, micro.input_ids, micro.attention_mask, micro.position_ids,
                                        micro.response, temperature, chunk_tokens=chunk)
    else:
        lp = grpo.token_logprobs(model, micro.input_ids, micro.attention_mask, micro.start, temperature)
    (lp * micro.loss_mask).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()]).clone()
    model.zero_grad()
    return micro.split(lp, resp_lens), grad


@pytest.mark.parametrize("seed", range(8))
def test_a_packed_row_gives_each_trajectory_its_padded_log_probs_and_gradient(seed) -> None:
    """Random trajectories (different prompts, inserted spans) packed into one row against the same
    ones right-padded: every response token's log-prob and the summed gradient agree."""
    model = tiny_llama(seed)
    trajectories = _random_trajectories(seed, 6)
    indices, resp_lens = list(range(6)), [len(t.token_ids) for t in trajectories]
    temperature = 0.7 + 0.1 * seed
    padded_lp, padded_grad = _per_trajectory(model, collate(trajectories, indices, 0, "cpu"), resp_lens, temperature)
    packed_lp, packed_grad = _per_trajectory(model, pack(trajectories, indices, "cpu"), resp_lens, temperature,
                                             chunk=seed % 3)  # with and without the logits in chunks
    for a, b in zip(padded_lp, packed_lp):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert (padded_grad - packed_grad).norm() <= 1e-5 * padded_grad.norm() + 1e-7
