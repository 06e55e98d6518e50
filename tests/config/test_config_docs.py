"""docs/config.md lists every config key as the typed models define it, and every key has help."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

from prompt_r1.config import docs as config_docs
from prompt_r1.config.docs import leaf_fields, render_config_docs
from prompt_r1.config.env import EnvConfig

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config.md"


def test_docs_config_md_is_up_to_date():
    assert PAGE.is_file(), "docs/config.md is missing: run `.venv/bin/python scripts/config_docs.py`"
    assert PAGE.read_text() == render_config_docs(), (
        "docs/config.md is out of date with the models in prompt_r1/config/: "
        "run `.venv/bin/python scripts/config_docs.py` and commit docs/config.md")


def test_every_key_has_help():
    keys = dict(leaf_fields())
    assert len(keys) > 80 and "train.lr" in keys and "environment.max_error_rate" in keys
    missing = [key for key, field in keys.items() if not (field.description or "").strip()]
    assert not missing, f"config keys without help (add Field(description=...)): {missing}"


def test_every_key_is_in_a_table_row():
    text = render_config_docs()
    rows = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    assert rows == {key for key, _ in leaf_fields()}
    # Lists of environments take the keys of `environment`, which the page says once.
    assert "`eval.environments[]` (e.g. `eval.environments[].model`)" in text
    assert "`eval.baselines.optimizer` (e.g. `eval.baselines.optimizer.model`)" in text
    assert all(f"`environment.{name}`" in text for name in EnvConfig.model_fields)


def test_sections_have_help_and_cells_do_not_break_the_table():
    text = render_config_docs()
    for heading in re.findall(r"^## `([^`]+)`$", text, flags=re.M):
        after = text.split(f"## `{heading}`\n\n", 1)[1]
        assert not after.startswith("|"), f"section {heading} has no help line"
    for line in text.splitlines():
        if line.startswith("| `"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 6, line
            cells = re.sub(r"`[^`]*`", "", line)
            assert not re.search(r"</?[a-z_]+>", cells), f"a raw tag would vanish as HTML: {line}"


def test_doctests():
    assert doctest.testmod(config_docs).failed == 0
