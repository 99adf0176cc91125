"""Paired comparisons of two methods over the same seeds: one interval for every study (scipy's t interval)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def paired_interval(diffs, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences (one per seed) and scipy's two-sided t interval of it; NaN bounds
    with fewer than two differences (no spread to measure)."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, math.nan
    interval = stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return float(d.mean()), float(interval.low), float(interval.high)
