#!/usr/bin/env bash
# Resume equals not stopping, end to end on the embedded default: an uninterrupted 40-step run with
# the auto-threshold mask vs the same run killed with SIGKILL after a checkpoint and resumed with
# `--resume_from_checkpoint last`. Prints the largest weight difference and any logged difference.
# Usage: bash scripts/resume_check.sh [WORK_DIR]   (default runs/resume_check; takes a few minutes on CPU)
set -u
WORK=${1:-runs/resume_check}
mkdir -p "$WORK" && cd "$WORK"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ARGS="--max_steps 40 --save_steps 5 --noise_mask true --ref_thresholds auto --logging_steps 5 --disable_tqdm true"
rm -rf A B
capo-trl train $ARGS --output_dir A > A.log 2>&1 || { echo "uninterrupted run failed: see $WORK/A.log"; exit 1; }
capo-trl train $ARGS --output_dir B > B1.log 2>&1 &
PID=$!
deadline=$((SECONDS + 1800))
while [ ! -f B/checkpoint-15/capo_state.pt ] && kill -0 $PID 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 1; done
sleep 2; kill -9 $PID 2>/dev/null; wait $PID 2>/dev/null
echo "killed after: $(ls -d B/checkpoint-* | tr '\n' ' ')"
capo-trl train $ARGS --output_dir B --resume_from_checkpoint last > B2.log 2>&1 || { echo "resume failed: see $WORK/B2.log"; exit 1; }
python - <<'PY'
import json
from safetensors.torch import load_file
a, b = load_file("A/model.safetensors"), load_file("B/model.safetensors")
print("max |weight difference|:", max((a[k].float() - b[k].float()).abs().max().item() for k in a))
la = json.load(open("A/checkpoint-40/trainer_state.json"))["log_history"]
lb = json.load(open("B/checkpoint-40/trainer_state.json"))["log_history"]
keys = ["capo/ref_high", "capo/ref_low", "capo/kept_frac", "loss", "capo/auroc"]
for ra, rb in zip(la, lb):
    if "loss" in ra:
        print(ra["step"], {k: (ra.get(k), rb.get(k)) for k in keys if ra.get(k) != rb.get(k)} or "identical")
PY
