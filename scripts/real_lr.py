"""The exploratory pilot of a third of the learning rate on the real model (docs/results/smollm2-lr/protocol.md).

    python scripts/real_lr.py run ARM SEED --runs runs/lr   # train (resumes), test, keep ARM/seedSEED.json
    python scripts/real_lr.py summary                        # summary.json: each run's checks, the decisions

``run`` trains the study's ``grpo`` or ``capo-nomask`` arm with ``--learning_rate 3e-4`` through the study's
helper (scripts/real_pilot.py's ``train_and_test``: same steps, same test) and writes the study's record format,
with ``entropy`` in the training log. ``summary`` applies the protocol's checks to the records against the
study's start model: the study's collapse rule, the pilots' criterion, and the decisions the protocol fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from real_pilot import REQUIRED, ROOT, moved, record, train_and_test
from real_study import ARMS as STUDY_ARMS
from real_study import STEPS, TASK, TRAIN_LOG

from capo_trl.harness.confirmatory import PLANS, collapsed as study_collapsed

OUT = ROOT / "docs" / "results" / "smollm2-lr"
START = ROOT / "docs" / "results" / "smollm2-study" / "start.json"
SEEDS = (100, 101, 102)
LEARNING_RATE = "3e-4"
ARMS = {f"{arm}-lr{LEARNING_RATE}": (STUDY_ARMS[arm][0], [*STUDY_ARMS[arm][1], "--learning_rate", LEARNING_RATE])
        for arm in ("grpo", "capo-nomask")}
GRPO, CAPO = ARMS
PLAN = PLANS["smollm2-study"]  # its collapse rule
LOG = (*TRAIN_LOG, "entropy")


def run_one(arm: str, seed: int, runs: Path) -> Path:
    run = runs / arm / f"seed{seed}"
    recipe, flags = ARMS[arm]
    state, log, times = train_and_test(run, recipe, TASK, seed, flags, STEPS, LOG)
    kept = {"arm": arm, "task": TASK, "seed": seed, "global_step": state["global_step"], "recipe": recipe,
            "flags": flags, **record(json.loads((run / "test" / "report.json").read_text()),
                                     run / "test" / "samples.csv", TASK),
            "train": log, **times}
    path = OUT / arm / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def checks(rec: dict, start: dict) -> dict:
    """One run's endpoints 1-2: the study's collapse rule, the pilots' criterion and its "trains" part."""
    moves = {name: moved(start[k], rec[k], d, m) for name, (k, d, m) in REQUIRED.items()}
    collapse = study_collapsed(rec, PLAN)
    return {"collapsed": collapse, **moves, "loses_calibration": all(moves.values()) and not collapse,
            "trains": moves["accuracy_rises"] and not collapse}


def summary() -> dict:
    """Per arm and seed the checks (None: not finished), and the protocol's decisions once all six have run."""
    start = json.loads(START.read_text())
    runs = {arm: {s: checks(json.loads(p.read_text()), start) if (p := OUT / arm / f"seed{s}.json").is_file() else None
                  for s in SEEDS} for arm in ARMS}
    done = {arm: [s for s, c in by_seed.items() if c is not None] for arm, by_seed in runs.items()}
    count = {arm: {k: sum(runs[arm][s][k] for s in done[arm]) for k in ("collapsed", "loses_calibration", "trains")}
             for arm in ARMS}
    complete = all(len(d) == len(SEEDS) for d in done.values())
    decided = None
    if complete:
        decided = {"candidate": count[CAPO]["collapsed"] == 0 and count[GRPO]["loses_calibration"] == len(SEEDS),
                   "recipe_learning_rate": LEARNING_RATE if count[CAPO]["trains"] == len(SEEDS) else None}
    return {"seeds": list(SEEDS), "learning_rate": LEARNING_RATE, "runs": runs, "done": done, "count": count,
            "complete": complete, "decided": decided}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("run")
    one.add_argument("arm", choices=list(ARMS))
    one.add_argument("seed", type=int, choices=SEEDS)
    one.add_argument("--runs", default="runs/lr", help="where the runs' folders go (outside git)")
    sub.add_parser("summary")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "run":
        print(f"wrote {run_one(args.arm, args.seed, Path(args.runs).resolve())}")
    else:
        result = summary()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: result[k] for k in ("done", "count", "decided")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
