"""Inference-time scaling: pick one answer from N sampled completions of a problem.

Selectors (all as in ``docs/evaluation.md``): majority vote (self-consistency), perplexity
consistency (PC), reasoning-pruned PC (RPC) and best-of-N by confidence. They share one rule
set, so their numbers are comparable:

- answers are grouped into clusters by math equivalence (:func:`cluster_answers`);
- completions without an extracted answer (``None``) never vote and are never chosen;
- when several clusters tie for the top score each gets credit ``1/(number tied)``, see
  :meth:`ScalingResult.credit`, so ties never depend on list order.

Confidence ``s`` is a completion's mean token log-prob; ``exp(s)`` (= 1/perplexity) is its
length-normalised probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .weibull import WeibullMixture, fit_weibull_mixture, weibull_prune_mask

__all__ = [  # the Weibull mixture's names too: RPC's pruning, re-exported from .weibull
    "ScalingResult",
    "WeibullMixture",
    "cluster_answers",
    "majority_vote",
    "perplexity_consistency",
    "reasoning_pruned_consistency",
    "best_of_n",
    "fit_weibull_mixture",
    "weibull_prune_mask",
]

Equivalent = Callable[[str, str], bool]

# Scores within this relative distance count as tied (sums of floats in another order).
_TIE_RTOL = 1e-12


@dataclass(frozen=True)
class ScalingResult:
    """Outcome of one selector on one problem.

    ``answer`` is the winning cluster's representative (its first-seen answer string; the first
    of ``tied`` when several tie), ``None`` when no completion has an answer. ``scores`` maps each
    cluster representative to its score, ``clusters`` gives each completion's cluster index into
    ``representatives`` (``None`` for unanswered ones). ``kept`` is RPC's pruning mask.
    """

    answer: str | None
    tied: tuple[str, ...]
    scores: dict[str, float]
    representatives: tuple[str, ...]
    clusters: tuple[int | None, ...]
    kept: tuple[bool, ...] | None = None

    def credit(self, is_correct: Callable[[str], bool]) -> float:
        """Expected accuracy with ties split evenly: mean of ``is_correct`` over tied answers."""
        if not self.tied:
            return 0.0
        return sum(float(bool(is_correct(a))) for a in self.tied) / len(self.tied)


# --------------------------------------------------------------------------------------------
# answer clustering
# --------------------------------------------------------------------------------------------


def _default_grader():
    from ..grader import default_grader  # lazy: the grader pulls in math-verify and its workers

    return default_grader()


def _default_equivalent(a: str, b: str) -> bool:
    return bool(_default_grader().equivalent(a, b))


def cluster_answers(
    answers: Sequence[str | None],
    equivalent: Equivalent | None = None,
    cache: dict[tuple[str, str], bool] | None = None,
) -> tuple[list[int | None], list[str]]:
    """Group answers by equivalence; returns (cluster index per answer, representatives).

    Greedy over distinct strings in order of first appearance: identical strings always share a
    cluster without calling the grader; a new string joins the first cluster whose
    representative ``r`` satisfies ``equivalent(r, a)``, else starts its own. Why greedy and not
    full pairwise: the grader is slow (a sandboxed math-verify call) and nearly transitive, so
    comparing only against representatives keeps the cost at distinct x clusters. ``cache``
    (optional, shared across calls) stores pair results keyed ``(representative, answer)``.
    ``equivalent`` defaults to :class:`capo_trl.rewards.MathReward`'s grader.
    """
    eq = _default_equivalent if equivalent is None else equivalent
    cache = {} if cache is None else cache
    reps: list[str] = []
    index_of: dict[str, int] = {}
    out: list[int | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        if not isinstance(a, str):
            raise TypeError(f"answers must be str or None, got {type(a).__name__}")
        if a not in index_of:
            for ci, r in enumerate(reps):
                key = (r, a)
                if key not in cache:
                    cache[key] = bool(eq(r, a))
                if cache[key]:
                    index_of[a] = ci
                    break
            else:
                index_of[a] = len(reps)
                reps.append(a)
        out.append(index_of[a])
    return out, reps


def _resolve_clusters(answers, equivalent, clusters):
    """Cluster answers, or validate precomputed ``clusters`` (one clustering, all selectors)."""
    answers = list(answers)
    if clusters is None:
        return cluster_answers(answers, equivalent)
    clusters = list(clusters)
    if len(clusters) != len(answers):
        raise ValueError(
            "answers and clusters must have the same length, "
            f"got {len(answers)} and {len(clusters)}"
        )
    reps: dict[int, str] = {}
    for a, c in zip(answers, clusters):
        if (a is None) != (c is None):
            raise ValueError("clusters must be None exactly where answers is None")
        if c is not None:
            reps.setdefault(int(c), a)
    ids = sorted(reps)
    remap = {c: i for i, c in enumerate(ids)}
    return [None if c is None else remap[int(c)] for c in clusters], [reps[c] for c in ids]


def _as_logprobs(logprobs: Any, n: int, name: str = "logprobs") -> np.ndarray:
    if hasattr(logprobs, "detach"):
        logprobs = logprobs.detach().cpu().double().numpy()
    s = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    if len(s) != n:
        raise ValueError(f"answers and {name} must have the same length, got {n} and {len(s)}")
    if np.isnan(s).any():
        raise ValueError(f"{name} contains NaN")
    return s


def _decide(scores: np.ndarray, reps: list[str], clusters: list, kept=None) -> ScalingResult:
    """Argmax over cluster scores with ties (relative tolerance) kept together."""
    score_map = {r: float(v) for r, v in zip(reps, scores)}
    if len(reps) == 0:
        return ScalingResult(None, (), score_map, (), tuple(clusters), kept)
    best = float(np.max(scores))
    tied = tuple(
        r for r, v in zip(reps, scores) if math.isclose(v, best, rel_tol=_TIE_RTOL, abs_tol=0.0)
    )
    return ScalingResult(tied[0], tied, score_map, tuple(reps), tuple(clusters), kept)


# --------------------------------------------------------------------------------------------
# selectors
# --------------------------------------------------------------------------------------------


def majority_vote(
    answers: Sequence[str | None],
    equivalent: Equivalent | None = None,
    clusters: Sequence[int | None] | None = None,
) -> ScalingResult:
    """Self-consistency (maj@N): the answer cluster with the most completions.

    Every sample votes, duplicates included: repeating an answer is exactly the evidence
    self-consistency counts. Score = number of completions in the cluster.
    """
    cl, reps = _resolve_clusters(answers, equivalent, clusters)
    counts = np.bincount([c for c in cl if c is not None], minlength=len(reps)).astype(np.float64)
    return _decide(counts, reps, cl)


def _pc_scores(cl, n_clusters, s, texts, use) -> np.ndarray:
    """PC score per cluster: sum of exp(s) over unique completion texts (first occurrence)."""
    scores = np.zeros(n_clusters)
    seen: set = set()
    for i, c in enumerate(cl):
        if c is None or not use[i]:
            continue
        if texts is not None:
            if texts[i] in seen:
                continue
            seen.add(texts[i])
        scores[c] += math.exp(s[i])
    return scores


def _check_texts(texts, n):
    if texts is None:
        return None
    texts = list(texts)
    if len(texts) != n:
        raise ValueError(f"answers and texts must have the same length, got {n} and {len(texts)}")
    return texts


def perplexity_consistency(
    answers: Sequence[str | None],
    logprobs: Any,
    texts: Sequence[str] | None = None,
    equivalent: Equivalent | None = None,
    clusters: Sequence[int | None] | None = None,
) -> ScalingResult:
    """Perplexity consistency (Zhou et al. 2025): score(y) = sum of ``exp(s)`` over *unique*
    completions whose answer is in cluster y; predict the argmax.

    Why unique texts: PC estimates the probability mass of each answer, and a completion sampled
    twice is still one path of mass ``exp(s)``; counting it twice would turn PC back into voting.
    ``texts`` are the completion texts used for that de-duplication (identical text = one path,
    its first occurrence counts); without them every completion counts as distinct.
    ``logprobs`` are mean token log-probs ``s``.
    """
    cl, reps = _resolve_clusters(answers, equivalent, clusters)
    s = _as_logprobs(logprobs, len(cl))
    texts = _check_texts(texts, len(cl))
    scores = _pc_scores(cl, len(reps), s, texts, np.ones(len(cl), dtype=bool))
    return _decide(scores, reps, cl)


def reasoning_pruned_consistency(
    answers: Sequence[str | None],
    logprobs: Any,
    texts: Sequence[str] | None = None,
    equivalent: Equivalent | None = None,
    clusters: Sequence[int | None] | None = None,
) -> ScalingResult:
    """RPC (Zhou et al. 2025): prune low-probability reasoning paths, then PC on the rest.

    Why: a long tail of improbable, mostly wrong paths can outweigh a few confident ones in PC's
    sum; fitting a two-component Weibull mixture to ``exp(s)`` of all N completions and dropping
    the low component's below-mean members (:func:`weibull_prune_mask`) removes that tail. If no
    answered completion survives, PC on all completions is returned (``kept`` all True).
    """
    cl, reps = _resolve_clusters(answers, equivalent, clusters)
    s = _as_logprobs(logprobs, len(cl))
    texts = _check_texts(texts, len(cl))
    keep = weibull_prune_mask(np.exp(s))
    if not any(k and c is not None for k, c in zip(keep, cl)):
        keep = np.ones(len(cl), dtype=bool)
    scores = _pc_scores(cl, len(reps), s, texts, keep)
    return _decide(scores, reps, cl, kept=tuple(bool(k) for k in keep))


def best_of_n(
    answers: Sequence[str | None],
    logprobs: Any,
    equivalent: Equivalent | None = None,
    clusters: Sequence[int | None] | None = None,
) -> ScalingResult:
    """Best-of-N by confidence: the answer of the single completion with the highest ``s``.

    Score of a cluster = its highest ``s``. Clustering matters only for ties: two top-scoring
    completions with equivalent answers are one winner, not a split.
    """
    cl, reps = _resolve_clusters(answers, equivalent, clusters)
    s = _as_logprobs(logprobs, len(cl))
    scores = np.full(len(reps), -np.inf)
    for i, c in enumerate(cl):
        if c is not None:
            scores[c] = max(scores[c], s[i])
    if len(reps) and np.isneginf(scores).all():
        scores = np.zeros(len(reps))  # every answered completion has s = -inf: all tie
    return _decide(scores, reps, cl)
