"""Calibration metrics against scikit-learn or brute-force definitions (EVALUATION.md)."""

import itertools
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from capo_trl.evaluation.calibration import (
    aurc,
    auroc,
    auroc_per_draw,
    auroc_per_question,
    brier,
    e_aurc,
    ece,
    mean_at_k,
    pass_at_k,
    precision_coverage,
    reliability_bins,
)

# small confidence alphabet so that ties are common
samples = st.lists(
    st.tuples(st.integers(0, 4).map(lambda v: v / 4), st.integers(0, 1)), min_size=0, max_size=30
)


def brute_auroc(conf, y):
    pos = [c for c, t in zip(conf, y) if t == 1]
    neg = [c for c, t in zip(conf, y) if t == 0]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def same(a, b, tol=1e-12):
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol


# ----------------------------------------------------------------------------- AUROC


@settings(max_examples=200, deadline=None)
@given(samples)
def test_auroc_matches_mann_whitney_and_sklearn(data):
    conf = [c for c, _ in data]
    y = [t for _, t in data]
    got = auroc(conf, y)
    assert same(got, brute_auroc(conf, y))
    if len(set(y)) == 2:
        assert got == pytest.approx(roc_auc_score(y, conf), abs=1e-12)


def test_auroc_one_class_empty_single_are_nan():
    assert math.isnan(auroc([0.1, 0.9], [1, 1]))
    assert math.isnan(auroc([0.1, 0.9], [0, 0]))
    assert math.isnan(auroc([], []))
    assert math.isnan(auroc([0.3], [1]))


def test_auroc_all_tied_is_half_not_nan():
    assert auroc([0.5, 0.5, 0.5], [1, 0, 1]) == 0.5


def test_auroc_inputs_torch_numpy_nan_and_inf():
    conf = torch.tensor([-0.1, -2.0, float("-inf"), float("nan"), -0.5], dtype=torch.bfloat16)
    y = torch.tensor([True, False, False, True, True])
    assert auroc(conf, y) == 1.0  # NaN row ignored, -inf ranked lowest
    assert auroc(np.array([0.2, 0.8, 0.5]), np.array([0.0, 1.0, np.nan])) == 1.0
    assert auroc([1.0, 2.0, float("inf")], [0, 1, 0]) == 0.5
    assert auroc([1.0, 2.0, 3.0], [1, None, 0]) == 0.0


def test_auroc_validation():
    with pytest.raises(ValueError, match="confidence and correct"):
        auroc([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="binary"):
        auroc([0.1, 0.2], [0.5, 1])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 1)), max_size=40))
def test_auroc_per_question_matches_sklearn_loop(data):
    q = [f"q{a}" for a, _, _ in data]
    conf = [float(c) for _, c, _ in data]
    y = [t for _, _, t in data]
    expected = []
    for qid in sorted(set(q)):
        idx = [i for i, v in enumerate(q) if v == qid]
        yy = [y[i] for i in idx]
        if len(set(yy)) == 2:
            expected.append(roc_auc_score(yy, [conf[i] for i in idx]))
    mean, n = auroc_per_question(conf, y, q)
    assert n == len(expected)
    assert same(mean, float(np.mean(expected)) if expected else float("nan"))


def test_auroc_per_question_random_large_groups_and_tensors():
    rng = np.random.default_rng(0)
    conf = np.round(rng.normal(size=1024), 1)  # rounding makes ties
    y = rng.integers(0, 2, size=1024)
    q = np.repeat(np.arange(64), 16)
    expected = np.mean([roc_auc_score(y[q == g], conf[q == g]) for g in range(64)])
    mean, n = auroc_per_question(torch.tensor(conf), torch.tensor(y), torch.tensor(q))
    assert n == 64 and mean == pytest.approx(expected, abs=1e-12)


def test_auroc_per_question_none_usable_and_validation():
    assert auroc_per_question([0.1, 0.2], [1, 1], [0, 1])[1] == 0
    assert math.isnan(auroc_per_question([0.1, 0.2], [1, 1], [0, 0])[0])
    assert math.isnan(auroc_per_question([], [], [])[0])
    with pytest.raises(ValueError, match="question_ids"):
        auroc_per_question([0.1, 0.2], [1, 0], [0])


def test_auroc_per_question_is_fast_for_a_training_batch():
    conf, y = torch.randn(1024), torch.randint(0, 2, (1024,))
    q = torch.arange(1024) // 8
    start = time.perf_counter()
    for _ in range(20):
        auroc_per_question(conf, y, q)
    assert (time.perf_counter() - start) / 20 < 0.05


