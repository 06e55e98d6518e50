#!/usr/bin/env bash
# GPU check: the one command to run on an offline GPU host once its parts are staged (docs/scale.md, "Measuring on a
# GPU"). It installs the staged parts (scripts/gpu_stage.py unstage: every part present, every
# import loading, before any timing), then runs benchmarks/gpu/gpu_check.py: the bf16 peak, then parts
# a-e (learner at real shapes with MFU and plan's prediction, FSDP2 over NCCL, the smoke training
# through Ray with --resume, SmolLM2 GRPO steps, full vs LoRA sync at 1.7B), each in its own
# process under its own deadline. Results: $GPU_CHECK_OUT/gpu_check.json and gpu_check.log. Without
# CUDA it exits 2 (CI has no GPU).
#
#   bash scripts/gpu_check.sh              # on the GPU host (results in GPU_CHECK_OUT, default runs/gpu_check)
#   bash scripts/gpu_check.sh --dry-run    # here: CPU, tiny shapes, a venv that sees only the GPU
#                                          # machine's packages; checks the code, measures nothing
#
# Settings (environment): PYTHON (default python3), GPU_CHECK_OUT (default runs/gpu_check),
# GPU_STAGE (the parts, default runs/gpu_stage), GPU_STAGE_TARGET (default /tmp/prompt_r1_site),
# GPU_CHECK_ARGS (more arguments for benchmarks/gpu/gpu_check.py, e.g. "--parts ab --budget-s 200").
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${GPU_CHECK_OUT:-runs/gpu_check}
STAGE=${GPU_STAGE:-runs/gpu_stage}
TARGET=${GPU_STAGE_TARGET:-/tmp/prompt_r1_site}
DRY=
[ "${1:-}" = "--dry-run" ] && DRY=1

if [ -z "$DRY" ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check.sh needs a CUDA GPU and $PY's torch sees none; nothing was measured (--dry-run checks the code on CPU)" >&2
    exit 2
fi

if [ -n "$DRY" ]; then
    # the dry run's interpreter: this venv's Python, seeing only the GPU machine's packages and the staged ones
    SIM=${GPU_CHECK_SIM:-runs/gpu_check_sim}
    RUN_PY=$("$PY" scripts/gpu_stage.py simulate "$SIM") || exit 1
    "$PY" scripts/gpu_stage.py unstage --stage "$STAGE" --target "$TARGET" --dry-run --python "$RUN_PY" || exit $?
    export PYTHONPATH="$PWD"
else
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" scripts/gpu_stage.py unstage --stage "$STAGE" --target "$TARGET" || exit $?
    RUN_PY=$PY
    export PYTHONPATH="$TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # models built there (SmolLM2 dequantised from the staged GGUF, the tiny smoke models) go to scratch
    export PROMPT_R1_MODELS=${PROMPT_R1_MODELS:-/tmp/prompt_r1_models}
fi
TOKENIZER="$TARGET-data/smollm2-tokenizer"
# shellcheck disable=SC2086
exec "$RUN_PY" -m benchmarks.gpu.gpu_check --out "$OUT_DIR" --tokenizer "$TOKENIZER" ${DRY:+--dry-run} ${GPU_CHECK_ARGS:-}
