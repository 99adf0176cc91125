"""The exploratory pilot of ``truncated_pairs: tied`` on the real model (docs/results/smollm2-tied/protocol.md).

    python scripts/real_tied.py run SEED --runs runs/tied   # train (resumes), test, keep seedSEED.json
    python scripts/real_tied.py summary                      # summary.json: collapse per seed, next to the study's

``run`` trains the study's ``capo-nomask`` arm with ``--truncated_pairs tied`` through the study's helper
(scripts/real_pilot.py's ``train_and_test``: same steps, same test) and writes the study's record format.
``summary`` applies the study's collapse rule to this arm's records and, for the same seeds, to the study's
committed ``capo-nomask`` and ``grpo`` records (collapse only: the study computes no endpoint before its look).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from real_pilot import ROOT, record, train_and_test
from real_study import ARMS, STEPS, TASK, TRAIN_LOG

from capo_trl.harness.confirmatory import PLANS, collapsed as study_collapsed

OUT = ROOT / "docs" / "results" / "smollm2-tied"
STUDY = ROOT / "docs" / "results" / "smollm2-study"
SEEDS = (100, 101, 102)
RECIPE, _FLAGS = ARMS["capo-nomask"]
FLAGS = [*_FLAGS, "--truncated_pairs", "tied"]
PLAN = PLANS["smollm2-study"]  # its collapse rule


def run_one(seed: int, runs: Path) -> Path:
    run = runs / f"seed{seed}"
    state, log, times = train_and_test(run, RECIPE, TASK, seed, FLAGS, STEPS, TRAIN_LOG)
    kept = {"arm": "capo-nomask-tied", "task": TASK, "seed": seed, "global_step": state["global_step"],
            "recipe": RECIPE, "flags": FLAGS,
            **record(json.loads((run / "test" / "report.json").read_text()), run / "test" / "samples.csv", TASK),
            "train": log, **times}
    path = OUT / f"seed{seed}.json"
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def collapsed(rec: dict) -> bool:
    """The study's rule (``confirmatory.collapsed``)."""
    return study_collapsed(rec, PLAN)


def summary() -> dict:
    rows = {}
    for seed in SEEDS:
        files = {"capo-nomask-tied": OUT / f"seed{seed}.json",
                 **{arm: STUDY / arm / f"seed{seed}.json" for arm in ("capo-nomask", "grpo")}}
        rows[seed] = {arm: collapsed(json.loads(p.read_text())) if p.is_file() else None for arm, p in files.items()}
    done = [s for s in SEEDS if rows[s]["capo-nomask-tied"] is not None]
    return {"seeds": SEEDS, "done": done, "collapsed": rows,
            "tied_collapsed": sum(rows[s]["capo-nomask-tied"] for s in done)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("run")
    one.add_argument("seed", type=int, choices=SEEDS)
    one.add_argument("--runs", default="runs/tied", help="where the runs' folders go (outside git)")
    sub.add_parser("summary")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "run":
        print(f"wrote {run_one(args.seed, Path(args.runs).resolve())}")
    else:
        result = summary()
        (OUT / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
