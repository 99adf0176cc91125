"""The real model's confirmatory study (docs/results/smollm2-study/protocol.md): one run per arm and seed.

    python scripts/real_study.py power                         # the seeds the protocol's power calculation gives
    python scripts/real_study.py init                          # config.json and start.json of the study folder
    python scripts/real_study.py run ARM SEED --runs runs/study  # train (resumes), test, keep the record
    python -m capo_trl.harness.confirmatory report --into docs/results/smollm2-study

``run`` trains the arm's recipe (``ARMS``: the SmolLM2 recipes, the mask arms with their thresholds) on the
study's task for its steps, resuming from the run's last checkpoint, tests the trained adapter exactly as
the pilot did (scripts/real_pilot.py: the first 256 test problems x 8 samples, temperature 1, 32 new tokens,
evaluation seed 0) and writes ``ARM/seedSEED.json`` in the study folder: the test endpoints (per item kind on a
task with guessable items), the training log (the mask's logged drop rates included) and wall times. A
finished step (training, test) is not redone. The analysis is the protocol's plan,
``capo_trl.harness.confirmatory.PLANS["smollm2-study"]``, computed from those files only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from real_pilot import ROOT, START, record, train_and_test

from capo_trl.harness.confirmatory import PLANS
from capo_trl.harness.paired import t_power

OUT = ROOT / "docs" / "results" / "smollm2-study"
PLAN = PLANS["smollm2-study"]
TASK = "addition"  # the task the pilot found a test bed (docs/results/smollm2-pilot/)
STEPS = 100  # the pilot's budget
SEEDS = list(range(100, 100 + PLAN.max_seeds))  # apart from the pilot's 0-2, which chose the task
GRPO, CAPO = "examples/recipes/grpo-smollm2-135m-lora-cpu.yaml", "examples/recipes/capo-smollm2-135m-lora-cpu.yaml"
# arm -> (recipe, the flags it adds); the measured thresholds are calibrate-mask's on the task's train split
# (docs/results/smollm2-start/<task>/calibrate-mask.json), rounded to 3 decimals as its page shows them
_MEASURED = json.loads((START / TASK / "calibrate-mask.json").read_text())
TRUNCATED = ["--mask_truncated_completions", "true"]  # the second pilot's flag, in every arm
ARMS = {
    "grpo": (GRPO, TRUNCATED),
    "capo-nomask": (CAPO, TRUNCATED),
    "capo-mask-paper": (CAPO, [*TRUNCATED, "--noise_mask", "true", "--ref_high", "2.5", "--ref_low", "1.05"]),
    "capo-mask-measured": (CAPO, [*TRUNCATED, "--noise_mask", "true", "--ref_high", f"{_MEASURED['ref_high']:.3f}",
                                  "--ref_low", f"{_MEASURED['ref_low']:.3f}"]),
}
assert list(ARMS) == list(PLAN.arms), "the runner's arms are the plan's, in its order"
TRAIN_LOG = ("reward", "completions/mean_length", "completions/clipped_ratio", "grad_norm", "step_time",
             "capo/skipped_frac", "capo/kept_frac", "capo/dropped_correct", "capo/dropped_wrong",
             "capo/mask_guard_kept", "capo/auroc")


PILOT2 = ROOT / "docs" / "results" / "smollm2-pilot2"
EFFECT, POWER, MIN_SEEDS, MAX_SEEDS = 0.05, 0.8, 12, 24


def power() -> dict:
    """The protocol's power calculation: the SD of GRPO's end pooled AUROC over the second pilot's seeds on the
    task, times sqrt(2) for a difference of two independent arms; the fewest seeds (at least 12, at most 24)
    giving the paired t test (two-sided, alpha 0.05) power 0.8 for a true difference of 0.05."""
    aurocs = [json.loads((PILOT2 / f"{TASK}-seed{s}.json").read_text())["auroc"] for s in (0, 1, 2)]
    sd = statistics.stdev(aurocs)
    sd_diff = sd * 2 ** 0.5
    table = {n: t_power(EFFECT, sd_diff, n) for n in range(MIN_SEEDS, MAX_SEEDS + 1)}
    seeds = next((n for n, p in table.items() if p >= POWER), MAX_SEEDS)
    return {"pilot_aurocs": aurocs, "sd": sd, "sd_diff": sd_diff, "effect": EFFECT, "seeds": seeds,
            "power": table[seeds], "power_if_sd_doubles": t_power(EFFECT, 2 * sd_diff, seeds)}


def init(out: Path = OUT, arms: dict = ARMS, plan=PLAN, seeds: list = SEEDS) -> None:
    """A study folder's ``config.json`` (arms in the plan's order, the planned seeds) and ``start.json``."""
    out.mkdir(parents=True, exist_ok=True)
    config = {"task": TASK, "steps": STEPS, "methods": list(plan.arms.values()), "seeds": seeds,
              "arms": {arm: {"recipe": recipe, "flags": flags} for arm, (recipe, flags) in arms.items()}}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    start = {**record(json.loads((START / TASK / "report.json").read_text()), START / TASK / "samples.csv", TASK),
             "mask": {}}
    (out / "start.json").write_text(json.dumps(start, indent=1) + "\n")


def run_one(arm: str, seed: int, runs: Path, out: Path = OUT, arms: dict = ARMS, log: tuple = TRAIN_LOG) -> Path:
    """Train (resuming), test and keep one run's record in a study folder (``out``), as the protocol says."""
    run = runs / arm / f"seed{seed}"
    recipe, flags = arms[arm]
    state, logged, times = train_and_test(run, recipe, TASK, seed, flags, STEPS, log)
    # "mask" holds per-kind counts where a runner can tally them in process; the CLI logs only the drop rates
    # (capo/dropped_correct, capo/dropped_wrong in "train")
    kept = {"arm": arm, "task": TASK, "seed": seed, "global_step": state["global_step"], "recipe": recipe,
            "flags": flags, **record(json.loads((run / "test" / "report.json").read_text()),
                                     run / "test" / "samples.csv", TASK),
            "mask": {}, "train": logged, **times}
    path = out / arm / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def cli(argv: list[str], doc: str, out: Path, arms: dict, plan, seeds: list, log: tuple, power_of, runs: str) -> int:
    """A real-model study's command line (``power``, ``init``, ``run``), for this study or another one's runner."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("init")
    sub.add_parser("power")
    one = sub.add_parser("run")
    one.add_argument("arm", choices=list(arms))
    one.add_argument("seed", type=int, choices=seeds, metavar=f"SEED ({seeds[0]}-{seeds[-1]})")
    one.add_argument("--runs", default=runs, help="where the runs' folders go (outside git)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "power":
        print(json.dumps(power_of(), indent=1))
    elif args.what == "init":
        init(out, arms, plan, seeds)
        print(f"wrote {out / 'config.json'} and {out / 'start.json'}")
    else:
        print(f"wrote {run_one(args.arm, args.seed, Path(args.runs).resolve(), out, arms, log)}")
    return 0


def main(argv: list[str]) -> int:
    return cli(argv, __doc__, OUT, ARMS, PLAN, SEEDS, TRAIN_LOG, power, "runs/study")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
