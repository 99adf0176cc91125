#!/usr/bin/env bash
# One-GPU check of capo-trl, in one go, within 10 minutes on an H100/H200-class GPU:
#   1. bf16 training steps on a randomly initialised ~494M-parameter Qwen2 built from a config (no
#      download): GRPO, CAPO without / with the reference forward, both with LoRA, CAPO under
#      single-process ZeRO-3: step time, tokens/s, peak GPU memory, ratios -> $OUT_DIR/gpu_check.json
#   2. the GPU tests: pytest -m gpu (those that also need vLLM skip, with a reason, when it is absent).
#
#   scripts/gpu_check.sh                  # on the GPU machine, from anywhere
#   scripts/gpu_check.sh --cpu-smoke      # 1 tiny step per variant on CPU: checks the script itself
# A GPU machine without trl, datasets, math-verify, pebble or deepspeed and no package index: build
# their wheels here with scripts/gpu_wheels.sh (into .gpu-wheels, ~9 MB), carry that folder, and there run
#   python3 -m pip install --no-index --no-deps .gpu-wheels/*.whl && PYTHON=python3 scripts/gpu_check.sh
# Environment: PYTHON (default: python), GPU_CHECK_OUT (default: runs/gpu_check).
# Extra arguments go to scripts/gpu_check.py (e.g. --steps 10 --completion-length 512).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT_DIR=${GPU_CHECK_OUT:-runs/gpu_check}
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"

if [[ "${1:-}" == "--cpu-smoke" ]]; then
    shift
    OMP_NUM_THREADS=1 exec "$PYTHON" scripts/gpu_check.py --cpu-smoke --out "$OUT_DIR" "$@"
fi

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA device (use --cpu-smoke on a CPU)')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

status=0
echo "== 1/2 CAPO vs GRPO step cost"
timeout 420 "$PYTHON" scripts/gpu_check.py --out "$OUT_DIR" "$@" || status=$?
echo "== 2/2 pytest -m gpu"
timeout 150 "$PYTHON" -m pytest -m gpu -q -p no:warnings -rs tests 2>&1 | tee "$OUT_DIR/pytest_gpu.txt" || status=$?
echo "gpu_check.sh: done (exit $status); results in $OUT_DIR"
exit "$status"
