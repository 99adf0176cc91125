"""CAPO.md's formulas: the worked example, invariants as property tests, and the autograd identity."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo_trl.advantages import capo_advantages, grpo_advantages, mean_token_logprob, noise_mask

R = torch.tensor([1.0, 1, 0, 0, 0])
S = torch.tensor([-0.20, -0.60, -0.30, -0.10, -0.90])
PPL = torch.tensor([1.30, 3.00, 1.02, 1.50, 2.00])


@pytest.mark.parametrize(
    "normalization, expected",
    [
        ("none", [2.0624, 2.8284, -1.8015, -2.0644, -1.0250]),
        ("group", [0.4125, 0.5657, -0.3603, -0.4129, -0.2050]),
        ("pairs", [0.3437, 0.4714, -0.3002, -0.3441, -0.1708]),
    ],
)
def test_worked_example(normalization, expected):
    adv = capo_advantages(R, S, 5, tau=0.6, normalization=normalization)
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-4, rtol=0)


def test_worked_example_with_mask():
    keep = noise_mask(R, PPL)
    assert keep.tolist() == [True, False, False, True, True]
    adv = capo_advantages(R, S, 5, tau=0.6, normalization="none") * keep
    torch.testing.assert_close(adv, torch.tensor([2.0624, 0, 0, -2.0644, -1.0250]), atol=1e-4, rtol=0)


def pairwise_loss(rewards, scores, tau, surrogate):
    diff = scores[:, None] - scores[None, :]
    weight = torch.relu(rewards[:, None] - rewards[None, :])
    phi = torch.nn.functional.softplus(-diff / tau) if surrogate == "logistic" else -diff
    return (weight * phi).sum()


groups = st.integers(min_value=1, max_value=4)
gsize = st.integers(min_value=2, max_value=8)
finite = st.floats(min_value=-30, max_value=0, allow_nan=False, allow_infinity=False)
reward_values = st.sampled_from([0.0, 1.0, 0.5, 0.25])


@st.composite
def batches(draw, binary=False):
    n_groups, g = draw(groups), draw(gsize)
    n = n_groups * g
    rv = st.sampled_from([0.0, 1.0]) if binary else reward_values
    rewards = torch.tensor(draw(st.lists(rv, min_size=n, max_size=n)))
    scores = torch.tensor(draw(st.lists(finite, min_size=n, max_size=n)))
    tau = draw(st.floats(min_value=0.01, max_value=5.0))
    return rewards, scores, g, tau


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(["logistic", "linear"]))
def test_equals_minus_autograd_of_pairwise_loss(batch, surrogate):
    rewards, scores, g, tau = batch
    adv = capo_advantages(rewards, scores, g, tau=tau, normalization="none", surrogate=surrogate)
    expected = []
    for r, s in zip(rewards.view(-1, g), scores.view(-1, g)):
        s = s.double().clone().requires_grad_(True)
        pairwise_loss(r.double(), s, tau, surrogate).backward()
        expected.append(-s.grad)
    torch.testing.assert_close(adv.double(), torch.cat(expected), atol=1e-4, rtol=1e-4)


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(["group", "pairs", "none"]))
def test_invariants(batch, normalization):
    rewards, scores, g, tau = batch
    adv = capo_advantages(rewards, scores, g, tau=tau, normalization=normalization)
    assert torch.isfinite(adv).all()
    for r, s, a in zip(rewards.view(-1, g), scores.view(-1, g), adv.view(-1, g)):
        scale = a.abs().max().item() + 1.0
        assert abs(a.sum().item()) <= 1e-4 * scale  # zero-sum before masking
        if (r == r[0]).all():
            assert (a == 0).all()  # no pairs, no signal


@settings(max_examples=150, deadline=None)
@given(batches(binary=True))
def test_binary_signs_and_hard_pair_ordering(batch):
    rewards, scores, g, tau = batch
    adv = capo_advantages(rewards, scores, g, tau=tau)
    for r, s, a in zip(rewards.view(-1, g), scores.view(-1, g), adv.view(-1, g)):
        assert (a[r == 1] >= 0).all() and (a[r == 0] <= 0).all()
        cs, ca = s[r == 1], a[r == 1]
        for i in range(len(cs)):
            for j in range(len(cs)):
                if cs[i] < cs[j]:  # the less confident correct answer gets at least as much credit
                    assert ca[i] >= ca[j] - 1e-6


@settings(max_examples=100, deadline=None)
@given(batches())
def test_linear_group_is_dr_grpo(batch):
    rewards, scores, g, _ = batch
    adv = capo_advantages(rewards, scores, g, surrogate="linear", normalization="group")
    expected = (rewards.view(-1, g) - rewards.view(-1, g).mean(1, keepdim=True)).view(-1)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, grpo_advantages(rewards, g, scale="none"), atol=1e-6, rtol=0)


def test_nan_rewards_are_left_out_of_every_pair():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    scores = torch.tensor([-0.5, -0.01, -0.2, -0.9])
    adv = capo_advantages(rewards, scores, 4, tau=0.3)
    assert adv[1] == 0
    alone = capo_advantages(torch.tensor([1.0, 0.0, 0.0]), scores[[0, 2, 3]], 3, tau=0.3)
    torch.testing.assert_close(adv[[0, 2, 3]], alone)  # same as if the NaN row did not exist


def test_non_finite_scores_and_extreme_inputs_never_nan():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    scores = torch.tensor([float("-inf"), -1e30, 0.0, float("nan")])
    adv = capo_advantages(rewards, scores, 4, tau=1e-6)
    assert torch.isfinite(adv).all() and adv[0] == 0 and adv[3] == 0


def test_all_equal_and_all_nan_groups_give_zeros():
    for rewards in (torch.ones(8), torch.zeros(8), torch.full((8,), float("nan"))):
        adv = capo_advantages(rewards, torch.randn(8), 4)
        assert (adv == 0).all() and not torch.isnan(adv).any()
        assert (grpo_advantages(rewards, 4) == 0).all()


def test_per_group_tau_tensor():
    rewards, scores = torch.cat([R, R]), torch.cat([S, S])
    adv = capo_advantages(rewards, scores, 5, tau=torch.tensor([0.6, 1.2]), normalization="none")
    torch.testing.assert_close(adv[:5], capo_advantages(R, S, 5, tau=0.6, normalization="none"))
    torch.testing.assert_close(adv[5:], capo_advantages(R, S, 5, tau=1.2, normalization="none"))


def test_grpo_advantages_match_trl_formula():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, float("nan")])
    adv = grpo_advantages(rewards, 4, scale="group")
    g1 = torch.tensor([1.0, 0, 0, 1])
    torch.testing.assert_close(adv[:4], (g1 - g1.mean()) / (g1.std() + 1e-4))
    g2 = torch.tensor([1.0, 1, 0])
    torch.testing.assert_close(adv[4:7], (g2 - g2.mean()) / (g2.std() + 1e-4))
    assert adv[7] == 0
    batch = grpo_advantages(rewards[:4], 2, scale="batch")
    torch.testing.assert_close(batch, (g1 - g1.view(2, 2).mean(1).repeat_interleave(2)) / (g1.std() + 1e-4))


@pytest.mark.parametrize(
    "reward, ppl, keep",
    [
        (1.0, 2.5, True), (1.0, 2.5001, False), (1.0, 1.0, True),      # correct: keep iff PPL <= ref_high
        (0.0, 1.05, True), (0.0, 1.0499, False), (0.0, 50.0, True),    # wrong: keep iff PPL >= ref_low
        (0.5, 3.0, False), (0.4999, 1.01, False),                      # correct_threshold edge (>= 0.5 correct)
        (float("nan"), 1.0, True), (1.0, float("nan"), True), (0.0, float("nan"), True),  # no evidence: keep
    ],
)
def test_noise_mask_truth_table(reward, ppl, keep):
    assert noise_mask(torch.tensor([reward]), torch.tensor([ppl])).item() is keep


def test_mean_token_logprob_uses_only_masked_tokens():
    logps = torch.tensor([[-1.0, -3.0, -100.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    out = mean_token_logprob(logps, mask)
    assert out[0].item() == -2.0 and math.isnan(out[1].item())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(normalization="mean"), "normalization"),
        (dict(surrogate="hinge"), "surrogate"),
        (dict(tau=0.0), "tau"),
        (dict(tau=float("nan")), "tau"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capo_advantages(R, S, 5, **kwargs)


def test_batch_not_multiple_of_group():
    with pytest.raises(ValueError, match="num_generations"):
        capo_advantages(R, S, 3)


def test_bounded_scale_tends_to_dr_grpo_and_stays_bounded():
    wide = capo_advantages(R, S, 5, tau=1e4, scale="bounded")
    torch.testing.assert_close(wide, R - R.mean(), atol=1e-4, rtol=0)
    narrow = capo_advantages(R, S, 5, tau=1e-4, scale="bounded", normalization="none")
    assert narrow.abs().max() <= 2 * 3 + 1e-6  # at most 2 per pair, 3 pairs per sample here
    paper = capo_advantages(R, S, 5, tau=0.6, scale="paper")
    torch.testing.assert_close(capo_advantages(R, S, 5, tau=0.6, scale="bounded"), paper * 1.2)


def test_within_group_std_pools_mixed_groups_only():
    from capo_trl.advantages import within_group_std

    rewards = torch.tensor([1.0, 0, 1, 0, 1, 1, 1, 1, 0, float("nan"), 1, 0])
    scores = torch.tensor([-1.0, -2, -3, -4, 5, 50, 500, 5000, -1, -99, -1, -1])
    g1, g3 = torch.tensor([-1.0, -2, -3, -4]), torch.tensor([-1.0, -1, -1])
    pooled = ((g1 - g1.mean()) ** 2).sum() / (3 + 2)  # the all-correct group 2 is ignored, NaN row dropped
    torch.testing.assert_close(within_group_std(rewards, scores, 4), pooled.sqrt())
    assert math.isnan(within_group_std(torch.ones(4), torch.randn(4), 4).item())
    assert g3.std() == 0


def test_quartile_thresholds_follow_the_paper_rule():
    from capo_trl.advantages import quartile_thresholds

    rewards = torch.tensor([1.0] * 5 + [0.0] * 5)
    ppl = torch.tensor([1.0, 1.1, 1.2, 1.3, 1.4, 2.0, 3.0, 4.0, 5.0, 6.0])
    high, low = quartile_thresholds(rewards, ppl)
    assert high == pytest.approx(1.3) and low == pytest.approx(3.0)
    assert all(math.isnan(v) for v in quartile_thresholds(torch.ones(3), torch.ones(3))[1:])


def test_registry_rejects_duplicates_and_capo_method_logs_tau():
    from types import SimpleNamespace

    from capo_trl.methods import CAPO, GRPO, AdvantageInputs, Method, register_method

    class Other(Method):
        name = "capo"

    with pytest.raises(ValueError, match="already registered"):
        register_method(Other)
    cfg = SimpleNamespace(tau=0.6, tau_mode="absolute", advantage_normalization="group", surrogate="logistic",
                          advantage_scale="paper", truncated_pairs="ranked", score_span="completion")  # every field:
    # a config without all of them would be read as a plugin's, its method_kwargs, and these values ignored
    assert CAPO(cfg).args.tau_mode == "absolute" and CAPO(cfg).args.advantage_scale == "paper"
    adv, metrics = CAPO(cfg).advantages(AdvantageInputs(R, S, 5, torch.zeros(5)))
    torch.testing.assert_close(adv, capo_advantages(R, S, 5, tau=0.6))
    assert metrics == {"capo/tau": 0.6}
    trl = torch.randn(5)
    assert GRPO(cfg).advantages(AdvantageInputs(R, S, 5, trl))[0] is trl


def test_matched_scale_keeps_grpo_step_size_and_zero_sum():
    from capo_trl.advantages import match_group_l1

    rewards = torch.cat([R, torch.ones(5)])
    scores = torch.cat([S, S])
    capo = capo_advantages(rewards, scores, 5, tau=0.05)
    grpo = grpo_advantages(rewards, 5)
    matched = match_group_l1(capo, grpo, 5)
    torch.testing.assert_close(matched[:5].abs().sum(), grpo[:5].abs().sum())
    assert abs(matched[:5].sum().item()) < 1e-5 and (matched[5:] == 0).all()
    assert (torch.sign(matched[:5]) == torch.sign(capo[:5])).all()
    # at huge tau CAPO's pair weights are uniform: matched equals GRPO's advantage exactly
    wide = match_group_l1(capo_advantages(R, S, 5, tau=1e6), grpo_advantages(R, 5), 5)
    torch.testing.assert_close(wide, grpo_advantages(R, 5), atol=1e-4, rtol=1e-4)


def test_tied_rows_are_credited_by_reward_alone():
    """A truncated wrong answer far below its group's scores: ranked, its pairs are already right (almost no
    gradient); tied, each pair weighs sigma(0) / tau, Dr. GRPO's pair weight times 1 / (2 tau)."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    scores = torch.tensor([-0.1, -0.2, -0.4, -3.0])
    tied = torch.tensor([False, False, False, True])
    ranked = capo_advantages(rewards, scores, 4, tau=0.5, normalization="none")
    assert abs(ranked[3]) < 0.02  # two pairs, each sigma(-2.8 / 0.5) / 0.5, about 0.007
    adv = capo_advantages(rewards, scores, 4, tau=0.5, normalization="none", tied=tied)
    torch.testing.assert_close(adv[3], torch.tensor(-2.0))  # two pairs, each sigma(0) / 0.5 = 1
    torch.testing.assert_close(adv[2], ranked[2])  # untied pairs unchanged
    expected = torch.sigmoid((scores[2] - scores[:2]) / 0.5) / 0.5 + 1.0  # its pair with row 2, and the tied one
    torch.testing.assert_close(adv[:2], expected)
    assert abs(float(adv.sum())) < 1e-6  # still zero-sum within the group
    torch.testing.assert_close(capo_advantages(rewards, scores, 4, tau=0.5, tied=torch.zeros(4, dtype=torch.bool)),
                               capo_advantages(rewards, scores, 4, tau=0.5))
    every = capo_advantages(rewards, scores, 4, tau=0.5, normalization="none", tied=torch.ones(4, dtype=torch.bool))
    torch.testing.assert_close(every, capo_advantages(rewards, scores, 4, surrogate="linear", normalization="none"))
