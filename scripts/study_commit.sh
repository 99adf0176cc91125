#!/usr/bin/env bash
# The team's commit of one finished study record, as `capo-trl study queue ... --into <this checkout's study folder>
# --on_record "bash <this checkout>/scripts/study_commit.sh"` runs it: every page re-rendered, the record committed
# with them, under the checkout's lock (<git dir>/study-commit.lock; other work fast-forwards under the same lock).
set -euo pipefail
record=${STUDY_RECORD:?run by capo-trl study queue --on_record, which sets STUDY_RECORD}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/src"  # this checkout's renderers, not the frozen code the queue runs
lock=$(cd "$here" && cd "$(git rev-parse --git-common-dir)" && pwd)/study-commit.lock
study=$(basename "$(dirname "$(dirname "$record")")")
arm=$(basename "$(dirname "$record")")
(
  flock -w 600 9
  cd "$here"
  python scripts/results_tables.py > /dev/null
  git add "$record" README.md docs
  git commit -q -m "The study $study: $arm $(basename "$record" .json) finished (its record, committed as it was written, and the pages re-rendered)"
) 9> "$lock"
