"""Abstention thresholds whose precision guarantee holds when samples come in groups (n per question).

The promise: on new questions from the same distribution, the answered samples' precision (right
answers / answered samples) is >= the target with probability >= ``confidence``. A question's
samples are correlated (an easy question is answered right by most of its samples), so with n
samples per question a bound that counts samples as independent is too narrow. With ``groups``
(scikit-learn's name: the question of each sample) the bound is at the question level.

Question-level bound: for a cut and a precision q, question i contributes
``x_i = (K_i - q N_i) / n_max + q`` in [0, 1] (``N_i`` answered samples, ``K_i`` right ones,
``n_max`` the largest group), and precision >= q on the population of questions is exactly
``E[x] >= q``. Questions are independent, so this is a test of a bounded mean on independent
variables: the betting test of Waudby-Smith & Ramdas (JRSS-B 2024). Its capital
``prod_i (1 + lambda_i (x_i - q))`` with bets ``lambda_i`` fixed before question i is seen is a
nonnegative supermartingale when the mean is <= q, so by Ville's inequality it reaches
``1 / alpha`` with probability <= alpha: a finite-sample guarantee with no normal approximation,
adapting to the spread of the ``x_i``. A question with no answered sample has ``x_i = q`` and
leaves the capital unchanged. The price of a real guarantee: nothing in m questions rules out a
few percent of questions being confidently and entirely wrong, so certifying a precision needs
tens of answered questions, whatever the number of samples each.

Without groups the samples are taken as independent (one-sided Clopper-Pearson, exact then); the
result says so in ``bound``. Groups of one sample each are that case too. Either way the cut must
be on a value not fitted to the same labels (``Calibrator.fit_threshold`` cuts on the raw score ``s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

INDEPENDENT = "samples (Clopper-Pearson; assumes independent samples: pass groups= when a question has several)"
QUESTIONS = "questions (betting test on per-question sums; assumes independent questions)"
ONE_EACH = "questions, one sample each (Clopper-Pearson; assumes independent questions)"
_BET_CAP = 0.9  # bets stay below 0.9 / q, so one question can lose at most 90% of the capital
_GRID = np.linspace(0.0005, 0.9995, 1000)  # precisions q the interval is read off


@dataclass
class Selective:
    """Answer only where the value is >= ``threshold`` (``inf``: the target cannot be met).

    ``on``: what ``threshold`` cuts: ``"score"`` (the raw s, from ``Calibrator.fit_threshold``) or
    ``"probability"`` (the calibrated P(correct): :func:`select_threshold` on given values, and
    files saved before cuts were made on the score). ``probability``: the lowest calibrated
    P(correct) among the answered calibration samples. ``bound``: what the bound treats as
    independent (:data:`QUESTIONS` or :data:`INDEPENDENT`).
    """

    threshold: float
    target_precision: float
    confidence: float
    coverage: float  # on the calibration split
    precision: float  # on the calibration split, of the answered samples
    precision_lower: float  # its one-sided lower bound at ``confidence``
    n: int
    n_questions: int = 0  # questions with an answered sample (0 without groups)
    bound: str = INDEPENDENT
    on: str = "probability"
    probability: float = float("nan")


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact binomial interval for k successes in n, at ``confidence``."""
    from scipy.stats import beta

    a = 1 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return low, high


def _check(values, correct, groups, target_precision=None, confidence=0.95):
    if target_precision is not None and not 0 < target_precision < 1:
        raise UsageError(f"target_precision must be in (0, 1), got {target_precision!r}.")
    if not 0 < confidence < 1:
        raise UsageError(f"confidence must be in (0, 1), got {confidence!r}.")
    v = np.asarray(values, dtype=float).ravel()
    y = np.asarray(correct, dtype=float).ravel()
    if v.shape != y.shape:
        raise UsageError(f"got {v.size} values but {y.size} correctness labels.")
    if not np.all(np.isfinite(v)):
        raise UsageError(f"values must be finite numbers; {int((~np.isfinite(v)).sum())} of {v.size} are not.")
    if not np.all((y == 0) | (y == 1)):
        raise UsageError("correct must be 0/1 (or booleans); ungraded samples must be left out first.")
    if groups is None:
        return v, y, None
    g = np.asarray(groups).ravel()
    if g.shape != v.shape:
        raise UsageError(f"groups must name the question of each sample: got {g.size} for {v.size} samples.")
    codes = np.unique(g, return_inverse=True)[1]
    return v, y, (None if np.bincount(codes).max(initial=1) == 1 else codes)  # one each: samples are questions


