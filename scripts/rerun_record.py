"""Rerun one committed record of a frozen study under this checkout's code, and compare it with the record.

A frozen study runs its frozen code (``capo-trl study run`` checks it out by itself). This script deliberately runs
the code of this checkout instead: it is how a change that claims to compute what the frozen code computed is
checked. It trains and tests the record's (arm, seed) as the study's runner does (``run_one``), into a scratch
folder, then prints each endpoint and each logged training value of both records and exits 1 unless all are equal.

    python scripts/rerun_record.py docs/results/STUDY/ARM/seedK.json [--runs DIR] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the study's queue runs each run: one thread
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TIMES = ("step_time",)  # a logged wall time: the machine's, not the computation's
COMPARED = ("global_step", "accuracy", "accuracy_ci", "auroc", "auroc_question", "ece", "e_aurc", "auroc_question_n",
            "mean_tokens", "finished_frac", "answered_frac")


def differences(old: dict, new: dict) -> list[str]:
    """Every compared key (endpoints, per-kind ones, the logged training values but their wall times) whose values
    are not equal."""
    keys = [k for k in old if k in COMPARED or "/" in k]
    out = [f"{k}: {old[k]!r} != {new.get(k)!r}" for k in keys if old[k] != new.get(k)]
    for a, b in zip(old.get("train", []), new.get("train", [])):
        out += [f"train step {a['step']} {k}: {a[k]!r} != {b.get(k)!r}" for k in a
                if k not in TIMES and a[k] != b.get(k)]
    if len(old.get("train", [])) != len(new.get("train", [])):
        out.append(f"train: {len(old['train'])} logged steps != {len(new.get('train', []))}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", type=Path)
    parser.add_argument("--runs", type=Path, default=None, help="where the run trains (default: a scratch folder)")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison here as JSON")
    parser.add_argument("--compare", type=Path, default=None,
                        help="compare with this rerun's record (a --out file of an earlier rerun) instead of running")
    args = parser.parse_args(argv)
    if args.compare:
        old = json.loads(args.record.read_text())
        done = json.loads(args.compare.read_text())
        diff = differences(old, done.get("rerun", done))
        print("equal" if not diff else "NOT EQUAL:\n  " + "\n  ".join(diff))
        return 1 if diff else 0
    import capo_trl.cli.study_run as study_run
    from capo_trl.harness.study import load_study

    old = json.loads(args.record.read_text())
    study = load_study(args.record.parent.parent)
    study_run.check_code = lambda study: None  # the point: this checkout's code, not the frozen one
    runs = args.runs or Path(tempfile.mkdtemp(prefix="rerun-"))
    into = Path(tempfile.mkdtemp(prefix="rerun-records-"))
    path = study_run.run_one(study, old["arm"], old["seed"], runs.resolve(), into)
    new = json.loads(path.read_text())
    diff = differences(old, new)
    print(f"{study.name} {old['arm']} seed {old['seed']}: record of commit {old['commit'][:12]}, rerun at "
          f"{(new['commit'] or new['capo_trl'])[:12]}; train {new['train_s']} s (record {old['train_s']}), test "
          f"{new['test_s']} s (record {old['test_s']})")
    for key in [k for k in old if k in COMPARED or "/" in k]:
        print(f"  {key}: record {old[key]!r}, rerun {new.get(key)!r}")
    print(f"{len(old.get('train', []))} logged training steps compared")
    print("equal" if not diff else "NOT EQUAL:\n  " + "\n  ".join(diff))
    if args.out:
        args.out.write_text(json.dumps({"record": str(args.record), "old_commit": old["commit"],
                                        "new_commit": new["commit"], "train_s": new["train_s"],
                                        "test_s": new["test_s"], "differences": diff, "rerun": new}, indent=1) + "\n")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
