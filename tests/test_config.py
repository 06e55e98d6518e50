"""Config loading: the shipped recipes validate; bad keys and values name the key and the file."""

from pathlib import Path

import pytest

from prompt_r1.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["smoke", "demo", "paper"])
def test_shipped_configs_validate(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.name == name
    assert len(cfg.hash()) == 12


def test_paper_settings():
    cfg = load_config(ROOT / "configs" / "paper.yaml")
    assert (cfg.rollout.group_size, cfg.rollout.batch_questions, cfg.train.lr, cfg.rollout.max_turns) == (5, 128, 1e-6, 5)
    assert cfg.environment.model == "gpt-4o-mini" and cfg.environment.api_key_env == "OPENAI_API_KEY"


def test_unknown_key_names_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "train.stepz" in str(err.value) and str(bad) in str(err.value)


def test_bad_value_names_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  group_size: 0\nenvironment:\n  kind: nope\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "rollout.group_size" in str(err.value) and "environment.kind" in str(err.value)


def test_overrides_and_missing_file(tmp_path):
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"train.steps": 7})
    assert cfg.train.steps == 7
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")
