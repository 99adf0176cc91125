"""Selective answering's guarantee by simulation: failure rate of the threshold, coverage of the interval.

    python scripts/selective_check.py [--reps 400] [--no_groups]

A failure is a threshold whose true precision on new questions is below the target (0.9, at 95%
confidence: nominal failure rate <= 5%). Data: the grouped model of tests/test_confidence.py (40%
easy questions with accuracy ~ Beta(1.76, 0.24), mean 0.88, the rest U(0, 0.5) and lower scores; a
question's samples share its score level, so the truth is flat and every accepted threshold fails),
at m questions x n samples, through ``Calibrator.fit(method).fit_threshold``; independent samples
whose top 40% are flat at P = 0.895 (isotonic); the same grouped model with easy questions right 97%
of the time (the target can be met: coverage is the power); and the coverage of the 95% interval of
``selective_report`` at a cut that answers the easy questions (truth 0.88).

Runs against any version of capo_trl: where ``fit_threshold`` takes no ``groups`` (or with
``--no_groups``) it is called without them, and where the threshold is on P(correct) the cut on s
is read off the map.
"""

import argparse
import inspect
import math

import numpy as np

from capo_trl.evaluation.confidence import Calibrator, selective_report
from capo_trl.testing.selective_sim import grouped, grouped_precision  # the tests' model, one definition

GRID = np.linspace(-2.2, 0.2, 24001)


def score_cut(cal, sel):
    """The lowest s answered: the threshold itself when it is on s, else read off the map."""
    if not math.isfinite(sel.threshold):
        return math.inf
    if getattr(sel, "on", "probability") == "score":
        return sel.threshold
    answered = cal.predict(GRID) >= sel.threshold
    return GRID[np.argmax(answered)] if answered.any() else math.inf


def fit(s, y, g, method, grouped_bound):
    cal = Calibrator.fit(s, y, method)
    sel = cal.fit_threshold(s, y, 0.9, 0.95, groups=g) if grouped_bound else cal.fit_threshold(s, y, 0.9, 0.95)
    return score_cut(cal, sel), sel.coverage


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--no_groups", action="store_true", help="call without groups= even where it is accepted")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    use_groups = "groups" in inspect.signature(Calibrator.fit_threshold).parameters and not args.no_groups
    report_groups = "groups" in inspect.signature(selective_report).parameters and not args.no_groups
    print(f"groups passed: {use_groups}; {args.reps} repetitions; target 0.9 at 95%")
    for m, n in ((1000, 1), (125, 8), (250, 8)):
        for method in ("platt", "isotonic"):
            rng = np.random.default_rng(11)
            fails = sum(grouped_precision(c) < 0.9 for c in (fit(*grouped(m, n, rng), method, use_groups)[0]
                                                             for _ in range(args.reps)) if math.isfinite(c))
            print(f"failure rate, grouped model {m} x {n}, {method}: {fails / args.reps:.3f}")
    rng = np.random.default_rng(12)
    fails = 0
    for _ in range(args.reps):
        s = rng.uniform(-2, 0, 1000)
        y = (rng.random(1000) < np.where(s >= -0.8, 0.895, 0.3)).astype(int)
        fails += math.isfinite(fit(s, y, np.arange(1000), "isotonic", use_groups)[0])
    print(f"failure rate, independent 1000 x 1, top 40% flat at 0.895, isotonic: {fails / args.reps:.3f}")
    rng = np.random.default_rng(13)
    runs = [fit(*grouped(250, 8, rng, easy=(9.7, 0.3)), "platt", use_groups) for _ in range(args.reps)]
    fails = sum(math.isfinite(c) and grouped_precision(c, 0.97) < 0.9 for c, _ in runs)
    print(f"target reachable (easy 0.97), 250 x 8, platt: failure rate {fails / args.reps:.3f}, median coverage "
          f"{np.median([cov for _, cov in runs]):.3f} (at most 0.4)")
    for m, n in ((1000, 1), (125, 8)):
        rng = np.random.default_rng(14)
        covered = 0
        for _ in range(args.reps):
            s, y, g = grouped(m, n, rng)
            r = selective_report(-0.45, s, y, 0.95, groups=g) if report_groups else selective_report(-0.45, s, y, 0.95)
            covered += r["precision_ci_low"] <= grouped_precision(-0.45) <= r["precision_ci_high"]
        print(f"95% interval coverage, grouped model {m} x {n}: {covered / args.reps:.3f}")


if __name__ == "__main__":
    main()
