"""The real model's pilots (docs/results/smollm2-pilot*/protocol.md): GRPO on each real-model task, one run per seed.

    python scripts/real_pilot.py run TASK SEED --runs runs/pilot   # train (resumes), test, keep the record
    python scripts/real_pilot.py verdict                           # the criterion over the kept records
    python scripts/real_pilot.py run TASK SEED --pilot smollm2-pilot2 --runs runs/pilot2   # the second pilot

``--pilot`` names the pilot (``PILOTS``: its folder under docs/results/ and the flags it adds to the recipe; the
first by default). ``run`` trains with the GRPO recipe (``--dataset_name TASK --seed SEED``, the protocol's steps,
the pilot's flags), resuming from
the run's last checkpoint when it has one, then evaluates the trained adapter on the test split exactly as
the start model was evaluated (docs/results/smollm2-start/: the first 256 test problems x 8 samples,
temperature 1, 32 new tokens, evaluation seed 0), and writes ``TASK-seedSEED.json`` (the test metrics, per
item kind, the training log, wall times) beside the protocol. A finished step (training, test) is not
redone. ``verdict`` applies the protocol's criterion to the records and the start reports and writes
``verdict.json``; scripts/results_tables.py renders both.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# pilot -> the flags it adds to the recipe. The second adds TRL's mask_truncated_completions: in the first, one
# seed of each task stopped ending its answers (every test sample ran to the token limit).
PILOTS = {"smollm2-pilot": [], "smollm2-pilot2": ["--mask_truncated_completions", "true"]}
OUT = RESULTS / "smollm2-pilot"  # the first pilot's folder
START = ROOT / "docs" / "results" / "smollm2-start"
RECIPE = "examples/recipes/grpo-smollm2-135m-lora-cpu.yaml"
TASKS = ("addition", "addition-guess-half")
SEEDS = (0, 1, 2)
STEPS = 100
TEST = ["--split", "test", "--limit", "256", "--n", "8", "--max_new_tokens", "32", "--batch_size", "64",
        "--seed", "0", "--device", "cpu", "--no_progress"]
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece", "e_aurc")
# The pre-registered criterion. Required on every seed: (endpoint, direction, margin) ...
REQUIRED = {"accuracy_rises": ("accuracy", +1, 0.02), "auroc_falls": ("auroc", -1, 0.03)}
# ... and no collapse: at most this mean length (of 32 allowed) and at least this share of finished samples.
MAX_MEAN_TOKENS, MIN_FINISHED = 30.0, 0.5
# Reported with their own verdicts, not required: per-question AUROC, E-AURC, ECE.
REPORTED = {"auroc_question_falls": ("auroc_question", -1, 0.03), "ece_rises": ("ece", +1, 0.02)}
E_AURC_FACTOR = 1.25
TRAIN_LOG = ("reward", "completions/mean_length", "completions/clipped_ratio", "grad_norm", "step_time",
             "capo/skipped_frac")


def record(report: dict, samples_csv: Path, task: str) -> dict:
    """What the pilot keeps of one test evaluation: the endpoints, length and format, per item kind."""
    m = report["metrics"]
    out = {"accuracy": m["mean@8"], "accuracy_ci": [m["mean@8_ci_low"], m["mean@8_ci_high"]],
           **{k: m[k] for k in ENDPOINTS[1:]}, "auroc_question_n": m["auroc_question_n"],
           "mean_tokens": m["mean_tokens"], "finished_frac": m["finished_frac"], "answered_frac": m["answered_frac"]}
    with open(samples_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    from capo_trl.data.guessing import guess_breakdown
    from capo_trl.data.tasks import TASKS as REGISTRY

    problems = REGISTRY[task].dataset("test", m["n_problems"])
    samples = [{"grade": None if r["grade"] == "" else float(r["grade"]), "score": float(r["score"]),
                "extracted": r["extracted"] or None} for r in rows]
    kinds = guess_breakdown(samples, problems, 8)
    return {**out, **{k: v for k, v in kinds.items() if not (isinstance(v, float) and math.isnan(v))}}


def train_and_test(run: Path, recipe: str, task: str, seed: int, flags: list[str], steps: int = STEPS,
                   train_log: tuple = TRAIN_LOG) -> tuple[dict, list, dict]:
    """Train ``run`` (resuming from its last checkpoint), then test it, each once; returns the final checkpoint's
    trainer state, the logged training rows (``train_log``'s keys) and the wall times. The pilots and the study
    share it, so every real-model run is trained and tested the same way."""
    run.mkdir(parents=True, exist_ok=True)
    times = json.loads((run / "times.json").read_text()) if (run / "times.json").is_file() else {}
    if not (run / "train.done").is_file():
        t0 = time.time()
        args = ["capo-trl", "train", "--config", recipe, "--dataset_name", task, "--seed", str(seed),
                "--max_steps", str(steps), "--output_dir", str(run), *flags]
        if any(run.glob("checkpoint-*")):
            args += ["--resume_from_checkpoint", "last"]
        with open(run.parent / f"{run.name}.train.log", "a") as log:
            subprocess.run(args, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        times.setdefault("train_s", []).append(round(time.time() - t0))
        (run / "train.done").write_text("")
        (run / "times.json").write_text(json.dumps(times) + "\n")
    if not (run / "test" / "report.json").is_file():
        t0 = time.time()
        subprocess.run(["capo-trl", "eval", "--model", str(run), "--benchmark", task, *TEST, "--out", str(run / "test"),
                        "--overwrite"], check=True, cwd=ROOT)
        times["test_s"] = round(time.time() - t0)
        (run / "times.json").write_text(json.dumps(times) + "\n")
    checkpoint = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    log = [{"step": r["step"], **{k: r[k] for k in train_log if k in r}} for r in state["log_history"] if "reward" in r]
    return state, log, times


def run_one(task: str, seed: int, runs: Path, out: Path = OUT) -> Path:
    run = runs / f"{task}-seed{seed}"
    state, log, times = train_and_test(run, RECIPE, task, seed, PILOTS[out.name])
    kept = {"task": task, "seed": seed, "global_step": state["global_step"], "recipe": RECIPE, "flags": PILOTS[out.name],
            **record(json.loads((run / "test" / "report.json").read_text()), run / "test" / "samples.csv", task),
            "train": log, **times}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{task}-seed{seed}.json"
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def start_record(task: str) -> dict:
    return record(json.loads((START / task / "report.json").read_text()), START / task / "samples.csv", task)


def moved(start: float, final: float, direction: int, margin: float) -> bool:
    """``final`` has moved from ``start`` by at least ``margin`` in ``direction`` (+1 up, -1 down)."""
    if any(v is None or math.isnan(v) for v in (start, final)):
        return False
    return direction * (final - start) >= margin - 1e-12


def verdict(folder: Path = OUT) -> dict:
    """Per task: each seed's checks, and whether the task is a test bed (every required check on every seed)."""
    out = {}
    for task in TASKS:
        start = start_record(task)
        finals = {s: json.loads(p.read_text()) for s in SEEDS if (p := folder / f"{task}-seed{s}.json").is_file()}
        per_seed = {}
        for seed, final in finals.items():
            checks = {name: moved(start[k], final[k], d, m) for name, (k, d, m) in REQUIRED.items()}
            checks["no_collapse"] = final["mean_tokens"] <= MAX_MEAN_TOKENS and final["finished_frac"] >= MIN_FINISHED
            required = all(checks.values())
            checks.update({name: moved(start[k], final[k], d, m) for name, (k, d, m) in REPORTED.items()})
            checks["e_aurc_rises"] = final["e_aurc"] >= E_AURC_FACTOR * start["e_aurc"]
            per_seed[seed] = {**checks, "required_met": required}
        complete = len(finals) == len(SEEDS)
        out[task] = {"start": start, "seeds_done": sorted(finals), "per_seed": per_seed, "complete": complete,
                     "test_bed": complete and all(v["required_met"] for v in per_seed.values()),
                     "loses_per_question": complete and all(v["auroc_question_falls"] for v in per_seed.values())}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("run")
    one.add_argument("task", choices=TASKS)
    one.add_argument("seed", type=int, choices=SEEDS)
    one.add_argument("--runs", default="runs/pilot", help="where the runs' folders go (outside git)")
    decide = sub.add_parser("verdict")
    for p in (one, decide):
        p.add_argument("--pilot", choices=list(PILOTS), default="smollm2-pilot")
    args = parser.parse_args(argv)
    out = RESULTS / args.pilot
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "run":
        print(f"wrote {run_one(args.task, args.seed, Path(args.runs).resolve(), out)}")
    else:
        result = verdict(out)
        (out / "verdict.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({t: {k: v[k] for k in ("seeds_done", "test_bed", "loses_per_question")} for t, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
