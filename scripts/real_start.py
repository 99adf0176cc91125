"""The real model before any RL, on each of its tasks: what docs/results/smollm2-start/ renders.

    capo-trl eval --model smollm2-135m-instruct --benchmark TASK --split test --limit 256 --n 8 \
        --max_new_tokens 32 --batch_size 64 --out docs/results/smollm2-start/TASK --overwrite
    python scripts/real_start.py mask TASK     # calibrate-mask on 512 train problems x 8: calibrate-mask.json
    python scripts/real_start.py paper TASK    # the paper's thresholds against the test samples: paper-mask.json

``mask`` runs ``capo_trl.harness.calibrate_mask`` (the quartile-rule thresholds, the within-group spread of
the score, i.e. the absolute tau it suggests) and writes its report; ``paper`` reads the test split's
samples.csv (the start model is the reference, so exp(-s) of a sample is its reference perplexity) and
counts what the paper's ``ref_high`` 2.5 / ``ref_low`` 1.05 would drop.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "docs" / "results" / "smollm2-start"
PAPER = {"ref_high": 2.5, "ref_low": 1.05}


def mask(task: str) -> dict:
    import torch

    from capo_trl.data.benchmarks import load_benchmark
    from capo_trl.data.models import resolve_model
    from capo_trl.harness.calibrate_mask import calibrate_mask

    torch.set_num_threads(1)
    start = time.time()
    report = calibrate_mask(resolve_model("smollm2-135m-instruct"), None,
                            load_benchmark(task, split="train", limit=512), n=8, max_new_tokens=32, progress=False,
                            device="cpu", batch_size=64)
    report["seconds"] = round(time.time() - start, 1)
    return report


def paper(task: str) -> dict:
    with open(ROOT / task / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    correct = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) >= 0.5]
    wrong = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) < 0.5]
    from capo_trl.data.benchmarks import load_benchmark

    problems = load_benchmark(task, split="test", limit=len({r["id"] for r in rows}))
    hidden = {i for i, p in zip(problems["id"], problems["prompt"]) if p[-1]["content"].endswith("+?.")}
    by_kind = {kind: [float(r["grade"]) for r in rows if (r["id"] in hidden) == (kind == "guessable")]
               for kind in ("derivable", "guessable")}
    kinds = {f"{kind}/{what}": value for kind, grades in by_kind.items() if grades
             for what, value in (("samples", len(grades)), ("accuracy", sum(grades) / len(grades)))}
    return {**PAPER, **kinds, "n_correct": len(correct), "n_wrong": len(wrong),
            "dropped_correct": sum(p > PAPER["ref_high"] for p in correct) / max(len(correct), 1),
            "dropped_wrong": sum(p < PAPER["ref_low"] for p in wrong) / max(len(wrong), 1),
            "ppl_correct_max": max(correct, default=float("nan")), "ppl_wrong_min": min(wrong, default=float("nan"))}


def main(argv: list[str]) -> int:
    what, task = argv
    report = {"mask": mask, "paper": paper}[what](task)
    out = ROOT / task / ("calibrate-mask.json" if what == "mask" else "paper-mask.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
