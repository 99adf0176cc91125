"""Shared by the evaluation, callback and CLI tests: real MATH-500 rows and a transparent grader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

PNG = b"\x89PNG\r\n\x1a\n"
SHARED_MATH500 = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "math500.jsonl"
SAMPLE_MATH500 = Path(__file__).resolve().parent / "data" / "math500_sample.jsonl"  # its 10 shortest rows


def math500_file() -> Path:
    """The shared MATH-500 copy when present, else the sample shipped with the tests."""
    return SHARED_MATH500 if SHARED_MATH500.is_file() else SAMPLE_MATH500


def shortest_math500(k: int = 5) -> list[dict]:
    """The k shortest MATH-500 problems (the same rows from either file): short prompts keep a
    character-level tiny model inside its context."""
    rows = [json.loads(line) for line in math500_file().read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: len(r["problem"]))[:k]


class DigitGrader:
    """Grader protocol of ``evaluate`` with rules a test can recompute by hand: the extracted
    answer is the first digit of the completion; it is right when it equals the gold digit."""

    def __init__(self):
        self.calls = 0

    def extract(self, texts):
        return [m.group(0) if (m := re.search(r"\d", t)) else None for t in texts]

    def grade(self, texts, golds):
        self.calls += 1
        return [float(a == str(g)) for a, g in zip(self.extract(texts), golds)]

    def equivalent(self, a, b):
        return a == b


@pytest.fixture(scope="module", autouse=False)
def one_torch_thread():
    """One intra-op thread for this module: on a loaded 2-core machine OpenMP's spinning threads
    make the tiny model's matmuls ~100x slower. Restored afterwards for other modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