def _question_sums(answered: np.ndarray, y: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per question (rows) and cut (columns): answered samples N and right answered samples K."""
    m = int(codes.max()) + 1
    N, K = np.zeros((m, answered.shape[1])), np.zeros((m, answered.shape[1]))
    np.add.at(N, codes, answered)
    np.add.at(K, codes, answered * y[:, None])
    return N, K


def _bet_rejects(x: np.ndarray, q, alpha: float, used: np.ndarray) -> np.ndarray:
    """Per column of ``x`` (questions x tests, values in [0, 1]): does the betting test reject E[x] <= q?

    Rows are questions in a fixed random order (:func:`_in_order`). Rows not ``used`` (no answered
    sample: x = q) change nothing; the others bet ``lambda = min(sqrt(2 log(1/alpha) / (m sigma^2)), 0.9 / q)``,
    m the number of such rows and sigma^2 the running variance of the earlier ones (the plug-in
    bet of Waudby-Smith & Ramdas for a fixed sample size), fixed before the row is seen.
    """
    q = np.broadcast_to(np.asarray(q, dtype=float), x.shape[1:])
    used = np.broadcast_to(used, x.shape)
    seen = np.cumsum(used, axis=0)
    total = np.maximum(seen[-1], 1)
    sums = np.cumsum(np.where(used, x, 0.0), axis=0)
    before, seen_before = sums - np.where(used, x, 0.0), seen - used
    mean_before = (0.5 + before) / (seen_before + 1)  # running mean of the earlier questions
    sq = np.cumsum(np.where(used, (x - mean_before) ** 2, 0.0), axis=0)
    var_before = (0.25 + sq - np.where(used, (x - mean_before) ** 2, 0.0)) / (seen_before + 1)
    bet = np.minimum(np.sqrt(2 * math.log(1 / alpha) / (total * var_before)), _BET_CAP / q)
    log_capital = np.cumsum(np.where(used, np.log1p(bet * (x - q)), 0.0), axis=0)
    return log_capital.max(axis=0) >= math.log(1 / alpha)


def _in_order(N: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Questions in one fixed random order (the bets depend on it, the guarantee does not)."""
    order = np.random.default_rng(0).permutation(N.shape[0])
    return N[order], K[order]


def _question_lower(N: np.ndarray, K: np.ndarray, n_max: float, alpha: float) -> float:
    """One-sided lower bound on precision: the largest grid q with every q' <= q rejected at alpha."""
    if N.sum() == 0:
        return float("nan")
    N, K = _in_order(N, K)
    N, K = N[N > 0], K[N > 0]  # the others change no capital: the same test, less work
    x = (K[:, None] - _GRID * N[:, None]) / n_max + _GRID
    rejected = _bet_rejects(x, _GRID, alpha, N[:, None] > 0)
    first_kept = int(np.argmin(rejected)) if not rejected.all() else rejected.size
    return 0.0 if first_kept == 0 else float(_GRID[first_kept - 1])


def _question_upper(N: np.ndarray, K: np.ndarray, n_max: float, alpha: float) -> float:
    """Its mirror image: the smallest grid q with every q' >= q rejected (precision >= q' tested)."""
    if N.sum() == 0:
        return float("nan")
    N, K = _in_order(N, K)
    N, K = N[N > 0], K[N > 0]
    x = (_GRID * N[:, None] - K[:, None]) / n_max + (1 - _GRID)  # E[x] <= 1 - q  <=>  precision >= q
    rejected = _bet_rejects(x, 1 - _GRID, alpha, N[:, None] > 0)[::-1]
    first_kept = int(np.argmin(rejected)) if not rejected.all() else rejected.size
    return 1.0 if first_kept == 0 else float(_GRID[::-1][first_kept - 1])


def select_threshold(values, correct, target_precision: float, confidence: float = 0.95, groups=None) -> Selective:
    """The lowest threshold on ``values`` whose answered set has precision >= target with ``confidence``.

    Candidate thresholds answer 2.5%, 5%, ... 100% of the samples (cut at distinct values, so the
    candidates depend on ``values`` only, never on the labels), tried from the highest down; each
    is accepted when its test rejects "precision < target" at ``1 - confidence``, and the scan
    stops at the first that fails (fixed-sequence testing: no multiplicity correction needed).
    The scan starts where a test can pass at all with some room (a perfect answered set would
    carry 1.5 times the evidence needed; without groups: n right of n clears the target, and 5% of
    the samples), which depends on the values and groups only. With ``groups`` each test is the
    question-level betting test (module docstring), else one-sided Clopper-Pearson on samples.
    ``values`` must not be fitted on these labels (e.g. pass the raw score): a map fitted here,
    isotonic above all, would move the cuts to where this sample happens to look good. The cuts
    are quantiles of these values and each test treats its cut as fixed; the simulations in
    ``tests/test_confidence.py`` check the whole procedure.
    None accepted: ``threshold = inf``, coverage 0.
    """
    v, y, codes = _check(values, correct, groups, target_precision, confidence)
    alpha, t = 1 - confidence, target_precision
    order = np.argsort(-v, kind="stable")
    v, y = v[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(v) != 0), v.size - 1]  # last index of each distinct value
    wanted = np.ceil(np.arange(1, 41) / 40 * v.size)
    if codes is None:  # the first test answers at least this many samples
        wanted = np.clip(wanted, max(math.ceil(math.log(alpha) / math.log(t)), math.ceil(v.size / 20)), v.size)
    tested = np.unique(np.searchsorted(last + 1, np.unique(wanted.astype(int))))  # first cut answering >= each level
    answers = last[tested] + 1  # samples answered at each tested cut
    if codes is None:
        from scipy.stats import beta

        hits = np.cumsum(y)[answers - 1]
        possible = np.ones(answers.size, dtype=bool)
        lower = np.where(hits > 0, beta.ppf(alpha, np.maximum(hits, 1), answers - hits + 1), 0.0)
        ok, questions = lower >= t, (answers if groups is not None else np.zeros(answers.size, dtype=int))
    else:
        codes = codes[order]
        N, K = _question_sums(np.arange(v.size)[:, None] < answers[None, :], y, codes)
        n_max = float(np.bincount(codes).max())
        best = np.log1p(_BET_CAP * (1 - t) / t * N / n_max).sum(axis=0)  # log-capital if every answer were right
        possible = best >= 1.5 * math.log(1 / alpha)
        ok, questions = np.zeros(answers.size, dtype=bool), (N > 0).sum(axis=0)
        if possible.any():
            Nq, Kq = _in_order(N[:, possible], K[:, possible])
            ok[possible] = _bet_rejects((Kq - t * Nq) / n_max + t, t, alpha, Nq > 0)
    cols = np.flatnonzero(possible)
    ok = ok[cols]
    stop = int(np.argmin(ok)) if not ok.all() else ok.size  # the first failure ends the sequence
    bound = QUESTIONS if codes is not None else INDEPENDENT if groups is None else ONE_EACH
    if stop == 0:
        return Selective(math.inf, t, confidence, 0.0, math.nan, math.nan, int(v.size), 0, bound)
    j = cols[stop - 1]
    low = float(lower[j]) if codes is None else _question_lower(N[:, j], K[:, j], n_max, alpha)
    k = float(y[:answers[j]].sum())
    return Selective(float(v[last[tested[j]]]), t, confidence, float(answers[j] / v.size), float(k / answers[j]), low,
                     int(v.size), int(questions[j]), bound)


