"""What the real model's screening pilot found of the paper's settings, in words: the clause the README's first
screen, the recommendation block and ``capo-trl demo`` print beside the confirmatory studies (whose words, the
study of the pilot's pick among them, are :mod:`results_evidence`'s).

The pilot is exploratory (three seeds, a decision rule, no test), so its words give means and drift counts, never a
verdict. The demo runs without docs/results/, so its numbers are kept here (:data:`SCREEN_RESULT`, rounded as
printed); :func:`measure_screen` computes the same dict from the pilot's committed files and ``tests/test_tasks.py``
checks the two are equal.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capo_trl.harness.study import Study

# The pilot's arm that runs the recommended configuration (CAPOConfig's defaults, the paper's settings), and the
# same without the noise mask: the two the words name.
PAPER_ARM, NOMASK_ARM = "capo-paper", "capo-paper-nomask"
KEYS = ("auroc", "auroc_question", "accuracy")
# The screening pilot at its look (every run finished), as measure_screen() gives it; None before it.
SCREEN_RESULT: dict | None = {
    "seeds": 3, "rate": "1e-3", "pick": "capo-paper",
    "reference": {"auroc": 0.753, "auroc_question": 0.647, "accuracy": 0.46},
    "arms": {"capo-paper": {"auroc": 0.757, "auroc_question": 0.685, "accuracy": 0.48, "drifted": 0},
             "capo-paper-nomask": {"auroc": 0.548, "auroc_question": 0.593, "accuracy": 0.296, "drifted": 3},
             "capo-paper-answer": {"auroc": 0.726, "auroc_question": 0.624, "accuracy": 0.426, "drifted": 0},
             "capo-preset-answer": {"auroc": 0.724, "auroc_question": 0.694, "accuracy": 0.465, "drifted": 0}}}


def measure_screen(study: Study) -> dict | None:
    """The pilot's decision and each candidate's means (:data:`KEYS`) and drifted runs, rounded as printed; None
    until every run has finished (its look)."""
    import numpy as np

    from capo_trl.harness.study_report import _value, records, screen

    runs = records(study)
    if any(len(runs[arm]) < len(study.seeds) for arm in study.arms):
        return None
    found = screen(study, runs)
    ref = study.decision["reference"]

    def means(arm: str) -> dict:
        return {k: round(float(np.mean([_value(runs[arm][s].get(k), study) for s in study.seeds])), 3) for k in KEYS}
    return {"seeds": len(study.seeds), "rate": f"{study.arms[PAPER_ARM].overrides['learning_rate']:.0e}"
            .replace("e-0", "e-"), "pick": found["pick"], "reference": means(ref),
            "arms": {arm: {**means(arm), "drifted": a["drifted_runs"]} for arm, a in found["arms"].items()}}


def _drift(n: int, of: int) -> str:
    return "no run drifted" if n == 0 else f"{n} of {of} runs drifted"


def screen_words(r: dict | None, then: str, looked: bool = False) -> str:
    """The paper's settings in the pilot, as a clause: means against GRPO's, drift, and what the pilot picked for
    the confirmatory study at ``then`` (a learning rate; ``looked``: that study has had its look, said beside);
    before the pilot's look, that it runs."""
    if r is None:
        return "the paper's settings are in an exploratory screen on it (no result yet)"
    p, g, n = r["arms"][PAPER_ARM], r["reference"], r["seeds"]
    pick = r["pick"]
    picked = ("picked by the screen for the confirmatory study at " if pick == PAPER_ARM and looked
              else "picked by the screen, now in a confirmatory study at " if pick == PAPER_ARM
              else f"the screen picked `{pick}` for a confirmatory study at " if pick
              else "no setting the screen ran qualified for a confirmatory study at ")
    return (f"the paper's settings, in an exploratory screen ({n} seeds, learning rate {r['rate']}): "
            f"{_drift(p['drifted'], n)} into answers that never end ({r['arms'][NOMASK_ARM]['drifted']} of {n} "
            f"without the noise mask), pooled AUROC {p['auroc']:.3f} against GRPO's {g['auroc']:.3f}, per-question "
            f"AUROC {p['auroc_question']:.3f} against {g['auroc_question']:.3f}, accuracy {100 * p['accuracy']:.1f}% "
            f"against {100 * g['accuracy']:.1f}%; {picked}{then}{' (no result yet)' if pick and pick != PAPER_ARM else ''}")


# Each candidate the pilot may pick, in words (its arm in the pick's study is this name with "-lr3e-4").
PICK_LABELS = {"capo-paper": "CAPO with the paper's settings",
               "capo-paper-nomask": "CAPO with the paper's settings but no noise mask",
               "capo-paper-answer": "CAPO with the paper's tau and scale, scoring the answer's own tokens, no mask",
               "capo-preset-answer": "CAPO with the embedded preset, scoring the answer's own tokens"}


def screen_paragraph(r: dict | None, then: str, looked: bool = False) -> str:
    """:func:`screen_words` as the paragraph ``capo-trl demo`` prints after the real model's studies."""
    return textwrap.fill(f"On the same model and task, {screen_words(r, then, looked)}.", width=110,
                         break_on_hyphens=False, break_long_words=False) + "\n"


__all__ = ["NOMASK_ARM", "PAPER_ARM", "PICK_LABELS", "SCREEN_RESULT", "measure_screen", "screen_paragraph",
           "screen_words"]
