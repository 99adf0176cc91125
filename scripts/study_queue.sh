#!/usr/bin/env bash
# The real model's study queue: runs a study's runner from its frozen worktree, two slots at a time (one thread
# each, niced), seed-major with the arms in the plan's order, skipping records already committed here, resuming a
# run from its checkpoint; each finished record is copied here and committed with every page re-rendered.
#
#   git worktree add --detach ../frozen <the commit that adds the study's protocol.md>
#   setsid nohup bash scripts/study_queue.sh ../frozen real_lr_study smollm2-lr-study \
#       "grpo-lr3e-4 capo-nomask-lr3e-4" "204 206 208 210" "205 207 209 211" > queue.out 2>&1 &
#
# With this checkout's venv active: its capo_trl renders the pages, the runs import the frozen one and go where
# the runner puts them by default, inside the frozen worktree. Keep this checkout's work tree clean while it runs
# (work in another worktree and fast-forward under the same lock, <git dir>/study-commit.lock): a commit takes the
# re-rendered pages whole. Its log: <frozen>/runs/study/queue.log.
set -u
FROZEN=$(cd "$1" && pwd); RUNNER=$2; NAME=$3; STUDY=docs/results/$3; ARMS=$4; HERE=$(cd "$(dirname "$0")/.." && pwd)
LOCK=$(cd "$HERE" && cd "$(git rev-parse --git-common-dir)" && pwd)/study-commit.lock
mkdir -p "$FROZEN/runs/study"
log() { echo "$(date -u +%FT%TZ) $*" >> "$FROZEN/runs/study/queue.log"; }
slot() {
  for seed in $1; do
    for arm in $ARMS; do
      [ -f "$HERE/$STUDY/$arm/seed$seed.json" ] && continue
      log "start $arm $seed"
      (cd "$FROZEN" && PYTHONPATH="$FROZEN/src" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 \
        nice python "scripts/$RUNNER.py" run "$arm" "$seed" > "runs/study/$arm-$seed.out" 2>&1) \
        || { log "FAILED $arm $seed (runs/study/$arm-$seed.out)"; continue; }
      (
        flock 9
        mkdir -p "$HERE/$STUDY/$arm" && cp "$FROZEN/$STUDY/$arm/seed$seed.json" "$HERE/$STUDY/$arm/"
        cd "$HERE" && python scripts/results_tables.py > /dev/null && git add "$STUDY" README.md docs \
          && git commit -q -m "The real model's study $NAME: $arm seed $seed finished (its record, committed as it was written, and the pages re-rendered)"
        log "committed $arm $seed rc=$?"
      ) 9> "$LOCK"
    done
  done
}
slot "$5" &
slot "$6" &
wait
log "queue done"