def selective_report(threshold: float, values, correct, confidence: float = 0.95, groups=None) -> dict:
    """Coverage, precision and its two-sided interval at ``confidence`` of answering where ``values >= threshold``.

    With ``groups`` the interval is the question-level betting interval (each side at
    ``(1 - confidence) / 2``), else Clopper-Pearson on samples; ``bound`` says which.
    """
    v, y, codes = _check(values, correct, groups, None, confidence)
    answered = v >= threshold
    n, k = int(answered.sum()), int(y[answered].sum())
    if not n:
        low = high = float("nan")
    elif codes is None:
        low, high = clopper_pearson(k, n, confidence)
    else:
        N, K = (a[:, 0] for a in _question_sums(answered[:, None], y, codes))
        n_max, a = float(np.bincount(codes).max()), (1 - confidence) / 2
        low, high = _question_lower(N, K, n_max, a), _question_upper(N, K, n_max, a)
    if codes is not None:
        questions = int(np.unique(codes[answered]).size)
    else:
        questions = n if groups is not None else 0
    return {"coverage": n / v.size if v.size else float("nan"), "precision": k / n if n else float("nan"),
            "precision_ci_low": low, "precision_ci_high": high, "n_answered": n, "n_questions": questions,
            "bound": QUESTIONS if codes is not None else INDEPENDENT if groups is None else ONE_EACH}


__all__ = ["INDEPENDENT", "ONE_EACH", "QUESTIONS", "Selective", "clopper_pearson", "select_threshold",
           "selective_report"]
