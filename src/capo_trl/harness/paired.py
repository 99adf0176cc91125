"""Paired comparisons of two methods over the same seeds, one implementation for every study: scipy's t
interval and test, scipy's sign-flip permutation test, and Holm's correction (which scipy lacks)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

EXACT_SIGN_FLIPS = 17  # up to 2^17 sign patterns are enumerated; beyond, RESAMPLES random ones (seed 0)
RESAMPLES = 200_000


def paired_interval(diffs, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences (one per seed) and scipy's two-sided t interval of it; NaN bounds
    with fewer than two differences (no spread to measure)."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, math.nan
    interval = stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return float(d.mean()), float(interval.low), float(interval.high)


def sign_flip_p(diffs) -> float:
    """Two-sided sign-flip permutation p of the mean difference: exact (all 2^n sign patterns) up to
    ``EXACT_SIGN_FLIPS`` differences, else ``RESAMPLES`` random patterns from a fixed seed, so it reproduces."""
    d = np.asarray(diffs, dtype=float)
    resamples = np.inf if d.size <= EXACT_SIGN_FLIPS else RESAMPLES
    return float(stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                        permutation_type="samples", n_resamples=resamples,
                                        random_state=np.random.default_rng(0)).pvalue)


def paired_test(diffs, confidence: float = 0.95, flip: bool = True) -> dict:
    """Everything a study reports of one paired contrast: mean, t interval at ``confidence``, paired t p,
    sign-flip p (NaN unless ``flip``: it costs a second per contrast beyond 17 seeds), the sd of the differences
    and how many favour the first arm."""
    d = np.asarray(diffs, dtype=float)
    mean, low, high = paired_interval(d, confidence)
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if d.size >= 2 else math.nan
    return {"n": int(d.size), "mean": mean, "low": low, "high": high, "confidence": confidence, "p": p,
            "flip_p": sign_flip_p(d) if flip and d.size else math.nan, "sd": float(d.std(ddof=1)) if d.size >= 2 else math.nan,
            "favour": int((d > 0).sum())}


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (each the running maximum of ``(m - rank) * p``, capped at 1)."""
    ordered, running, out = sorted(pvalues, key=pvalues.get), 0.0, {}
    for rank, name in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - rank) * pvalues[name]))
        out[name] = running
    return out


def t_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test with ``n`` pairs for a true mean difference ``effect`` (noncentral t)."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    shift = effect / sd * n ** 0.5
    return float(stats.nct.sf(crit, n - 1, shift) + stats.nct.cdf(-crit, n - 1, shift))
