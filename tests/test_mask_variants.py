"""The mask's variants a study can separate: one side only, and the loss normaliser kept at the unmasked count."""

import pytest
import torch
from test_trainer import make, mask_warns

from capo_trl import CAPOConfig, noise_mask
from capo_trl.harness.calibrate_mask import caveats
from capo_trl.harness.presets import PRESETS
from capo_trl.training.mask import NoiseMask

# correct (lucky: PPL 3.0; plausible: 1.2), wrong (near-certain: 1.01; implausible: 4.0), ungraded
REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, float("nan")])
PPL = torch.tensor([3.0, 1.2, 1.01, 4.0, 1.0])


@pytest.mark.parametrize("side, expected", [
    ("both", [False, True, False, True, True]),
    ("correct", [False, True, True, True, True]),
    ("wrong", [True, True, False, True, True]),
])
def test_each_side_applies_its_own_test_only(side, expected):
    assert noise_mask(REWARDS, PPL, 2.5, 1.05, 0.5, side).tolist() == expected


def test_an_unknown_side_is_refused():
    with pytest.raises(ValueError, match="side='neither'"):
        noise_mask(REWARDS, PPL, side="neither")


def config(**overrides):
    return CAPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **overrides)


@pytest.mark.parametrize("overrides, field", [
    (dict(noise_mask_side="neither"), "noise_mask_side='neither'"),
    (dict(noise_mask_normalizer="all"), "noise_mask_normalizer='all'"),
    (dict(noise_mask=True, noise_mask_normalizer="unmasked", beta=0.04), "beta=0.04"),
    (dict(noise_mask=True, noise_mask_normalizer="unmasked", entropy_coef=0.01), "entropy_coef=0.01"),
    (dict(noise_mask=True, noise_mask_normalizer="unmasked", top_entropy_quantile=0.2), "top_entropy_quantile=0.2"),
    (dict(noise_mask_normalizer="unmasked", advantage_estimator="c2gspg", noise_mask=True), "'c2gspg'"),
])
def test_bad_variants_are_refused_at_construction(overrides, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        config(**overrides)


def test_one_sided_presets():
    assert PRESETS["capo-mask-correct"]["noise_mask_side"] == "correct"
    assert PRESETS["capo-mask-wrong"]["noise_mask_side"] == "wrong"
    for name in ("capo-mask-correct", "capo-mask-wrong"):
        assert {k: v for k, v in PRESETS[name].items() if k != "noise_mask_side"} == PRESETS["capo-mask"]


def test_one_sided_guard_never_touches_the_other_class(caplog):
    # every correct answer dropped: the guard keeps them; a wrong one at PPL 1.01 is never judged with side="correct"
    mask = NoiseMask(config(ref_high=1.1, ref_low=1.05, noise_mask_side="correct"))
    with mask_warns(caplog, "every correct completion"):
        keep, guarded = mask(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([3.0, 2.0, 1.01]), training=True)
    assert keep.tolist() == [True, True, True] and guarded == pytest.approx(2 / 3)
    assert "wrong" not in mask.warned


def test_overlapping_measured_thresholds_warn_once(caplog):
    mask = NoiseMask(config(ref_thresholds="auto"))
    rewards = torch.tensor([1.0] * 4 + [0.0] * 4)
    ppl = torch.tensor([1.00, 1.01, 1.02, 1.03, 1.50, 1.60, 1.70, 1.80])  # a perfectly calibrated reference
    with mask_warns(caplog, r"overlap: ref_low=1\.575 > ref_high=1\.02"):
        mask(rewards, ppl, training=True)
    high, low = mask.measured
    assert low > high and "overlap" in mask.warned


def test_calibrate_mask_names_the_overlap():
    assert caveats({"ref_high": 1.1, "ref_low": 1.2}) and "overlap" in caveats({"ref_high": 1.1, "ref_low": 1.2})[0]
    assert caveats({"ref_high": 1.3, "ref_low": 1.2}) == []


def alternating_reward(completions, **kwargs):
    """Every other completion right, whatever it says: every group of 4 is mixed."""
    return [float(i % 2 == 0) for i in range(len(completions))]


class Recorder:
    """Keeps the batch ``_generate_and_score_completions`` hands to TRL's loss."""

    def __init__(self, trainer):
        self.batches = []
        inner = trainer._generate_and_score_completions

        def wrapped(inputs):
            out = inner(inputs)
            self.batches.append(out)
            return out
        trainer._generate_and_score_completions = wrapped


def test_unmasked_normaliser_keeps_dropped_rows_with_zero_advantage(tiny_model_dir, tmp_path):
    # Every wrong answer is dropped (the random model's PPL ~75 < ref_low), every correct one kept; no guard.
    settings = dict(loss_type="dapo", max_steps=1, learning_rate=0.0, noise_mask=True, ref_high=1e6, ref_low=1e6,
                    noise_mask_side="wrong", noise_mask_guard=False)
    outs = {}
    for normaliser in ("kept", "unmasked"):
        trainer = make(tiny_model_dir, tmp_path / normaliser, reward=alternating_reward, noise_mask_normalizer=normaliser,
                       **settings)
        recorder = Recorder(trainer)
        trainer.train()
        outs[normaliser] = (trainer, recorder.batches[0])
    kept, unmasked = outs["kept"][1], outs["unmasked"][1]
    assert torch.equal(kept["completion_ids"], unmasked["completion_ids"])  # same seed: same rollout
    dropped = kept["completion_mask"].sum(1) == 0
    assert dropped.any() and not dropped.all(), "the fixture must drop some rows and keep others"
    assert torch.equal(unmasked["advantages"][dropped], torch.zeros(int(dropped.sum())))
    assert torch.equal(unmasked["advantages"], kept["advantages"])
    assert unmasked["completion_mask"][dropped].sum() > 0  # the dropped rows' tokens still count
    assert int(unmasked["num_items_in_batch"]) == int(unmasked["completion_mask"].sum())
    assert int(kept["num_items_in_batch"]) == int(kept["completion_mask"].sum())

    # The loss: the same numerator (a zero advantage contributes exactly zero), a larger normaliser.
    trainer = outs["unmasked"][0]
    losses = {}
    for name, batch in (("kept", kept), ("unmasked", unmasked)):
        with torch.no_grad():
            losses[name] = trainer.compute_loss(trainer.model, dict(batch)).item()
    ratio = int(kept["num_items_in_batch"]) / int(unmasked["num_items_in_batch"])
    assert losses["kept"] != 0.0
    # float32 sums of the same non-zero terms in the same order; only the divisor differs
    assert losses["unmasked"] == pytest.approx(losses["kept"] * ratio, rel=1e-5)


def test_unmasked_normaliser_trains(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=True, ref_high=1e6, ref_low=1.0, noise_mask_normalizer="unmasked",
                   noise_mask_side="correct", max_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
