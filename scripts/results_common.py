"""What the results renderers share (scripts/results_tables.py, scripts/results_real.py): the paths, a study's file
and the table."""

from __future__ import annotations

import functools
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


@functools.cache
def study(name: str):
    """The study in docs/results/<name>/ (its study.yaml, read and checked once per run of a renderer)."""
    from capo_trl.harness.study import load_study

    return load_study(RESULTS / name)


def summary(path: str) -> dict:
    return json.loads((RESULTS / path).read_text())


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body]) + "\n"