def test_auroc_per_draw_2d_and_1d_agree_with_brute_force():
    rng = np.random.default_rng(2)
    conf = rng.integers(0, 5, size=(30, 4)).astype(float)
    y = rng.integers(0, 2, size=(30, 4))
    y[:, 3] = 1  # draw 3 has one class -> skipped
    expected = [roc_auc_score(y[:, k], conf[:, k]) for k in range(3)]
    mean, n = auroc_per_draw(conf, y)
    assert n == 3 and mean == pytest.approx(np.mean(expected))
    # 1-D with question ids, rows shuffled: draw index = order of appearance within a question
    q = np.repeat(np.arange(30), 4)
    perm = rng.permutation(120)
    flat_q, flat_c, flat_y = q[perm], conf.reshape(-1)[perm], y.reshape(-1)[perm]
    mean1, n1 = auroc_per_draw(flat_c, flat_y, question_ids=flat_q)
    # rebuild the 2-D table the 1-D call implies and compare
    table_c, table_y = np.zeros((30, 4)), np.zeros((30, 4))
    seen = {}
    for c, t, g in zip(flat_c, flat_y, flat_q):
        k = seen.get(g, 0)
        table_c[g, k], table_y[g, k] = c, t
        seen[g] = k + 1
    assert (mean1, n1) == auroc_per_draw(table_c, table_y)


def test_auroc_per_draw_edge_cases():
    assert auroc_per_draw(np.ones((3, 2)), np.ones((3, 2)))[1] == 0
    with pytest.raises(ValueError, match="same shape"):
        auroc_per_draw(np.ones((3, 2)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="2-D"):
        auroc_per_draw([0.1, 0.2], [1, 0])


# ----------------------------------------------------------------------------- ECE and Brier


def brute_ece(p, y, b):
    total = 0.0
    for k in range(b):
        idx = [i for i, v in enumerate(p) if min(math.floor(v * b), b - 1) == k]
        if idx:
            gap = abs(np.mean([y[i] for i in idx]) - np.mean([p[i] for i in idx]))
            total += len(idx) / len(p) * gap
    return total


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 1)), min_size=1, max_size=40),
    st.integers(1, 15),
)
def test_ece_matches_brute_force(data, b):
    p = [v for v, _ in data]
    y = [t for _, t in data]
    assert ece(p, y, n_bins=b) == pytest.approx(brute_ece(p, y, b), abs=1e-12)


def test_ece_hand_built_edges():
    assert ece([1.0, 1.0], [1, 1]) == 0.0  # p = 1 lands in the last bin
    assert ece([0.0, 0.0], [0, 0]) == 0.0
    assert ece([1.0, 0.0], [0, 1]) == 1.0
    # 0.1 opens bin 1 ([0.1, 0.2)); with the other edge convention this would be 0.475
    assert ece([0.1, 0.15], [0, 1]) == pytest.approx(0.375)
    assert ece([0.95, 1.0], [1, 0], n_bins=10) == pytest.approx(abs(0.5 - 0.975))
    assert ece([0.2, 0.9, 0.6], [1, 0, 1], n_bins=1) == pytest.approx(abs(2 / 3 - 1.7 / 3))
    assert math.isnan(ece([], []))


def test_ece_quantile_bins_have_equal_mass():
    rng = np.random.default_rng(3)
    p, y = rng.uniform(size=100), rng.integers(0, 2, 100)
    bins = reliability_bins(p, y, n_bins=10, strategy="quantile")
    assert bins.count.tolist() == [10] * 10
    assert ece(p, y, strategy="quantile") >= 0.0
    assert ece([0.3] * 5, [1, 1, 0, 0, 1], strategy="quantile") == pytest.approx(0.3)


def test_ece_validation():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece([1.2], [1])
    with pytest.raises(ValueError, match="strategy"):
        ece([0.2], [1], strategy="nope")
    with pytest.raises(ValueError, match="n_bins"):
        ece([0.2], [1], n_bins=0)
    with pytest.raises(ValueError, match="confidence_prob and correct"):
        ece([0.2], [1, 0])
    with pytest.raises(ValueError, match="confidence_prob and correct"):
        brier([0.2], [1, 0])


def test_brier():
    rng = np.random.default_rng(4)
    p, y = rng.uniform(size=50), rng.integers(0, 2, 50)
    assert brier(p, y) == pytest.approx(np.mean((p - y) ** 2))
    assert brier([0.2, 0.9], [1, 1]) == pytest.approx((0.64 + 0.01) / 2)
    assert brier([1.0], [0]) == 1.0
    assert math.isnan(brier([], []))


# ----------------------------------------------------------------------------- selective prediction


