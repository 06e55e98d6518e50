"""Bad input that used to pass silently or crash (issue 34): each is now refused with one message
naming what is wrong, before any work starts, or reported as the failure it is.

Runs the CLI in process through typer's CliRunner, on the same app as the `prompt-r1` entry point.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["-c", "configs/smoke.yaml"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _refused(args: list[str], *words: str, code: int = 2) -> str:
    """Run a command that must stop with `error: ...` naming `words`; return its output."""
    result = CliRunner().invoke(app, args)
    text = " ".join(result.output.split())
    assert isinstance(result.exception, SystemExit), f"{result.exception!r} escaped: {text[-2000:]}"
    assert result.exit_code == code, text[-2000:]
    assert "Traceback" not in result.output and "error:" in text, text[-2000:]
    for word in words:
        assert word in text, (word, text[-2000:])
    return text


# -- config files -------------------------------------------------------------------------------------
def test_check_config_refuses_a_duplicated_key(home, tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text((ROOT / "configs" / "smoke.yaml").read_text() + "\ntrain:\n  steps: 9\n")
    first = next(i for i, line in enumerate(dup.read_text().splitlines(), 1) if line.startswith("train:"))
    _refused(["check-config", "-c", str(dup)], str(dup), "`train`", f"line {first} and line")


@pytest.mark.parametrize("item, key", [("train.lr=true", "train.lr"), ("train.steps=false", "train.steps")])
def test_check_config_refuses_a_bool_for_a_number(home, item, key):
    _refused(["check-config", *SMOKE, "--set", item], f"`{key}`", "boolean")
