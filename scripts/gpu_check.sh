#!/usr/bin/env bash
# GPU check: the command to run on a GPU host (docs/scale.md, "Measuring on a GPU"). Where the host has
# no network, it first installs the staged offline parts (scripts/gpu_stage.py unstage: every part
# present, every import loading, before any timing); then it runs benchmarks/gpu/gpu_check.py, one of
# its three runs of about ten minutes each, every part in its own process under its own deadline:
#   learner          the bf16 peak, then parts a (the learner at Qwen3-1.7B first, packed and chunked,
#                    MFU against the measured peak and the card's spec, plan against the peak), b (FSDP2
#                    over NCCL: torch's and the learner's own), c (smoke training through Ray, --resume),
#                    e (full vs LoRA sync at 1.7B, and the pinned build of the full update)
#   two-hop          part d (SmolLM2 GRPO steps with rollouts on the GPU) and part f's trained arm (the
#                    two-hop experiment at GPU scale, the agent kept as a LoRA adapter)
#   two-hop-control  part f's shuffled-reward control, added to the same experiment, which is then judged
# Results: $GPU_CHECK_OUT/RUN.json and RUN.log (part f's experiment in $GPU_CHECK_OUT/two-hop). Without
# CUDA it exits 2 (CI has no GPU).
#
#   bash scripts/gpu_check.sh [learner]        # on the GPU host (results in GPU_CHECK_OUT, default runs/gpu_check)
#   bash scripts/gpu_check.sh two-hop          # then these two, each on its own
#   bash scripts/gpu_check.sh two-hop-control
#   bash scripts/gpu_check.sh --dry-run        # here: CPU, tiny shapes, every part, a venv that sees only the
#                                              # GPU machine's packages; checks the code, measures nothing
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
RUN=learner
case "${1:-}" in
    --dry-run) DRY=1 ;;
    learner|two-hop|two-hop-control) RUN=$1 ;;
    "") ;;
    *) echo "gpu_check.sh: unknown argument ${1}; give learner, two-hop, two-hop-control or --dry-run" >&2; exit 2 ;;
esac

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
elif [ -d "$STAGE" ]; then
    # an offline host: the bundle gpu_stage.py built, installed into TARGET
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" scripts/gpu_stage.py unstage --stage "$STAGE" --target "$TARGET" || exit $?
    RUN_PY=$PY
    export PYTHONPATH="$TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # models built there (SmolLM2 dequantised from the staged GGUF, the tiny smoke models) go to scratch
    export PROMPT_R1_MODELS=${PROMPT_R1_MODELS:-/tmp/prompt_r1_models}
else
    # a host with the project installed (pip install -e '.[gpu]'): its own packages and models home
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    RUN_PY=$PY
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
TOKENIZER="$TARGET-data/smollm2-tokenizer"
if [ ! -d "$TOKENIZER" ]; then  # no bundle: SmolLM2's tokenizer from the bundled weights
    TOKENIZER=$("$RUN_PY" -c 'from benchmarks.gpu.gpu_learner import default_tokenizer; print(default_tokenizer())') || exit 1
fi
# the dry run checks every part at once; GPU_CHECK_ARGS="--parts ..." replaces the run's choice of parts
if [ -n "$DRY" ] || [[ "${GPU_CHECK_ARGS:-}" == *--parts* ]]; then WHAT=(); else WHAT=(--run "$RUN"); fi
# shellcheck disable=SC2086
exec "$RUN_PY" -m benchmarks.gpu.gpu_check --out "$OUT_DIR" --tokenizer "$TOKENIZER" "${WHAT[@]}" ${DRY:+--dry-run} ${GPU_CHECK_ARGS:-}
