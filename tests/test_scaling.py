"""Inference-time scaling selectors on hand-built cases (EVALUATION.md definitions)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import weibull_min

from capo_trl.evaluation.scaling import (
    best_of_n,
    cluster_answers,
    fit_weibull_mixture,
    majority_vote,
    perplexity_consistency,
    reasoning_pruned_consistency,
    weibull_prune_mask,
)
from capo_trl.evaluation.weibull import _weibull_logpdf


def frac_equal(a: str, b: str) -> bool:
    """Test grader: numbers equal as fractions ("1/2" == "0.5"), else normalised strings."""
    try:
        return Fraction(a.replace(" ", "")) == Fraction(b.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return a.strip().lower() == b.strip().lower()


class CountingEq:
    def __init__(self):
        self.calls = []

    def __call__(self, a, b):
        self.calls.append((a, b))
        return frac_equal(a, b)


# ----------------------------------------------------------------------------- clustering


def test_cluster_answers_groups_equivalent_forms_and_skips_none():
    eq = CountingEq()
    ids, reps = cluster_answers(["1/2", "0.5", None, "2", "1/2", " 0.50", "x"], eq)
    assert ids == [0, 0, None, 1, 0, 0, 2]
    assert reps == ["1/2", "2", "x"]
    # identical strings never reach the grader; each distinct string meets each rep at most once
    assert len(eq.calls) == len(set(eq.calls))
    assert ("1/2", "1/2") not in eq.calls


def test_cluster_answers_shared_cache():
    eq, cache = CountingEq(), {}
    cluster_answers(["1", "1.0", "2"], eq, cache=cache)
    n = len(eq.calls)
    cluster_answers(["1", "1.0", "2"], eq, cache=cache)
    assert len(eq.calls) == n and cache[("1", "1.0")] is True


def test_cluster_answers_rejects_non_strings():
    with pytest.raises(TypeError):
        cluster_answers([1, "1"], frac_equal)


# ----------------------------------------------------------------------------- majority vote


def test_majority_vote_counts_duplicates_and_merges_equivalents():
    r = majority_vote(["1/2", "3", "0.5", "3", None, None, None], equivalent=frac_equal)
    assert r.tied == ("1/2", "3") and r.answer == "1/2"
    assert r.scores == {"1/2": 2.0, "3": 2.0}
    assert r.credit(lambda a: a == "3") == 0.5  # tie splits credit
    assert majority_vote(["4", "4", "5"], equivalent=frac_equal).answer == "4"


def test_all_unanswered_gives_none_and_zero_credit():
    for r in (
        majority_vote([None, None], equivalent=frac_equal),
        perplexity_consistency([None, None], [-0.1, -0.2], equivalent=frac_equal),
        reasoning_pruned_consistency(
            [None] * 5, np.log([0.1, 0.2, 0.9, 0.8, 0.3]), equivalent=frac_equal
        ),
        best_of_n([None], [-0.1], equivalent=frac_equal),
    ):
        assert r.answer is None and r.tied == () and r.credit(lambda a: True) == 0.0


# ----------------------------------------------------------------------------- PC


def test_pc_unique_texts_count_once():
    answers = ["7", "7", "8"]
    s = np.log([0.4, 0.4, 0.6])
    texts = ["so 7", "so 7", "hence 8"]
    r = perplexity_consistency(answers, s, texts=texts, equivalent=frac_equal)
    assert r.answer == "8" and r.scores["7"] == pytest.approx(0.4)
    # without texts every completion counts: 0.8 > 0.6
    assert perplexity_consistency(answers, s, equivalent=frac_equal).answer == "7"
    # different texts with the same answer both count
    r2 = perplexity_consistency(answers, s, texts=["a", "b", "c"], equivalent=frac_equal)
    assert r2.answer == "7" and r2.scores["7"] == pytest.approx(0.8)


def test_pc_equivalent_forms_pool_their_mass():
    answers = ["1/2", "0.5", "2", "\\text{two}"]
    s = torch.log(torch.tensor([0.3, 0.3, 0.5, 0.05]))
    r = perplexity_consistency(answers, s, texts=["a", "b", "c", "d"], equivalent=frac_equal)
    assert r.answer == "1/2" and r.scores["1/2"] == pytest.approx(0.6)
    assert r.credit(lambda a: frac_equal(a, "0.5")) == 1.0


def test_pc_ties_split_credit():
    answers = ["1", "2", "2"]
    s = np.log([0.6, 0.2, 0.4])  # 0.2 + 0.4 == 0.6 up to rounding
    r = perplexity_consistency(answers, s, texts=["a", "b", "c"], equivalent=frac_equal)
    assert set(r.tied) == {"1", "2"}
    assert r.credit(lambda a: a == "1") == 0.5


def test_pc_matches_direct_definition_on_random_problems():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 16))
        answers = [None if v == 3 else str(v) for v in rng.integers(0, 4, n)]
        texts = [f"t{v}" for v in rng.integers(0, 6, n)]
        s = np.log(rng.uniform(0.05, 1.0, n))
        # identical texts must share an answer and a log-prob, as they would from one model
        first = {}
        for i, t in enumerate(texts):
            j = first.setdefault(t, i)
            answers[i], s[i] = answers[j], s[j]
        mass = {}
        for t, i in first.items():
            if answers[i] is not None:
                mass[answers[i]] = mass.get(answers[i], 0.0) + math.exp(s[i])
        r = perplexity_consistency(answers, s, texts=texts, equivalent=frac_equal)
        if not mass:
            assert r.answer is None
            continue
        best = max(mass.values())
        assert set(r.tied) == {a for a, v in mass.items() if math.isclose(v, best, rel_tol=1e-12)}
        assert r.scores == pytest.approx(mass)


def test_precomputed_clusters_and_validation():
    answers = ["1/2", "0.5", "3"]
    s = np.log([0.3, 0.3, 0.5])
    ids, _ = cluster_answers(answers, frac_equal)
    r1 = perplexity_consistency(answers, s, equivalent=frac_equal)
    r2 = perplexity_consistency(answers, s, clusters=ids, equivalent=lambda a, b: 1 / 0)
    assert r1 == r2
    with pytest.raises(ValueError, match="answers and logprobs"):
        perplexity_consistency(answers, s[:2], equivalent=frac_equal)
    with pytest.raises(ValueError, match="answers and texts"):
        perplexity_consistency(answers, s, texts=["a"], equivalent=frac_equal)
    with pytest.raises(ValueError, match="answers and clusters"):
        majority_vote(answers, clusters=[0, 0])
    with pytest.raises(ValueError, match="NaN"):
        best_of_n(answers, [0.0, float("nan"), 0.0], equivalent=frac_equal)


# ----------------------------------------------------------------------------- RPC


def test_weibull_logpdf_matches_scipy():
    x = np.linspace(0.01, 1.0, 50)
    for k, lam in [(0.7, 0.3), (2.0, 0.5), (40.0, 0.9)]:
        assert np.allclose(_weibull_logpdf(x, k, lam), weibull_min.logpdf(x, k, scale=lam))


def test_weibull_mixture_recovers_two_components():
    rng = np.random.default_rng(1)
    low = weibull_min.rvs(4.0, scale=0.25, size=300, random_state=rng)
    high = weibull_min.rvs(30.0, scale=0.9, size=200, random_state=rng)
    mix = fit_weibull_mixture(np.clip(np.r_[low, high], 1e-6, 1.0))
    assert mix.w_high == pytest.approx(0.4, abs=0.05)
    assert mix.lam_high == pytest.approx(0.9, abs=0.03)
    assert mix.lam_low == pytest.approx(0.25, abs=0.03)
    assert fit_weibull_mixture([0.5, 0.5, 0.5]) is None and fit_weibull_mixture([0.2, 0.9]) is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=0, max_size=20))
def test_pruning_never_drops_above_mean_samples(p):
    keep = weibull_prune_mask(p)
    assert keep.shape == (len(p),)
    if p:
        assert keep[np.asarray(p) >= np.mean(p)].all()


def test_rpc_pruning_changes_the_winner():
    rng = np.random.default_rng(2)
    p = np.r_[rng.uniform(0.12, 0.28, 10), [0.86, 0.9]]  # a tail of 10 improbable paths
    answers = ["A"] * 10 + ["B"] * 2
    texts = [f"path {i}" for i in range(12)]
    pc = perplexity_consistency(answers, np.log(p), texts=texts, equivalent=frac_equal)
    rpc = reasoning_pruned_consistency(answers, np.log(p), texts=texts, equivalent=frac_equal)
    assert pc.answer == "A"  # 10 x ~0.2 outweighs 2 x ~0.9
    assert rpc.answer == "B"
    assert rpc.kept == tuple([False] * 10 + [True] * 2)
    assert rpc.scores["A"] == 0.0 and rpc.scores["B"] == pytest.approx(1.76)


def test_rpc_keeps_unimodal_samples_and_falls_back():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.6, 0.7, 12)
    answers = ["1"] * 7 + ["2"] * 5
    rpc = reasoning_pruned_consistency(answers, np.log(p), equivalent=frac_equal)
    pc = perplexity_consistency(answers, np.log(p), equivalent=frac_equal)
    assert rpc.answer == pc.answer
    # the only answered completions are improbable ones: fall back to PC on everything
    p2 = np.r_[rng.uniform(0.1, 0.2, 8), [0.9, 0.92, 0.95]]
    answers2 = ["5"] * 8 + [None] * 3
    r = reasoning_pruned_consistency(answers2, np.log(p2), equivalent=frac_equal)
    assert r.answer == "5" and all(r.kept)
    # one or two samples: nothing to fit, nothing pruned
    assert reasoning_pruned_consistency(["1"], [-0.1], equivalent=frac_equal).kept == (True,)


# ----------------------------------------------------------------------------- best-of-N


def test_best_of_n():
    answers = ["3", None, "4", "3.0"]
    s = [-0.5, -0.01, -0.2, -0.9]
    r = best_of_n(answers, s, equivalent=frac_equal)
    assert r.answer == "4"  # the unanswered completion is not a candidate
    assert r.scores == {"3": -0.5, "4": -0.2}
    # equal top confidence, equivalent answers: one winner
    same = best_of_n(["1/2", "0.5", "7"], [-0.1, -0.1, -0.3], equivalent=frac_equal)
    assert same.tied == ("1/2",)
    # equal top confidence, different answers: split
    split = best_of_n(["1", "2"], [-0.1, -0.1], equivalent=frac_equal)
    assert split.credit(lambda a: a == "2") == 0.5
    assert best_of_n(["1", "2"], [float("-inf")] * 2, equivalent=frac_equal).tied == ("1", "2")


# ----------------------------------------------------------------------------- real grader


def test_default_grader_from_rewards_clusters_latex_forms():
    """Uses capo_trl.rewards.MathReward (equivalent=None); fails, not skips, if it is missing."""
    from capo_trl.rewards import MathReward  # noqa: F401  (fails loudly if the API is absent)

    ids, reps = cluster_answers(["\\frac{1}{2}", "0.5", "2", "1/2"])
    assert ids[0] == ids[1] == ids[3] != ids[2]
    r = perplexity_consistency(["\\frac{1}{2}", "0.5", "2"], np.log([0.3, 0.3, 0.5]))
    assert r.answer == "\\frac{1}{2}"


def test_mixture_gradient_matches_finite_differences():
    from scipy.optimize import approx_fprime

    from capo_trl.evaluation.weibull import _mixture_nll

    logx = np.log(np.random.default_rng(4).uniform(0.05, 1.0, 20))
    for theta in ([0.3, 0.5, -1.0, 2.0, -0.1], [0.7, 1.5, -0.5, 0.2, -2.0]):
        _, grad = _mixture_nll(theta, logx)
        numeric = approx_fprime(np.array(theta), lambda t: _mixture_nll(t, logx, False), 1e-7)
        assert np.allclose(grad, numeric, rtol=1e-4, atol=1e-4)


def test_metrics_rpc_without_the_fit_where_one_answer_cluster_equals_rpc():
    """compute_metrics skips RPC's mixture fit when a problem has one answer cluster: same answers, same credit."""
    from capo_trl.evaluation.metrics import compute_metrics
    from capo_trl.evaluation.scaling import perplexity_consistency, reasoning_pruned_consistency, weibull_prune_mask

    rng = np.random.default_rng(0)
    n, samples, pruned_single = 8, [], 0
    for p in range(40):
        pool = ["1"] if p % 2 else ["1", "2", "3"]  # odd problems: one answer cluster (plus unanswered samples)
        answers = [None if rng.random() < 0.15 else str(rng.choice(pool)) for _ in range(n)]
        scores = rng.normal(-0.3, 0.25, n).clip(max=-1e-3)
        if p % 2:
            pruned_single += not weibull_prune_mask(np.exp(scores)).all()
        for d, (a, s) in enumerate(zip(answers, scores)):
            samples.append({"id": str(p), "draw": d, "completion": f"text {p} {d % 5}", "extracted": a,
                            "grade": float(a == "1"), "score": float(s), "num_tokens": 5, "finished": True})
    metrics, per_problem, _ = compute_metrics(samples, n, [1, 2, 4, 8], lambda a, b: a == b, bootstrap=0)
    expected, answers_ = [], []
    for p in range(40):
        rec = samples[p * n:(p + 1) * n]
        args = ([r["extracted"] for r in rec], [r["score"] for r in rec])
        kwargs = dict(texts=[r["completion"] for r in rec], equivalent=lambda a, b: a == b)
        full = reasoning_pruned_consistency(*args, **kwargs)
        expected.append(full.credit(lambda a: a == "1"))
        answers_.append(full.answer)
        if p % 2:  # one cluster: PC decides the same
            assert perplexity_consistency(*args, **kwargs).tied == full.tied
    assert metrics["rpc@8"] == float(np.mean(expected))
    assert [row["rpc"] for row in per_problem] == answers_
    assert pruned_single > 0  # the fit would have pruned some single-cluster problems: the answer stays anyway
