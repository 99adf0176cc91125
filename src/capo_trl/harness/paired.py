"""Paired comparisons of two methods over the same seeds, one implementation for every study: scipy's t
interval and test, scipy's sign-flip permutation test, and Holm's correction (which scipy lacks)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

EXACT_SIGN_FLIPS = 17  # up to 2^17 sign patterns are enumerated; beyond, RESAMPLES random ones (seed 0)
RESAMPLES = 200_000


ALTERNATIVES = ("two-sided", "greater", "less")  # scipy's names: greater = the first arm above the second


def paired_interval(diffs, confidence: float = 0.95, alternative: str = "two-sided") -> tuple[float, float, float]:
    """Mean of paired differences (one per seed) and scipy's t interval of it (two-sided, or one-sided with an
    infinite bound); NaN bounds with fewer than two differences (no spread to measure)."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), math.nan, math.nan
    interval = stats.ttest_1samp(d, 0.0, alternative=alternative).confidence_interval(confidence)
    return float(d.mean()), float(interval.low), float(interval.high)


def sign_flip_p(diffs, alternative: str = "two-sided") -> float:
    """Sign-flip permutation p of the mean difference (two-sided, or one-sided as scipy's ``alternative``): exact (all 2^n sign patterns) up to
    ``EXACT_SIGN_FLIPS`` differences, else ``RESAMPLES`` random patterns from a fixed seed, so it reproduces."""
    d = np.asarray(diffs, dtype=float)
    resamples = np.inf if d.size <= EXACT_SIGN_FLIPS else RESAMPLES
    return float(stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                        permutation_type="samples", n_resamples=resamples, alternative=alternative,
                                        random_state=np.random.default_rng(0)).pvalue)


def paired_test(diffs, confidence: float = 0.95, flip: bool = True, alternative: str = "two-sided") -> dict:
    """Everything a study reports of one paired contrast: mean, t interval at ``confidence``, paired t p,
    sign-flip p (NaN unless ``flip``: it costs a second per contrast beyond 17 seeds), the sd of the differences
    and how many favour the first arm; ``alternative`` makes the interval, p and sign-flip p one-sided."""
    d = np.asarray(diffs, dtype=float)
    mean, low, high = paired_interval(d, confidence, alternative)
    p = float(stats.ttest_1samp(d, 0.0, alternative=alternative).pvalue) if d.size >= 2 else math.nan
    return {"n": int(d.size), "mean": mean, "low": low, "high": high, "confidence": confidence, "p": p,
            "alternative": alternative, "flip_p": sign_flip_p(d, alternative) if flip and d.size else math.nan, "sd": float(d.std(ddof=1)) if d.size >= 2 else math.nan,
            "favour": int((d > 0).sum())}


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values (each the running maximum of ``(m - rank) * p``, capped at 1)."""
    ordered, running, out = sorted(pvalues, key=pvalues.get), 0.0, {}
    for rank, name in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - rank) * pvalues[name]))
        out[name] = running
    return out


def t_power(effect: float, sd: float, n: int, alpha: float = 0.05, one_sided: bool = False) -> float:
    """Power of the paired t test with ``n`` pairs for a true mean difference ``effect`` (noncentral t): two-sided,
    or one-sided in the effect's direction."""
    shift = effect / sd * n ** 0.5
    if one_sided:
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, n - 1), n - 1, shift))
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    return float(stats.nct.sf(crit, n - 1, shift) + stats.nct.cdf(-crit, n - 1, shift))
