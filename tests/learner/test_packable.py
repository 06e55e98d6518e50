"""`train.pack_tokens` only where packed rows mean what padded ones do (issue 62 item 3): a model with
eager (or any non-sdpa) attention, or with logits soft-capped or scaled after the output layer, is
refused naming the setting, before any update; the bundled sdpa model still packs."""

from __future__ import annotations

import json
import shutil

import pytest
from grpo_helpers import make_config

from prompt_r1.config.base import ConfigError
from prompt_r1.learner.batches import LOGIT_TRANSFORMS, check_packable
from prompt_r1.learner.grpo_learner import GRPOLearner


def _variant(tiny_model_path, tmp_path, **changes) -> str:
    folder = tmp_path / "variant"
    shutil.copytree(tiny_model_path, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return str(folder)


@pytest.mark.parametrize("attention", ["eager", "flash_attention_2"])
def test_attention_that_cannot_read_the_packed_mask_is_refused(tiny_model_path, tmp_path, attention) -> None:
    path = _variant(tiny_model_path, tmp_path)
    learner = GRPOLearner(make_config(), path)  # padded micro-batches: any attention
    learner.model.config._attn_implementation = attention
    with pytest.raises(ConfigError, match=rf"train.pack_tokens: the agent model runs `{attention}` attention"):
        check_packable(learner.model)


def test_a_model_folder_that_asks_for_eager_is_refused_where_the_learner_starts(tiny_model_path, tmp_path) -> None:
    path = _variant(tiny_model_path, tmp_path, attn_implementation="eager")
    with pytest.raises(ConfigError, match="`eager` attention.*set train.pack_tokens to 0"):
        GRPOLearner(make_config(pack_tokens=400), path)


@pytest.mark.parametrize("key", LOGIT_TRANSFORMS)
@pytest.mark.parametrize("value", [3.0, 0.5, 30.0])
def test_logits_transformed_after_the_output_layer_are_refused(tiny_model_path, key, value) -> None:
    learner = GRPOLearner(make_config(), tiny_model_path)
    setattr(learner.model.config, key, value)
    with pytest.raises(ConfigError, match=rf"transforms its logits after the output layer \({key}={value}\)"):
        check_packable(learner.model)


@pytest.mark.parametrize("lora", [False, True])
def test_the_bundled_sdpa_model_packs(tiny_model_path, lora) -> None:
    learner = GRPOLearner(make_config(lora=lora, pack_tokens=400), tiny_model_path)
    check_packable(learner.model)


@pytest.mark.parametrize("seed", range(6))
def test_a_trajectory_longer_than_the_pack_budget_is_a_user_error(seed) -> None:
    """A pack budget that holds a response but not prompt plus response (issue 62 item 15): one line naming
    both numbers and the resume (a `UserError`, exit 2), never a traceback."""
    import random

    from prompt_r1.core.failures import UserError
    from prompt_r1.learner.batches import pack_groups

    rng = random.Random(seed)
    budget = rng.randint(5, 50)
    lengths = [rng.randint(1, budget) for _ in range(rng.randint(0, 6))]
    lengths.insert(rng.randint(0, len(lengths)), budget + rng.randint(1, 30))
    with pytest.raises(UserError, match=rf"longer than train.pack_tokens {budget}: .*--resume"):
        pack_groups(list(range(len(lengths))), lengths, budget)
