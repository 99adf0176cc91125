"""Calibrated confidence and selective answering of trained checkpoints, side by side (prints a table).

    python scripts/confidence_table.py NAME=MODEL_DIR [NAME=MODEL_DIR ...] [--test 256] [--val 256] [--n 8]

Each model answers the embedded task's test split (--test problems x --n samples) and validation
split (the calibration split: no problem in common) once; every calibration method is fitted on the
validation samples and scored on the test samples: ECE and Brier before (raw exp(s)) and after, and
the coverage, precision and the low end of its 95% interval at target precisions 0.90 and 0.95. The
threshold is chosen on the validation samples with precision bounded by question, on the raw score
s (so every method answers the same samples), and the interval on the test split is by question too.
"""

import argparse
import copy
import json

from capo_trl.data.arithmetic import arithmetic_dataset
from capo_trl.evaluation.confidence import METHODS
from capo_trl.evaluation.evaluate import evaluate, recalibrate


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    ap.add_argument("--test", type=int, default=256)
    ap.add_argument("--val", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--json", default=None, help="also write every number here")
    args = ap.parse_args()
    rows = []
    for spec in args.models:
        name, path = spec.split("=", 1)
        test = [{"prompt": r["prompt"], "answer": r["answer"]} for r in arithmetic_dataset("test", args.test)]
        val = [{"prompt": r["prompt"], "answer": r["answer"]} for r in arithmetic_dataset("validation", args.val)]
        base = evaluate(path, None, test, n=args.n, max_new_tokens=48, progress=False)
        cal = evaluate(path, None, val, n=args.n, max_new_tokens=48, progress=False, seed=1).samples
        for method in METHODS:
            row = {"model": name, "method": method, "accuracy": base.metrics[f"mean@{args.n}"],
                   "auroc": base.metrics["auroc"], "ece_raw": base.metrics["ece"], "brier_raw": base.metrics["brier"]}
            for target in (0.90, 0.95):
                result = copy.deepcopy(base)
                recalibrate(result, cal, method, target_precision=target)
                m = result.metrics
                row.update({"ece": m["ece_calibrated"], "brier": m["brier_calibrated"],
                            f"coverage@{target}": m["selective/coverage"], f"precision@{target}": m["selective/precision"],
                            f"ci_low@{target}": m["selective/precision_ci_low"],
                            f"questions@{target}": m["selective/n_questions"]})
            rows.append(row)
    print(f"test {args.test} x {args.n}, calibration on validation {args.val} x {args.n}")
    print("| model | method | accuracy | AUROC | ECE raw -> calibrated | Brier raw -> calibrated | coverage @0.90 "
          "(precision, CI low) | coverage @0.95 (precision, CI low) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[f'coverage@{t}']:.3f} ({r[f'precision@{t}']:.3f}, {r[f'ci_low@{t}']:.3f})" for t in (0.9, 0.95)]
        print(f"| {r['model']} | {r['method']} | {r['accuracy']:.3f} | {r['auroc']:.3f} | {r['ece_raw']:.3f} -> "
              f"{r['ece']:.3f} | {r['brier_raw']:.3f} -> {r['brier']:.3f} | {cells[0]} | {cells[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