@settings(max_examples=150, deadline=None)
@given(samples.filter(lambda d: len(d) > 0))
def test_precision_coverage_endpoints_and_ties(data):
    conf = np.array([c for c, _ in data])
    y = np.array([t for _, t in data])
    cov, prec = precision_coverage(conf, y)
    assert cov[-1] == 1.0 and prec[-1] == pytest.approx(y.mean())
    assert np.all(np.diff(cov) > 0) and len(cov) == len(np.unique(conf))
    for c, p, thr in zip(cov, prec, np.sort(np.unique(conf))[::-1]):
        sel = conf >= thr  # a tie group enters whole
        assert c == pytest.approx(sel.mean()) and p == pytest.approx(y[sel].mean())


def test_precision_coverage_no_ties_is_top_k():
    rng = np.random.default_rng(5)
    conf, y = rng.normal(size=20), rng.integers(0, 2, 20)
    cov, prec = precision_coverage(conf, y)
    ranked = y[np.argsort(-conf)]
    assert np.allclose(cov, np.arange(1, 21) / 20)
    assert np.allclose(prec, np.cumsum(ranked) / np.arange(1, 21))
    assert len(precision_coverage([], [])[0]) == 0


def brute_aurc(conf, y):
    """Mean over all orderings consistent with the confidence ranking (ties broken every way)."""
    n = len(conf)
    values = []
    for perm in itertools.permutations(range(n)):
        if all(conf[perm[i]] >= conf[perm[i + 1]] for i in range(n - 1)):
            err = np.cumsum([1 - y[j] for j in perm])
            values.append(np.mean(err / np.arange(1, n + 1)))
    return float(np.mean(values))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2).map(float), st.integers(0, 1)), min_size=1, max_size=6
    )
)
def test_aurc_equals_average_over_tie_orders(data):
    conf = [c for c, _ in data]
    y = [t for _, t in data]
    assert aurc(conf, y) == pytest.approx(brute_aurc(conf, y), abs=1e-12)


def test_aurc_and_e_aurc_extremes():
    rng = np.random.default_rng(6)
    y = (rng.uniform(size=20000) < 0.7).astype(int)
    perfect = y + rng.uniform(0, 0.5, size=y.size)
    assert abs(e_aurc(perfect, y)) < 1e-3
    worst = -perfect
    assert e_aurc(worst, y) > 0.3
    assert e_aurc(rng.uniform(size=y.size), y) == pytest.approx(
        0.3 - (0.3 + 0.7 * math.log(0.7)), abs=0.02
    )  # random ranking: AURC ~ error rate
    assert aurc([0.2, 0.1], [1, 1]) == 0.0 and e_aurc([0.2, 0.1], [1, 1]) == 0.0
    assert aurc([0.2, 0.1], [0, 0]) == 1.0 and e_aurc([0.2, 0.1], [0, 0]) == pytest.approx(0.0)
    assert aurc([0.5], [0]) == 1.0
    assert math.isnan(aurc([], [])) and math.isnan(e_aurc([], []))


# ----------------------------------------------------------------------------- accuracy at k


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        pool = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(pool, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_arrays_and_validation():
    assert pass_at_k(1000, 3, 100) == pytest.approx(1 - math.comb(997, 100) / math.comb(1000, 100))
    assert pass_at_k(16, 0, 16) == 0.0 and pass_at_k(16, 1, 16) == 1.0
    out = pass_at_k(np.array([4, 4, 4]), np.array([0, 1, 4]), 2)
    assert out.shape == (3,) and out.tolist() == pytest.approx([0.0, 0.5, 1.0])
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)


def test_mean_at_k():
    assert mean_at_k([[1, 0, 0, 1], [1, 1, 1, 1]]) == 0.75
    assert mean_at_k([[1], [0, 0, 0, 1]]) == pytest.approx(0.625)  # ragged, per-problem first
    assert mean_at_k(torch.tensor([[True, False], [False, False]])) == 0.25
    assert mean_at_k(np.ones((3, 16))) == 1.0
    assert math.isnan(mean_at_k([]))
    with pytest.raises(ValueError, match="binary"):
        mean_at_k([[0.5]])


def test_single_group_per_question_auroc_equals_pooled_auroc():
    """The trainer logs pooled AUROC through the single-group Mann-Whitney path (cheaper per step)."""
    from capo_trl.evaluation.calibration import auroc, auroc_per_question

    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 80))
        scores = np.round(rng.normal(size=n), 1)  # rounding makes ties
        correct = rng.random(n) < 0.4
        pooled = auroc(scores, correct)
        single, usable = auroc_per_question(scores, correct, np.zeros(n, dtype=int))
        if np.isnan(pooled):
            assert np.isnan(single) and usable == 0
        else:
            assert single == pytest.approx(pooled, abs=1e-12) and usable == 1
