"""Config loading: the shipped recipes validate; bad keys and values name the key and the file."""

from pathlib import Path

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.config.base import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
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


# -- names become folder names: only safe slugs --------------------------------------------
SLUG_CHARS = "abcXYZ019._-"
HOSTILE = ["/", "\\", "..", " ", "\x00", "é", ":", "*", "\n", "~", "$"]


def _slug_by_rule(name: str) -> bool:
    """The rule, stated again: 1-64 ASCII letters/digits/`._-`, the first a letter or digit."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    return 1 <= len(name) <= 64 and set(name) <= allowed and name[0] not in "._-"


def _names(n: int = 600) -> list[str]:
    import random

    rng = random.Random(11)
    names = ["../../x", "..", ".", "a/b", "/abs", "ok", "a..", "-x", "_x", ".hidden", "", "x" * 64, "x" * 65,
             "gpt-4o-mini", "smollm2-135m", "tiny-env"]
    for _ in range(n):
        parts = [rng.choice(SLUG_CHARS) if rng.random() < 0.9 else rng.choice(HOSTILE)
                 for _ in range(rng.choice([1, 2, 5, 20, 63, 64, 65, 70]))]
        names.append("".join(parts))
    return names


def test_config_and_environment_names_are_safe_slugs(tmp_path):
    from prompt_r1.config.experiment import parse_config

    accepted = 0
    for name in _names():
        for where, data in [("name", {"name": name}),
                            ("environment.name", {"environment": {"name": name}}),
                            ("eval.environments.0.name", {"eval": {"environments": [{"name": name}]}})]:
            try:
                parse_config(data, "x.yaml")
                ok = True
            except ConfigError as err:
                ok = False
                assert f"`{where}`" in str(err) and "x.yaml" in str(err), str(err)
            assert ok == _slug_by_rule(name), (where, name)
        if _slug_by_rule(name):
            accepted += 1
            # every accepted name stays one folder inside the run home
            assert (tmp_path / name).resolve().parent == tmp_path.resolve(), name
    assert 50 < accepted < len(_names())  # both outcomes were exercised


def test_traversing_name_in_a_file_names_the_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: ../../x\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "`name`" in str(err.value) and str(bad) in str(err.value) and "folder name" in str(err.value)


def test_run_dir_refuses_a_traversing_run_id(tmp_path, monkeypatch):
    from prompt_r1.config.experiment import run_dir

    monkeypatch.setenv("PROMPT_R1_HOME", str(tmp_path))
    assert run_dir("smoke", "20250101-000000-abcdef") == tmp_path.resolve() / "smoke" / "20250101-000000-abcdef"
    for bad in ["../x", "a/b", "..", ""]:
        with pytest.raises(ValueError, match="cannot name a run folder"):
            run_dir("smoke", bad)
