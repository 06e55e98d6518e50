"""The format warm start builds the protocol agents (`tiny-protocol`, `smollm2-135m-protocol`) on
whatever tokenizer the base model brings, including one without a pad token: transformers 5.17's
GGUF conversion of SmolLM2 has none, which stopped the warm start on the GPU machine."""

import json
import shutil

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


def test_target_loss_is_the_models_own_loss_and_gradient(tiny_model_path):
    """`target_loss` runs the output layer on the labelled positions only; restated here as the
    model's own `labels=` loss, over random batches (widths, padding, target spans)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from prompt_r1.models.warm_start import target_loss

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    vocab = model.config.vocab_size
    rng = random.Random(0)
    for _ in range(20):
        rows, width = rng.randint(1, 4), rng.randint(4, 40)
        ids = torch.randint(0, vocab, (rows, width))
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for i in range(rows):
            length = rng.randint(3, width)
            start = rng.randint(1, length - 1)
            attention[i, :length] = 1
            labels[i, start:length] = ids[i, start:length]
        ours = target_loss(model, ids, attention, labels)
        ours.backward()
        ours_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        reference.backward()
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
        for mine, p in zip(ours_grads, model.parameters()):
            torch.testing.assert_close(mine, p.grad, rtol=1e-4, atol=1e-6)
        model.zero_grad()
