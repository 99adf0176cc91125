#!/usr/bin/env bash
# One-GPU check of capo-trl, in one go, within 10 minutes on an H100/H200-class GPU:
#   1. the GPU tests (pytest -m gpu): bf16 training on CUDA, the FSDP2 and ZeRO-3 accelerate configs on one
#      GPU through `capo-trl train`, vLLM colocate (skips, with a reason, when vLLM is absent)
#   2. bf16 training steps on a randomly initialised ~494M-parameter Qwen2 built from a config (no
#      download): GRPO, CAPO without / with the reference forward, both with LoRA, half-tied groups, CAPO
#      under single-process ZeRO-3: step time, tokens/s, peak GPU memory, ratios -> $OUT_DIR/gpu_check.json
#      (rewritten after every variant, so a run stopped at its limit keeps what it measured)
#
#   scripts/gpu_check.sh                  # on the GPU machine, from anywhere
#   scripts/gpu_check.sh --cpu-smoke      # 1 tiny step per variant on CPU: checks the script itself
# A GPU machine without capo-trl's stack and no package index: build the wheels here with
# scripts/gpu_wheels.sh (into .gpu-wheels), carry that folder, and there run
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
#   PYTHONPATH=/tmp/site PYTHON=python3 scripts/gpu_check.sh
# Environment: PYTHON (default: python), GPU_CHECK_OUT (default: runs/gpu_check), GPU_CHECK_TESTS_S and
# GPU_CHECK_STEPS_S (each part's time limit, default 150 and 360 seconds).
# Extra arguments go to scripts/gpu_check.py (e.g. --steps 10 --completion-length 512).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT_DIR=${GPU_CHECK_OUT:-runs/gpu_check}
# Offline, so no Hub kernels: on CUDA transformers >= 5.2x swaps in Hub kernels at from_pretrained by default and,
# with HF_HUB_OFFLINE and none cached, fails the load (seen on an H200); USE_HUB_KERNELS=NO keeps PyTorch's layers.
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 USE_HUB_KERNELS=NO
mkdir -p "$OUT_DIR"

if [[ "${1:-}" == "--cpu-smoke" ]]; then
    shift
    OMP_NUM_THREADS=1 exec "$PYTHON" scripts/gpu_check.py --cpu-smoke --out "$OUT_DIR" "$@"
fi

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA device (use --cpu-smoke on a CPU)')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

status=0
echo "== 1/2 pytest -m gpu"
# only the modules that hold GPU tests: collecting every module would import the CPU suite's extras
mapfile -t GPU_TESTS < <(grep -l "pytest.mark.gpu" tests/test_*.py)
timeout "${GPU_CHECK_TESTS_S:-150}" "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider -p no:warnings -rs \
    "${GPU_TESTS[@]}" 2>&1 | tee "$OUT_DIR/pytest_gpu.txt" || status=$?
echo "== 2/2 CAPO vs GRPO step cost"
timeout "${GPU_CHECK_STEPS_S:-360}" "$PYTHON" scripts/gpu_check.py --out "$OUT_DIR" "$@" || status=$?
echo "gpu_check.sh: done (exit $status); results in $OUT_DIR"
exit "$status"
