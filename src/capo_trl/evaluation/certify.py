"""How many calibration questions certify a target precision: a simulation, and the table it made.

Why: a question-level bound (:mod:`capo_trl.selective`) needs tens to thousands of questions, and
"always abstain" alone does not say how far off a run was. :func:`questions_needed` simulates
calibration splits of m questions x n samples, each question right at its own rate (a Beta draw
around the answered precision r: samples of one question are correlated), every sample answered,
and finds the smallest m on a grid at which :func:`~capo_trl.selective.select_threshold` certifies
in at least half the seeds. ``scripts/certify_questions.py`` writes the table (:data:`TABLE_FILE`)
and its copy in docs/evaluation.md; ``capo-trl eval`` quotes it when nothing is certified.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

TABLE_FILE = Path(__file__).resolve().parents[1] / "assets" / "certify_questions.json"
GRID = [2 ** (k / 2) for k in range(6, 27)]  # 8 .. 8192 questions, steps of sqrt(2)


def questions_needed(target: float, answered_precision: float, *, samples: int = 8, confidence: float = 0.95,
                     seeds: int = 10, concentration: float = 2.0) -> int | None:
    """The smallest m on :data:`GRID` whose simulated splits are certified in >= half of ``seeds``; None past it."""
    import numpy as np

    from .selective import select_threshold

    r = answered_precision
    for m in sorted({round(g) for g in GRID}):
        certified = 0
        for seed in range(seeds):
            rng = np.random.default_rng([seed, m, round(target * 1e4), round(r * 1e4)])
            rate = np.ones(m) if r >= 1 else rng.beta(concentration * r, concentration * (1 - r), size=m)
            correct = (rng.random((m, samples)) < rate[:, None]).ravel().astype(float)
            groups = np.repeat(np.arange(m), samples)
            sel = select_threshold(np.zeros(m * samples), correct, target, confidence, groups=groups)
            certified += math.isfinite(sel.threshold)
        if certified * 2 >= seeds:
            return m
    return None


def load_table(path: Path = TABLE_FILE) -> dict:
    """The committed table: settings and rows ``{target, answered_precision, questions}`` (questions None: > grid)."""
    return json.loads(Path(path).read_text())


CASES = {"all right": lambda target: 1.0, "halfway": lambda target: (1 + target) / 2}  # answered precision


def _cell(questions: int | None) -> str:
    return str(questions) if questions is not None else f"over {round(GRID[-1])}"


def render_markdown(table: dict) -> str:
    """The table as docs/evaluation.md shows it."""
    lines = ["| target precision | answered samples all right | answered samples right halfway from the target to 1 |",
             "|---|---|---|"]
    for target in sorted({row["target"] for row in table["rows"]}):
        cells = {row["case"]: row for row in table["rows"] if row["target"] == target}
        half = cells["halfway"]
        lines.append(f"| {target:g} | {_cell(cells['all right']['questions'])} | {_cell(half['questions'])} "
                     f"(right {half['answered_precision']:g}) |")
    return "\n".join(lines)


def advice(target: float, n_questions: int, table: dict | None = None) -> str:
    """What would certify ``target``: the table's row at or above it, in one clause for the CLI."""
    table = table or load_table()
    targets = sorted({row["target"] for row in table["rows"]})
    row_target = next((t for t in targets if t >= target - 1e-12), None)
    if row_target is None:
        return (f"precision >= {target} needs more calibration questions than the table's highest target "
                f"({targets[-1]:g}) does (docs/evaluation.md)")
    cells = {row["case"]: row for row in table["rows"] if row["target"] == row_target}
    half = cells["halfway"]
    return (f"certifying precision >= {row_target:g} at 95% confidence takes about "
            f"{_cell(cells['all right']['questions'])} calibration questions whose answered samples are all right, "
            f"{_cell(half['questions'])} if they are right {half['answered_precision']:g} of the time (simulated, "
            f"every question answered: docs/evaluation.md); this split had {n_questions}: give more with "
            "--calibrate_limit or a larger --calibrate_on split, or lower --target_precision")
