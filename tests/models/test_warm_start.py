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
