"""The format warm start builds the protocol agents (`tiny-protocol`, `smollm2-135m-protocol`) on
whatever tokenizer the base model brings, including one without a pad token: transformers 5.17's
GGUF conversion of SmolLM2 has none, which stopped the warm start on the GPU machine. Its whole
trajectories (the quick demo's agent) teach exactly the turns its pairs do."""

import json
import random
import shutil

import pytest
import torch
from transformers import AutoTokenizer

from prompt_r1.core.tokens import stop_token_ids
from prompt_r1.models.warm_start import build_protocol_model


def _without_pad_token(src, dst):
    shutil.copytree(src, dst)
    config_path = dst / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("pad_token", None)
    config_path.write_text(json.dumps(config))
    special = dst / "special_tokens_map.json"
    if special.exists():
        tokens = json.loads(special.read_text())
        tokens.pop("pad_token", None)
        special.write_text(json.dumps(tokens))
    return dst


def test_warm_start_pads_with_the_stop_token_when_the_tokenizer_has_no_pad_token(tiny_model_path, tmp_path):
    base = _without_pad_token(tiny_model_path, tmp_path / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert tokenizer.pad_token_id is None and stop_token_ids(tokenizer)
    out = build_protocol_model(base, tmp_path / "protocol", steps=2)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def _labelled_runs(labels):
    """(start, end) of each run of labelled positions."""
    runs, start = [], None
    for i, label in enumerate(labels + [-100]):
        if label != -100 and start is None:
            start = i
        elif label == -100 and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("copy_question,follow_up", [(False, False), (True, False), (True, True)])
def test_whole_trajectories_hold_exactly_the_turn_pairs(tiny_model_path, copy_question, follow_up):
    """Each whole trajectory, cut at its labelled runs, gives back that trajectory's (context, target)
    pairs in order: the two ways of teaching see the same turns in the same contexts."""
    from prompt_r1.models.warm_start import _examples, _sequences

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    pairs = _examples(tokenizer, random.Random(3), copy_question, follow_up)
    whole = _sequences(tokenizer, random.Random(3), copy_question, follow_up, whole_trajectories=True)
    cut = [(ids[:start], ids[start:end]) for ids, labels in whole for start, end in _labelled_runs(labels)]
    assert cut == pairs
    assert all(labels[i] == ids[i] for ids, labels in whole for i in range(len(ids)) if labels[i] != -100)
    per_turn = _sequences(tokenizer, random.Random(3), copy_question, follow_up, whole_trajectories=False)
    assert [(ids[:len(c)], ids[len(c):]) for (ids, _), (c, _) in zip(per_turn, pairs)] == pairs
    assert len(whole) < len(pairs) and sum(len(ids) for ids, _ in whole) < sum(len(ids) for ids, _ in per_turn)


def test_a_turn_has_the_same_loss_in_its_whole_trajectory_as_in_its_pair(tiny_model_path):
    """What makes whole trajectories the same lesson: a causal model's logits at a turn's positions
    see only what came before, so the turn's cross-entropy is its pair's (to float rounding)."""
    from transformers import AutoModelForCausalLM

    from prompt_r1.models.warm_start import _examples, _sequences

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    pairs = iter(_examples(tokenizer, random.Random(0), True, True))
    for ids, labels in _sequences(tokenizer, random.Random(0), True, True, whole_trajectories=True)[:3]:
        with torch.no_grad():
            whole = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
        for start, end in _labelled_runs(labels):
            context, target = next(pairs)
            with torch.no_grad():
                alone = torch.log_softmax(model(torch.tensor([context + target])).logits[0], -1)
            positions = torch.arange(start - 1, end - 1)  # position t predicts token t+1
            tokens = torch.tensor(ids[start:end])
            assert torch.allclose(whole[positions, tokens], alone[positions, tokens], atol=1e-5)
