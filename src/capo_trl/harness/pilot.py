"""Pilot of a calibration test bed: GRPO only, on a task where some answers can only be guessed.

Trains GRPO (the harness's `grpo` preset and budget) from a start model on the task's train split,
one run per seed, and evaluates the start model and every run on the test split; then applies the
test-bed criterion (:data:`REQUIRED`, :data:`E_AURC_FACTOR`, :data:`REPORTED`: every required check on every seed,
the criterion the test-bed pilots pre-registered and their study files state) and writes, under ``--out``:
``start.json``, ``seed<k>.json`` (headline metrics, E-AURC, per item kind, validation history),
``per_seed.csv``, ``verdict.json`` and ``pilot.md`` (the table, rendered from those files).
A finished seed is reused when the same command is rerun (the harness's one driver,
:mod:`capo_trl.harness.driver`).

    python -m capo_trl.harness.pilot --task guess --model src/capo_trl/assets/guess-tiny --seeds 0 1 2 \\
      --steps 300 --val_every 50 --test_problems 512 --out runs/testbed/pilot
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import time
from functools import partial
from pathlib import Path

from ..data.guessing import guess_breakdown
from ..data.models import resolve_model
from ..data.tasks import TASKS
from . import driver

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece", "e_aurc")
# The pre-registered criterion: (endpoint, direction, margin); all three on every seed make a test bed.
REQUIRED = {"accuracy_rises": ("accuracy", +1, 0.02), "auroc_falls": ("auroc", -1, 0.03)}
E_AURC_FACTOR = 1.25
REPORTED = {"ece_rises": ("ece", +1, 0.02), "auroc_question_falls": ("auroc_question", -1, 0.03)}


def record(result, problems, n: int) -> dict:
    """What the pilot keeps of one test evaluation."""
    m = result.metrics
    out = {"accuracy": m[f"mean@{n}"], **{k: m[k] for k in ENDPOINTS[1:]}, "aurc": m["aurc"],
           "auroc_question_n": m["auroc_question_n"], "mean_tokens": m["mean_tokens"]}
    out.update(guess_breakdown(result.samples, problems, n))
    return out


def moved(start: float, final: float, direction: int, margin: float) -> bool:
    """``final`` has moved from ``start`` by at least ``margin`` in ``direction`` (+1 up, -1 down)."""
    if any(v is None or math.isnan(v) for v in (start, final)):
        return False
    return direction * (final - start) >= margin - 1e-12


def verdict(start: dict, finals: dict[int, dict]) -> dict:
    """Each seed's yes/no on every criterion, and whether the task counts as a test bed (all required, all seeds)."""
    per_seed = {}
    for seed, final in finals.items():
        checks = {name: moved(start[k], final[k], d, m) for name, (k, d, m) in REQUIRED.items()}
        checks["e_aurc_rises"] = final["e_aurc"] >= E_AURC_FACTOR * start["e_aurc"]
        required = all(checks.values())
        checks.update({name: moved(start[k], final[k], d, m) for name, (k, d, m) in REPORTED.items()})
        per_seed[seed] = {**checks, "required_met": required}
    return {"per_seed": per_seed, "test_bed": bool(per_seed) and all(v["required_met"] for v in per_seed.values())}


def render(start: dict, finals: dict[int, dict], result: dict) -> str:
    """The pilot's table (markdown), from the saved records only."""
    cols = [*ENDPOINTS, "derivable/accuracy", "guessable/accuracy", "guessable/mean_score", "derivable/mean_score",
            "guessable/modal_share", "mean_tokens"]
    lines = ["| model | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines.append("| start | " + " | ".join(f"{start[c]:.3f}" for c in cols) + " |")
    for seed, final in sorted(finals.items()):
        lines.append(f"| GRPO seed {seed} | " + " | ".join(f"{final[c]:.3f}" for c in cols) + " |")
    if result["per_seed"]:
        names = list(next(iter(result["per_seed"].values())))
        lines += ["", "| seed | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for seed, checks in sorted(result["per_seed"].items()):
            lines.append(f"| {seed} | " + " | ".join("yes" if checks[k] else "no" for k in names) + " |")
    lines += ["", f"Test bed (required criteria on every seed): **{'yes' if result['test_bed'] else 'no'}**"]
    return "\n".join(lines) + "\n"


def pilot_budget(args):
    """The harness budget of a pilot's runs; the task names the training reward too (``guess-redraw``'s own)."""
    from .presets import Budget

    return Budget(task=args.task, steps=args.steps, val_every=args.val_every, test_problems=args.test_problems,
                  model=args.model, progress=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--task", choices=[name for name in TASKS if name != "arithmetic"], required=True)
    parser.add_argument("--model", required=True, help="the start model (trained for the task)")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--val_every", type=int, default=50)
    parser.add_argument("--test_problems", type=int, default=512)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = parser.parse_args(argv)
    args.model = resolve_model(args.model, "--model")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import runs
    from .presets import PRESETS, check_budget

    torch.set_num_threads(args.threads)
    dataset = TASKS[args.task].dataset
    budget = pilot_budget(args)
    check_budget(budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    problems = dataset("test", budget.test_problems)
    (out / "budget.json").write_text(json.dumps({**vars(args), "budget": vars(budget)}, indent=2) + "\n")

    start_path = out / "start.json"
    if not start_path.is_file():
        t0 = time.time()
        model, tok = AutoModelForCausalLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
        result = runs.evaluate_test(model, tok, budget, seed=0, dataset=dataset)
        start_path.write_text(json.dumps({**record(result, problems, budget.test_samples),
                                          "seconds": time.time() - t0}, indent=2) + "\n")
    start = json.loads(start_path.read_text())
    print("start", json.dumps({k: round(start[k], 4) for k in ENDPOINTS}), flush=True)

    grpo = [("grpo", PRESETS["grpo"])]
    study = driver.Study(grpo, args.seeds, path=lambda label, seed: out / f"seed{seed}.json",
                         run=partial(train_record, budget, dataset, problems, out),
                         after=lambda finished: write_outputs(out, start, {s: r for (_, s), r in finished.items()}),
                         describe=lambda final: json.dumps({k: round(final[k], 4) for k in ENDPOINTS}))
    driver.run_study(study)

def train_record(budget, dataset, problems, out: Path, label: str, overrides: dict, seed: int) -> dict:
    """One GRPO run of the pilot: its record, ``seed<k>.json``."""
    from . import runs

    t0 = time.time()
    _, history, result = runs.train_method(overrides, seed, budget, out / f"run-seed{seed}", dataset)
    return {**record(result, problems, budget.test_samples), "seed": seed, "seconds": time.time() - t0,
            "history": history}


def write_outputs(out: Path, start: dict, finals: dict[int, dict]) -> dict:
    result = verdict(start, finals)
    (out / "verdict.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(out / "per_seed.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seed", "metric", "start", "final", "final_minus_start"])
        for seed, final in sorted(finals.items()):
            for k in ENDPOINTS:
                writer.writerow([seed, k, start[k], final[k], final[k] - start[k]])
    (out / "pilot.md").write_text(render(start, finals, result))
    return result


if __name__ == "__main__":
    main()
