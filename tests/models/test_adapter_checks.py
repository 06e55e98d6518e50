"""Adapter folders and `export --adapter-only` say what is wrong (issue 62 items 10 and 5): an unreadable
`adapter_config.json`, missing adapter weights, a checkpoint folder that does not exist, and a base
other than the one the adapter was trained on. Checked on copies of a small adapter export, without
merging."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prompt_r1.models.adapter import adapter_base, export_adapter
from prompt_r1.models.agent_files import ADAPTER_CONFIG, TRAINING_CONFIG, AgentSpecError
from prompt_r1.models.bundled import resolve_model


@pytest.fixture
def adapter(tmp_path, _model_cache) -> Path:
    """An adapter folder as `export --adapter-only` writes it: config naming bundled `tiny`, weights, the
    training config (`agent.model: tiny`)."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / ADAPTER_CONFIG).write_text(json.dumps({"base_model_name_or_path": "tiny", "r": 4,
                                                     "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / TRAINING_CONFIG).write_text("agent:\n  model: tiny\n")
    return folder


def test_an_intact_adapter_names_its_base(adapter) -> None:
    assert adapter_base(adapter, "a") == "tiny"


@pytest.mark.parametrize("text", ["", "{", "not json", "[1, 2]", "\x00\x01", "null"])
def test_an_unreadable_adapter_config_is_named_as_such(adapter, text) -> None:
    (adapter / ADAPTER_CONFIG).write_text(text)
    with pytest.raises(AgentSpecError, match=r"adapter_config.json (cannot be read|is not a JSON object)"):
        adapter_base(adapter, "a")


@pytest.mark.parametrize("weights", ["adapter_model.safetensors"])
def test_missing_adapter_weights_are_named(adapter, weights) -> None:
    (adapter / weights).unlink()
    with pytest.raises(AgentSpecError, match=r"has no adapter weights \(adapter_model.safetensors"):
        adapter_base(adapter, "a")
    (adapter / "adapter_model.bin").write_bytes(b"w")  # PEFT's older name is weights too
    assert adapter_base(adapter, "a") == "tiny"


@pytest.mark.parametrize("base", ["tiny-protocol", "smollm2-135m-instruct", "gemma3-270m"])
def test_an_adapter_pointed_at_another_bundled_base_is_refused(adapter, base) -> None:
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    (adapter / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": base}))
    with pytest.raises(AgentSpecError, match=r"but it was trained on 'tiny' .*Set base_model_name_or_path to 'tiny'"):
        adapter_base(adapter, "a")
    # the same base by its folder is the same model
    (adapter / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(resolve_model("tiny"))}))
    assert adapter_base(adapter, "a") == str(resolve_model("tiny"))


@pytest.mark.parametrize("name", ["step-00002", "missing/step-000001"])
def test_export_of_a_checkpoint_folder_that_does_not_exist_says_so(tmp_path, name) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        export_adapter(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out").exists()
