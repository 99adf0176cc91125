"""Calibration metrics: does the model's confidence rank and match its correctness?

Pure functions. Inputs are lists, numpy arrays or (CPU) torch tensors; outputs are floats,
tuples or small arrays. Definitions follow ``docs/evaluation.md`` exactly. Confidence is usually the
mean token log-prob ``s`` of a completion: any monotone transform ranks the same, so AUROC and
AURC accept it as is, while ECE and Brier need a probability in [0, 1] (use ``exp(s)``).

Undefined values (one class only, no data) are ``float('nan')``, never a silent 0.5 or 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import xlogy
from scipy.stats import rankdata
from sklearn.metrics import brier_score_loss, roc_auc_score

__all__ = ["auroc", "auroc_per_question", "auroc_per_draw", "ece", "reliability_bins", "ReliabilityBins", "brier",
           "precision_coverage", "aurc", "e_aurc", "pass_at_k", "mean_at_k"]


# ----------------------------------------------------------------------------- input handling
def _as_float_array(x: Any, name: str) -> np.ndarray:
    """1-D float64 copy of a list / array / torch tensor; None entries become NaN."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be numeric (list, numpy array or tensor): {err}") from None
    return arr.reshape(-1) if arr.ndim != 1 else arr


def _check_same_length(**arrays: np.ndarray) -> int:
    names = list(arrays)
    lengths = [len(a) for a in arrays.values()]
    if len(set(lengths)) > 1:
        got = ", ".join(f"{n}={k}" for n, k in zip(names, lengths))
        raise ValueError(f"{' and '.join(names)} must have the same length, got {got}")
    return lengths[0] if lengths else 0


def _as_correct(correct: np.ndarray) -> np.ndarray:
    """Validate binary correctness (0/1 or bool; NaN allowed and handled by the caller)."""
    finite = correct[~np.isnan(correct)]
    if finite.size and not np.all((finite == 0) | (finite == 1)):
        bad = np.unique(finite[(finite != 0) & (finite != 1)])[:5]
        raise ValueError(f"correct must be binary (0/1 or bool), got values such as {bad.tolist()}")
    return correct


def _prepare(confidence: Any, correct: Any, *extra: tuple[Any, str], name: str = "confidence"):
    """Arrays with NaN confidence/correctness rows removed (rows are dropped from extras too)."""
    conf = _as_float_array(confidence, name)
    corr = _as_correct(_as_float_array(correct, "correct"))
    others = [_as_list(x, n) for x, n in extra]
    named = {name: conf, "correct": corr, **{n: o for o, (_, n) in zip(others, extra)}}
    _check_same_length(**named)
    keep = ~(np.isnan(conf) | np.isnan(corr))
    if not keep.all():
        conf, corr = conf[keep], corr[keep]
        others = [[o[i] for i in np.flatnonzero(keep)] for o in others]
    return (conf, corr, *others)


def _as_list(x: Any, name: str) -> list:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    try:
        return list(x)
    except TypeError:
        raise TypeError(f"{name} must be a sequence") from None


def _group_codes(ids: list) -> tuple[np.ndarray, int]:
    """Integer code per element, in order of first appearance (works for any hashable id)."""
    codes: dict = {}
    gen = (codes.setdefault(q, len(codes)) for q in ids)
    out = np.fromiter(gen, dtype=np.int64, count=len(ids))
    return out, len(codes)


# -------------------------------------------------------------------------------------- AUROC
def auroc(confidence: Any, correct: Any) -> float:
    """ROC AUC of confidence vs binary correctness (ties count 1/2, i.e. Mann-Whitney).

    Why NaN and not 0.5 with one class: a batch where everything is right says nothing about
    ranking, and averaging a fake 0.5 in would pull every reported AUROC toward chance.
    Rows where either input is NaN are ignored; +-inf confidences (log-prob of -inf) are ranked.
    """
    conf, corr = _prepare(confidence, correct)
    if conf.size == 0 or corr.min() == corr.max():
        return float("nan")
    if not np.all(np.isfinite(conf)):
        conf = rankdata(conf)  # AUROC is rank-based; ranks keep ties and order of +-inf
    return float(roc_auc_score(corr.astype(np.int64), conf))


