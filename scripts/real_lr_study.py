"""The real model's second confirmatory study (docs/results/smollm2-lr-study/protocol.md): the first study's
``grpo`` and ``capo-nomask`` at the learning-rate pilot's 3e-4, one run per arm and seed.

    python scripts/real_lr_study.py power                              # the seeds the power calculation gives
    python scripts/real_lr_study.py init                               # config.json and start.json
    python scripts/real_lr_study.py run ARM SEED --runs runs/lr-study  # train (resumes), test, keep the record
    python -m capo_trl.harness.confirmatory report --into docs/results/smollm2-lr-study

Arms, steps, test and record are the pilot's and the first study's (``real_lr.ARMS``, ``real_study.run_one``);
only the seeds are new (200 onwards: the pilot's 100-102 chose the learning rate). The analysis is the
protocol's plan, ``capo_trl.harness.confirmatory.PLANS["smollm2-lr-study"]``, from the committed records only.
"""

from __future__ import annotations

import json
import statistics
import sys

import real_lr
import real_study
from real_pilot import ROOT

from capo_trl.harness.confirmatory import PLANS
from capo_trl.harness.paired import t_power

OUT = ROOT / "docs" / "results" / "smollm2-lr-study"
PLAN = PLANS["smollm2-lr-study"]
ARMS = real_lr.ARMS
assert list(ARMS) == list(PLAN.arms), "the runner's arms are the plan's, in its order"
SEEDS = list(range(200, 200 + PLAN.max_seeds))
EFFECT, POWER, MIN_SEEDS, MAX_SEEDS = 0.05, 0.8, 12, 24


def power() -> dict:
    """The protocol's power calculation: the SD of the pilot's per-seed differences in end pooled AUROC (CAPO
    without the mask minus GRPO, seeds 100-102), or sqrt(2) times the SD of GRPO's own, whichever is larger; the
    fewest seeds (at least 12, at most 24) giving the paired t test (two-sided, alpha 0.05) power 0.8 for a true
    difference of 0.05."""
    auroc = {arm: [json.loads((real_lr.OUT / arm / f"seed{s}.json").read_text())["auroc"] for s in real_lr.SEEDS]
             for arm in ARMS}
    diffs = [c - g for g, c in zip(auroc[real_lr.GRPO], auroc[real_lr.CAPO])]
    sd_diff = max(statistics.stdev(diffs), statistics.stdev(auroc[real_lr.GRPO]) * 2 ** 0.5)
    table = {n: t_power(EFFECT, sd_diff, n) for n in range(MIN_SEEDS, MAX_SEEDS + 1)}
    seeds = next((n for n, p in table.items() if p >= POWER), MAX_SEEDS)
    return {"pilot_aurocs": auroc, "pilot_diffs": diffs, "sd_diff": sd_diff, "effect": EFFECT, "seeds": seeds,
            "power": table[seeds], "power_if_sd_doubles": t_power(EFFECT, 2 * sd_diff, seeds)}


def main(argv: list[str]) -> int:
    return real_study.cli(argv, __doc__, OUT, ARMS, PLAN, SEEDS, real_lr.LOG, power, "runs/lr-study")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
