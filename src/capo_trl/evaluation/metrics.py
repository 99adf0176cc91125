"""The metrics of an evaluation, from its per-sample records: accuracy (mean@n with a bootstrap
interval, pass@k), the answer selectors (majority vote, perplexity consistency, best-of-N) and every
confidence metric of ``s`` (AUROC, ECE, Brier, AURC), plus the curves the plots draw."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from . import calibration as cal
from .scaling import (
    best_of_n,
    cluster_answers,
    majority_vote,
    perplexity_consistency,
    reasoning_pruned_consistency,
)


def compute_metrics(samples: list[dict], n: int, ks: list[int], equivalent, n_bins: int = 10,
                    bootstrap: int = 1000, seed: int = 0, progress: bool = False):
    """Accuracy, scaling and calibration metrics from per-sample records (problem-major, n each).

    Problems with an ungraded sample (gold the grader cannot parse) are left out of every metric
    and counted in ``n_problems_ungraded``. maj@k votes over the first k draws. A voted answer
    is right when the first completion that gave that exact answer string was graded right.
    """
    P = len(samples) // n
    grades = np.array([np.nan if s["grade"] is None else s["grade"] for s in samples], dtype=float).reshape(P, n)
    scores = np.array([s["score"] for s in samples], dtype=float).reshape(P, n)
    graded = ~np.isnan(grades).any(axis=1)
    G, S = grades[graded], scores[graded]
    ids = [samples[p * n]["id"] for p in range(P)]
    kept = [p for p in range(P) if graded[p]]
    qids = [ids[p] for p in kept for _ in range(n)]
    m: dict[str, float] = {"n_problems": P, "n_samples": len(samples), "n_problems_ungraded": int(P - graded.sum())}
    c = G.sum(axis=1).astype(int)
    per_frac = G.mean(axis=1) if len(G) else np.zeros(0)
    m[f"mean@{n}"] = cal.mean_at_k(G) if len(G) else float("nan")
    if bootstrap and len(G) > 1:
        rng = np.random.default_rng(seed)
        boots = per_frac[rng.integers(0, len(G), size=(bootstrap, len(G)))].mean(axis=1)
        m[f"mean@{n}_ci_low"], m[f"mean@{n}_ci_high"] = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
    for k in ks:
        m[f"pass@{k}"] = float(np.mean(cal.pass_at_k(np.full(len(c), n), c, k))) if len(c) else float("nan")
    selectors, per_problem = _selectors(samples, kept, ids, grades, scores, n, ks, equivalent, progress)
    m.update({k: float(np.mean(v)) if v else float("nan") for k, v in selectors.items()})
    s_flat, y_flat = S.reshape(-1), G.reshape(-1)
    p_flat = np.exp(s_flat)
    m.update(_confidence_metrics(S, G, qids, n_bins))
    m["mean_tokens"] = float(np.mean([r["num_tokens"] for r in samples]))
    m["finished_frac"] = float(np.mean([r["finished"] for r in samples]))
    m["answered_frac"] = float(np.mean([r["extracted"] is not None for r in samples]))
    coverage, precision = cal.precision_coverage(s_flat, y_flat)
    curves = {
        "precision_coverage": {"coverage": coverage.tolist(), "precision": precision.tolist()},
        "reliability": reliability_curve(p_flat, y_flat, n_bins),
    }
    return m, per_problem, curves


def reliability_curve(p: np.ndarray, y: np.ndarray, n_bins: int) -> dict:
    """Reliability bins of probabilities ``p`` against outcomes ``y``, as the JSON report stores them."""
    bins = cal.reliability_bins(p, y, n_bins=n_bins)
    return {"edges": bins.edges.tolist(), "count": bins.count.tolist(), "confidence": bins.confidence.tolist(),
            "accuracy": bins.accuracy.tolist()}


def _first_grade(answers: list, grades: np.ndarray):
    """``is_correct(answer)`` = grade of the first completion that gave exactly that answer."""
    first: dict[str, float] = {}
    for a, g in zip(answers, grades):
        if a is not None:
            first.setdefault(a, g)
    return lambda a: first.get(a, 0.0) == 1.0


def _selectors(samples, kept, ids, grades, scores, n, ks, equivalent, progress):
    """Credit of every answer selector (maj@k, pc, rpc, bon) per problem, and each problem's chosen answers."""
    selectors = {f"maj@{k}": [] for k in ks} | {f"pc@{n}": [], f"rpc@{n}": [], f"bon@{n}": []}
    per_problem = []
    for p in tqdm(kept, desc="voting", disable=not progress):
        rec = samples[p * n:(p + 1) * n]
        answers, texts = [r["extracted"] for r in rec], [r["completion"] for r in rec]
        clusters, _ = cluster_answers(answers, equivalent)
        row = {"id": ids[p], "n_correct": int(grades[p].sum()), "n": n}
        for k in ks:
            right = _first_grade(answers[:k], grades[p])
            selectors[f"maj@{k}"].append(majority_vote(answers[:k], clusters=clusters[:k]).credit(right))
        right = _first_grade(answers, grades[p])
        s = scores[p]
        pc = perplexity_consistency(answers, s, texts=texts, clusters=clusters)
        # RPC prunes completions, then runs PC: with at most one answer cluster (and finite scores) pruning
        # cannot change the winner, so its mixture fit (most of an evaluation's metric time) is skipped.
        single = len({c for c in clusters if c is not None}) <= 1 and bool(np.isfinite(s).all())
        rpc = pc if single else reasoning_pruned_consistency(answers, s, texts=texts, clusters=clusters)
        for name, res in ((f"pc@{n}", pc), (f"rpc@{n}", rpc), (f"bon@{n}", best_of_n(answers, s, clusters=clusters))):
            selectors[name].append(res.credit(right))
            row[name.split("@")[0]] = res.answer
        row["maj"] = majority_vote(answers, clusters=clusters).answer
        per_problem.append(row)
    return selectors, per_problem


def _confidence_metrics(S: np.ndarray, G: np.ndarray, qids: list, n_bins: int) -> dict:
    """Discrimination (AUROC pooled, per question, per draw), calibration (ECE, Brier of ``exp(s)``),
    selective risk (AURC) and the mean confidence, of scores ``S`` against grades ``G`` (graded problems)."""
    s_flat, y_flat = S.reshape(-1), G.reshape(-1)
    p_flat = np.exp(s_flat)
    m = {"auroc": cal.auroc(s_flat, y_flat)}
    m["auroc_question"], m["auroc_question_n"] = cal.auroc_per_question(s_flat, y_flat, qids)
    m["auroc_draw"], m["auroc_draw_n"] = cal.auroc_per_draw(S, G) if len(G) else (float("nan"), 0)
    m["ece"] = cal.ece(p_flat, y_flat, n_bins=n_bins)
    m["brier"] = cal.brier(p_flat, y_flat)
    m["aurc"], m["e_aurc"] = cal.aurc(s_flat, y_flat), cal.e_aurc(s_flat, y_flat)
    m["mean_score"] = float(s_flat.mean()) if s_flat.size else float("nan")
    m["mean_confidence"] = float(p_flat.mean()) if p_flat.size else float("nan")
    return m