def _grouped_mann_whitney(conf: np.ndarray, corr: np.ndarray, codes: np.ndarray, n_groups: int):
    """Per-group AUROC by rank sums, vectorised over groups (NaN for single-class groups)."""
    order = np.lexsort((conf, codes))  # by group, then confidence
    g, c, y = codes[order], conf[order], corr[order]
    n = len(g)
    idx = np.arange(n)
    # start index of each group in sorted order -> 0-based position within the group
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    # tie runs: same group and same confidence -> average rank of the run
    new_run = new_group | np.r_[True, c[1:] != c[:-1]]
    run_id = np.cumsum(new_run) - 1
    run_first = idx[new_run]
    run_last = np.r_[run_first[1:], n] - 1
    avg_rank = (run_first + run_last) / 2.0 - group_start[run_first] + 1.0  # 1-based, per run
    ranks = avg_rank[run_id]
    n_pos = np.bincount(g, weights=y, minlength=n_groups)
    n_tot = np.bincount(g, minlength=n_groups).astype(np.float64)
    n_neg = n_tot - n_pos
    rank_sum_pos = np.bincount(g, weights=ranks * y, minlength=n_groups)
    usable = (n_pos > 0) & (n_neg > 0)
    out = np.full(n_groups, np.nan)
    u = rank_sum_pos[usable] - n_pos[usable] * (n_pos[usable] + 1) / 2.0
    out[usable] = u / (n_pos[usable] * n_neg[usable])
    return out


def auroc_per_question(confidence: Any, correct: Any, question_ids: Any) -> tuple[float, int]:
    """Mean within-question AUROC and the number of usable questions.

    Why per question: pooled AUROC mostly rewards telling easy problems from hard ones; within a
    question it measures whether confidence separates the model's own right and wrong answers,
    which is what CAPO trains. Questions with only right or only wrong samples are skipped;
    returns ``(nan, 0)`` when none is usable. Vectorised, cheap enough for every training step.
    """
    conf, corr, ids = _prepare(confidence, correct, (question_ids, "question_ids"))
    if conf.size == 0:
        return float("nan"), 0
    if not np.all(np.isfinite(conf)):
        conf = rankdata(conf)
    codes, n_groups = _group_codes(ids)
    per_group = _grouped_mann_whitney(conf, corr, codes, n_groups)
    usable = per_group[~np.isnan(per_group)]
    if usable.size == 0:
        return float("nan"), 0
    return float(usable.mean()), int(usable.size)


def auroc_per_draw(confidence: Any, correct: Any, question_ids: Any = None) -> tuple[float, int]:
    """AUROC pooled across problems for each draw index k, averaged over k; and the count of k used.

    Input is either 2-D ``[n_problems, k]`` arrays (column j = draw j), or 1-D with
    ``question_ids``, where the draw index of a sample is its order of appearance within its
    question. Why: with one completion per problem, each AUROC compares problems like a single-
    sample evaluation would, and averaging over draws reduces its variance. Draws with one class
    are skipped; ``(nan, 0)`` when none is usable.
    """
    if question_ids is None:
        conf2 = _as_2d(confidence, "confidence")
        corr2 = _as_2d(correct, "correct")
        if conf2.shape != corr2.shape:
            raise ValueError(f"confidence and correct must have the same shape, got {conf2.shape} and {corr2.shape}")
        n_problems, k = conf2.shape
        conf = conf2.reshape(-1)
        corr = corr2.reshape(-1)
        draws = np.tile(np.arange(k), n_problems)
    else:
        conf = _as_float_array(confidence, "confidence")
        corr = _as_float_array(correct, "correct")
        ids = _as_list(question_ids, "question_ids")
        _check_same_length(confidence=conf, correct=corr, question_ids=ids)
        codes, n_groups = _group_codes(ids)
        # draw index = running count of earlier samples with the same question
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        starts = np.searchsorted(sorted_codes, sorted_codes, side="left")
        draws = np.empty(len(codes), dtype=np.int64)
        draws[order] = np.arange(len(codes)) - starts
    values = []
    for j in np.unique(draws):
        sel = draws == j
        a = auroc(conf[sel], corr[sel])
        if not math.isnan(a):
            values.append(a)
    if not values:
        return float("nan"), 0
    return float(np.mean(values)), len(values)


