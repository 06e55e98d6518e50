#!/usr/bin/env bash
# GPU check: the learner at 1 rank on CUDA, the weight sync to the rollout policies (and to the vLLM
# engine where vLLM is installed), and a 3-step smoke training on CUDA where the training loop's
# services (Ray, DuckDB) are installed. Prints step time, tokens/s and peak memory, a table last.
# CI has no GPU: run this on a CUDA machine whenever one is at hand and record the figures in
# BENCHMARKS.md ("GPU"). Without CUDA it exits 2.
#
#   bash scripts/gpu_check.sh
#
# Settings (environment): PYTHON (default python3), GPU_CHECK_OUT (default runs/gpu_check),
# GPU_CHECK_SHAPES (default "smollm2-135m qwen3-0.6b qwen3-1.7b"), GPU_CHECK_STEPS (default 3),
# GPU_CHECK_TOKENIZER (a tokenizer folder for the random-weight shapes; default SmolLM2's from the
# bundled package), GPU_CHECK_ARGS (more arguments for benchmarks/gpu_learner.py).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${GPU_CHECK_OUT:-runs/gpu_check}
SHAPES=${GPU_CHECK_SHAPES:-"smollm2-135m qwen3-0.6b qwen3-1.7b"}
STEPS=${GPU_CHECK_STEPS:-3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check.sh needs a CUDA GPU and $PY's torch sees none; nothing was measured" >&2
    exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/learner-*.json "$OUT_DIR"/smoke.json
status=0

for shape in $SHAPES; do
    echo; echo "== learner: $shape =="
    # shellcheck disable=SC2086
    "$PY" benchmarks/gpu_learner.py --shape "$shape" --steps "$STEPS" --json "$OUT_DIR/learner-$shape.json" \
        ${GPU_CHECK_TOKENIZER:+--tokenizer "$GPU_CHECK_TOKENIZER"} ${GPU_CHECK_ARGS:-} || status=1
done

echo; echo "== smoke training (configs/smoke.yaml, 3 steps, train.device=cuda) =="
if missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("ray", "duckdb", "pydantic") if importlib.util.find_spec(m) is None))
EOF
) && [ -z "$missing" ]; then
    home=$(mktemp -d)
    start=$SECONDS
    if PROMPT_R1_HOME="$home" "$PY" -m prompt_r1.cli train -c configs/smoke.yaml \
            --set train.steps=3 --set train.device=cuda 2>&1 | tail -n 5; then
        echo "{\"status\": \"ran\", \"wall_s\": $((SECONDS - start))}" > "$OUT_DIR/smoke.json"
    else
        echo '{"status": "failed"}' > "$OUT_DIR/smoke.json"; status=1
    fi
    rm -rf "$home"
else
    echo "skipped: the training loop needs Ray and DuckDB, and this machine lacks: ${missing:-?}"
    echo "{\"status\": \"skipped (missing: ${missing:-?})\"}" > "$OUT_DIR/smoke.json"
fi

echo; echo "== summary =="
"$PY" - "$OUT_DIR" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(p.read_text()) for p in sorted(out.glob("learner-*.json"))]
if rows:
    print(rows[0]["device"])
print("| model | params | batch (tokens, agent) | compute | step s (median) | tokens/s | agent tok/s "
      "| peak GiB | weights changed | sync: export / CPU policy / CUDA policy s | vLLM sync |")
print("| --- " * 11 + "|")
for r in rows:
    s = r.get("sync", {})
    vllm = f"{s['vllm_load_s']:.3f} s" if "vllm_load_s" in s else "not measured"
    sync = (f"{s['export_s']:.3f} / {s['load_cpu_policy_s']:.3f} / {s['load_cuda_policy_s']:.3f}" if s else "-")
    name = r["model"] + (" (random init)" if r["random_init"] else "")
    print(f"| {name} | {r['params_m']:.0f}M | {r['trajectories']} traj ({r['tokens']:,}, {r['agent_tokens']:,}) "
          f"| {r['dtype']}{' + ckpt' if r['gradient_checkpointing'] else ''} | {r['step_s']:.3f} "
          f"| {r['tokens_per_s']:,.0f} | {r['agent_tokens_per_s']:,.0f} | {r['peak_gib']:.2f} "
          f"| {100 * r['changed_fraction']:.1f}% | {sync} | {vllm} |")
smoke = out / "smoke.json"
if smoke.exists():
    s = json.loads(smoke.read_text())
    print(f"smoke training, 3 steps on CUDA: {s['status']}" + (f", {s['wall_s']:.0f} s wall" if "wall_s" in s else ""))
EOF
exit $status