def _as_2d(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_problems, k] when question_ids is not given")
    return arr


# ------------------------------------------------------------------------------ ECE and Brier
@dataclass(frozen=True)
class ReliabilityBins:
    """Per-bin edges (B + 1), counts, mean confidence and accuracy (NaN where a bin is empty);
    what ECE sums over and what a reliability diagram draws."""

    edges: np.ndarray
    count: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray


def _check_prob(p: np.ndarray, name: str = "confidence_prob") -> None:
    if p.size and (p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(f"{name} must lie in [0, 1] (use exp(mean log-prob)), got [{p.min()}, {p.max()}]")


def reliability_bins(
    confidence_prob: Any, correct: Any, n_bins: int = 10, strategy: str = "uniform"
) -> ReliabilityBins:
    """Bin samples by confidence: ``uniform`` bins are ``[k/B, (k+1)/B)`` with
    ``bin = min(floor(p*B), B-1)`` (p = 1 lands in the last bin); ``quantile`` bins have equal
    mass, with edges at the empirical quantiles and the same left-closed convention.
    Empty bins have count 0 and NaN confidence/accuracy."""
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    p, y = _prepare(confidence_prob, correct, name="confidence_prob")
    _check_prob(p)
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        idx = np.minimum(np.floor(p * n_bins).astype(np.int64), n_bins - 1)
    elif strategy == "quantile":
        levels = np.linspace(0.0, 1.0, n_bins + 1)
        edges = np.quantile(p, levels) if p.size else levels
        idx = np.clip(np.searchsorted(edges[1:-1], p, side="right"), 0, n_bins - 1)
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(idx, weights=p, minlength=n_bins) / count
        acc = np.bincount(idx, weights=y, minlength=n_bins) / count
    return ReliabilityBins(edges, count.astype(np.int64), conf, acc)


def ece(confidence_prob: Any, correct: Any, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Expected calibration error ``sum_b (n_b/n) |acc_b - conf_b|``; NaN with no samples.

    Why our own binning: scikit-learn's ``calibration_curve`` closes bins on the other edge, and
    docs/evaluation.md fixes ``bin = min(floor(p*B), B-1)`` so numbers match across the project.
    """
    bins = reliability_bins(confidence_prob, correct, n_bins, strategy)
    n = bins.count.sum()
    if n == 0:
        return float("nan")
    used = bins.count > 0
    gap = np.abs(bins.accuracy[used] - bins.confidence[used])
    return float(np.sum(bins.count[used] / n * gap))


def brier(confidence_prob: Any, correct: Any) -> float:
    """Brier score ``mean((p - y)^2)`` (scikit-learn); NaN with no samples."""
    p, y = _prepare(confidence_prob, correct, name="confidence_prob")
    _check_prob(p)
    if p.size == 0:
        return float("nan")
    return float(brier_score_loss(y.astype(np.int64), p, pos_label=1))


# ----------------------------------------------------------------------- selective prediction
def _sorted_tie_groups(confidence: Any, correct: Any):
    """Correctness sorted by confidence (highest first) and the end index of each tie group."""
    conf, corr = _prepare(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    c, y = conf[order], corr[order]
    group_end = np.flatnonzero(np.r_[c[1:] != c[:-1], True]) + 1  # exclusive ends
    return y, group_end


def precision_coverage(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """Precision-coverage curve (CAPO's "Pareto" plot): keep the most confident fraction.

    Returns ``(coverage, precision)``, one point per distinct confidence value, coverage
    increasing to 1 where precision equals plain accuracy. Tied samples enter together, so the
    curve does not depend on how ties happen to be ordered. Empty input gives empty arrays.
    """
    y, ends = _sorted_tie_groups(confidence, correct)
    if y.size == 0:
        return np.zeros(0), np.zeros(0)
    cum = np.cumsum(y)
    return ends / y.size, cum[ends - 1] / ends


def aurc(confidence: Any, correct: Any) -> float:
    """Area under the risk-coverage curve: mean over k = 1..n of the risk of the top k.

    Inside a tie group the risk is the expected one under a random order of the tied samples
    (errors before the group plus a pro-rata share of its errors), so ties never help or hurt.
    NaN with no samples. Lower is better.
    """
    y, ends = _sorted_tie_groups(confidence, correct)
    n = y.size
    if n == 0:
        return float("nan")
    err = 1.0 - y
    starts = np.r_[0, ends[:-1]]
    err_before = np.r_[0.0, np.cumsum(err)][starts]  # errors before each tie group
    group_rate = (np.r_[0.0, np.cumsum(err)][ends] - err_before) / (ends - starts)
    k = np.arange(1, n + 1)
    g = np.searchsorted(ends, k, side="left")  # tie group holding position k
    risk = (err_before[g] + (k - starts[g]) * group_rate[g]) / k
    return float(risk.mean())


def e_aurc(confidence: Any, correct: Any) -> float:
    """Excess AURC: AURC minus the oracle's ``r + (1 - r) ln(1 - r)`` for error rate r.

    Why: raw AURC mixes ranking quality with accuracy; subtracting the best achievable value at
    the same accuracy leaves the ranking part. About 0 for a perfect ranker (the oracle formula
    is the large-n limit, so small n leaves a small positive residual).
    """
    value = aurc(confidence, correct)
    if math.isnan(value):
        return value
    _, corr = _prepare(confidence, correct)
    r = 1.0 - float(corr.mean())
    oracle = r + float(xlogy(1.0 - r, 1.0 - r))
    return value - oracle


# -------------------------------------------------------------------- accuracy over k samples
def _pass_at_k_scalar(n: int, c: int, k: int) -> float:
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(n: Any, c: Any, k: int) -> float | np.ndarray:
    """Unbiased pass@k (Chen et al. 2021) for n samples of which c are correct.

    Uses the product form ``1 - prod(1 - k / arange(n-c+1, n+1))``, which stays exact where the
    binomial ratio would overflow. Scalars give a float; arrays of n and c give an array.
    """
    if np.ndim(n) == 0 and np.ndim(c) == 0:
        return _pass_at_k_scalar(int(n), int(c), int(k))
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n), np.asarray(c))
    pairs = zip(n_arr.ravel(), c_arr.ravel())
    values = [_pass_at_k_scalar(int(a), int(b), int(k)) for a, b in pairs]
    return np.array(values).reshape(n_arr.shape)


def mean_at_k(correct: Any) -> float:
    """mean@k: average over problems of the fraction of that problem's samples that are correct.

    ``correct`` is ``[n_problems, k]`` (array, tensor, or a list of per-problem lists, which may
    be ragged). Why per problem first: every problem weighs the same whatever its sample count.
    NaN with no problems.
    """
    if hasattr(correct, "detach"):
        correct = correct.detach().cpu().double().numpy()
    rows = list(correct)
    if not rows:
        return float("nan")
    fractions = []
    for i, row in enumerate(rows):
        r = _as_correct(_as_float_array(row, f"correct[{i}]"))
        r = r[~np.isnan(r)]
        if r.size == 0:
            raise ValueError(f"correct[{i}] has no graded samples")
        fractions.append(r.mean())
    return float(np.mean(fractions))
