"""Every contradictory combination of CAPOConfig's fields is refused at construction, naming the fields and the fix;
every combination whose fields have no effect warns once, naming them. One row per combination."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from capo_trl import CAPOConfig
from capo_trl.errors import UsageError
from capo_trl.rewards import RLCRReward, boxed_format_reward, math_accuracy_reward, with_grader_noise
from capo_trl.training.checks import check_correct_threshold
from capo_trl.training.defaults import RECOMMENDED

BASE = dict(output_dir="/tmp/capo-combinations-test", use_cpu=True, bf16=False, report_to="none")
ROOT = Path(__file__).resolve().parents[1]
# what the mask's own fields look like when set (none is a default)
# a tau_mode that is not the default, whichever the default is
OTHER_MODE = "absolute" if RECOMMENDED["tau_mode"] == "relative" else "relative"
MASK_SET = dict(noise_mask_normalizer="unmasked", ref_calibration_steps=2, ref_cache_size=0, ref_scoring="all",
                noise_mask_guard=False)

REFUSED = [
    # the mask
    ("ref_high=1 keeps no correct answer", dict(noise_mask=True, ref_high=1.0, ref_low=2.0),
     r"^CAPOConfig\.ref_high=1\.0 keeps no correct completion: .* Give ref_high > 1 \(the paper's 2\.5; `capo-trl "
     r"calibrate-mask` measures yours\), ref_thresholds='auto', noise_mask_side='wrong', or noise_mask=False\.$"),
    ("ref_high=1 on the correct side", dict(noise_mask=True, ref_high=1.0, noise_mask_side="correct"), r"ref_high=1\.0 keeps no correct"),
    ("ref_high < 1", dict(noise_mask=True, ref_high=0.9), r"ref_high=0\.9 / ref_low=1\.05 are perplexities"),
    ("sync_ref_model with the mask", dict(noise_mask=True, sync_ref_model=True), r"sync_ref_model=True moves the reference model.*"
                                                               r"noise_mask=False"),
    ("unmasked normaliser with a KL term", dict(noise_mask=True, noise_mask_normalizer="unmasked", beta=0.04),
     r"noise_mask_normalizer='unmasked' .* beta=0\.04 would still make them contribute"),
    # CAPO's own fields
    ("relative tau with the paper's 1/tau scale", dict(tau_mode="relative", advantage_scale="paper"),
     r"^CAPOConfig\.tau_mode='relative' with advantage_scale='paper': .* grow without bound as the spread shrinks; "
     r"use advantage_scale='matched' .* or 'bounded', or tau_mode='absolute'"),
    ("scale_rewards under the paper's scale", dict(tau_mode="absolute", advantage_scale="paper", scale_rewards="none"),
     r"scale_rewards='none' has no effect under advantage_scale='paper'"),
    # other methods, other TRL fields
    ("c2gspg with a KL term", dict(advantage_estimator="c2gspg", beta=0.04), r"beta=0\.04 is ignored by .*'c2gspg'"),
    ("c2gspg with TRL's clip", dict(advantage_estimator="c2gspg", epsilon=0.3), r"epsilon=0\.3 is ignored by"),
    ("row skipping with an entropy bonus", dict(skip_zero_advantage_rows=True, entropy_coef=0.01),
     r"skip_zero_advantage_rows=True is not exact with"),
    ("prompt sharing with activation checkpointing", dict(share_prompt_in_loss=True, activation_checkpointing=True),
     r"share_prompt_in_loss=True does not work with activation_checkpointing=True"),
    ("aggregation a method does not honour", dict(multi_objective_aggregation="normalize_then_sum"),
     r"multi_objective_aggregation='normalize_then_sum' is not honoured by advantage_estimator='capo'"),
]

WARNED = [
    # a method's settings under another method
    ("a CAPO setting under grpo", dict(advantage_estimator="grpo", tau=0.3),
     r"^CAPOConfig\.tau=0\.3 has no effect under advantage_estimator='grpo' \(capo's setting\); remove it, or choose "
     r"advantage_estimator='capo'\.$"),
    ("a CAPO method block under grpo", dict(advantage_estimator="grpo", tau=0.4, tau_mode=OTHER_MODE,
                                            advantage_scale="bounded", noise_mask=False),
     rf"^CAPOConfig\.tau=0\.4, tau_mode='{OTHER_MODE}', advantage_scale='bounded' have no effect under "
     r"advantage_estimator='grpo' \(capo's settings\); remove them"),
    ("a CoDaPO setting under capo", dict(codapo_replay=True),
     r"^CAPOConfig\.codapo_replay=True has no effect under advantage_estimator='capo' \(codapo's setting\)"),
    ("CAPO settings under dr_grpo", dict(advantage_estimator="dr_grpo", surrogate="linear", score_span="answer"),
     r"surrogate='linear', score_span='answer' have no effect under advantage_estimator='dr_grpo'"),
    # the mask's fields with the mask off
    ("thresholds with the mask off", dict(noise_mask=False, ref_high=2.0, ref_low=1.1),
     r"^CAPOConfig\.ref_high=2\.0, ref_low=1\.1 have no effect with the noise mask off \(noise_mask=False; "
     r"advantage_estimator='capo'\); set noise_mask=True to use them, or remove them\.$"),
    ("a mask side with the mask off", dict(noise_mask=False, noise_mask_side="wrong"),
     r"noise_mask_side='wrong' has no effect with the noise mask off"),
    ("measured thresholds with the mask off", dict(noise_mask=False, ref_thresholds="auto"),
     r"ref_thresholds='auto' has no effect with the noise mask off"),
    ("every other mask field with the mask off", dict(noise_mask=False, **MASK_SET),
     r"noise_mask_normalizer='unmasked', ref_calibration_steps=2, ref_cache_size=0, ref_scoring='all', "
     r"noise_mask_guard=False have no effect with the noise mask off"),
    ("a threshold under grpo (mask off by default)", dict(advantage_estimator="grpo", ref_low=1.2),
     r"ref_low=1\.2 has no effect with the noise mask off \(noise_mask=False; advantage_estimator='grpo'\)"),
    # the mask's fields that its other settings make unused
    ("fixed thresholds that are measured", dict(noise_mask=True, ref_thresholds="auto", ref_high=2.0),
     r"^CAPOConfig\.ref_high=2\.0 has no effect with ref_thresholds='auto' \(the thresholds are measured"),
    ("measuring steps with fixed thresholds", dict(noise_mask=True, ref_calibration_steps=3),
     r"ref_calibration_steps=3 has no effect with ref_thresholds='fixed'"),
    ("ref_low when only correct answers are tested", dict(noise_mask=True, noise_mask_side="correct", ref_low=1.2),
     r"ref_low=1\.2 has no effect with noise_mask_side='correct' \(the mask tests only correct answers\)"),
    ("ref_high when only wrong answers are tested", dict(noise_mask=True, noise_mask_side="wrong", ref_high=3.0),
     r"ref_high=3\.0 has no effect with noise_mask_side='wrong' \(the mask tests only wrong answers\)"),
    ("the mask's own reference forward at beta > 0", dict(noise_mask=True, beta=0.04, ref_scoring="all", ref_cache_size=16),
     r"ref_scoring='all', ref_cache_size=16 have no effect with beta=0\.04 \(the mask reads the reference log-probs "
     r"TRL computes"),
    ("overlapping fixed thresholds", dict(noise_mask=True, ref_high=1.5, ref_low=2.0),
     r"^noise mask thresholds from ref_high/ref_low as given overlap: ref_low=2 > ref_high=1\.5\."),
    # CAPO's settings that its other settings make unused
    ("a temperature for the linear surrogate", dict(surrogate="linear", tau=0.3, truncated_pairs="tied"),
     r"tau=0\.3, truncated_pairs='tied' have no effect with surrogate='linear'"),
    ("a normalisation the matched scale undoes", dict(advantage_scale="matched", advantage_normalization="pairs"),
     r"advantage_normalization='pairs' has no effect with advantage_scale='matched'"),
    # TRL's fields read only under a condition (docs/training.md's table)
    ("SAPO's temperature without sapo", dict(sapo_temperature_pos=2.0),
     r"sapo_temperature_pos=2\.0 has no effect without loss_type='sapo' \(TRL reads it only then\); remove it\.$"),
    ("VESPO's shape without vespo", dict(vespo_k_pos=4.0), r"vespo_k_pos=4\.0 has no effect without loss_type='vespo'"),
    ("reference sync settings without sync", dict(noise_mask=False, ref_model_mixup_alpha=0.9),
     r"ref_model_mixup_alpha=0\.9 has no effect without sync_ref_model=True"),
    ("vLLM's correction mode without vLLM", dict(vllm_importance_sampling_mode="token_mask"),
     r"vllm_importance_sampling_mode='token_mask' has no effect without use_vllm=True"),
]


def combination_warnings(kwargs) -> list[str]:
    """The warnings of this module's rules (transformers' and TRL's own aside) that constructing gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CAPOConfig(**kwargs, **BASE)
    return [str(w.message) for w in caught if w.filename.endswith("config.py") and "capo_trl" in w.filename]


@pytest.mark.parametrize("kwargs, pattern", [row[1:] for row in REFUSED], ids=[row[0] for row in REFUSED])
def test_refused_at_construction(kwargs, pattern):
    with pytest.raises(ValueError) as err:
        CAPOConfig(**kwargs, **BASE)
    assert re.search(pattern, str(err.value)) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("kwargs, pattern", [row[1:] for row in WARNED], ids=[row[0] for row in WARNED])
def test_warned_once_at_construction(kwargs, pattern):
    got = combination_warnings(kwargs)
    assert len(got) == 1 and re.search(pattern, got[0]), got


def test_warned_once_per_process():
    """Under Python's default filter the same message is shown once, however many configs a process builds (the
    harness builds one per run): each message comes from one place, worded the same each time."""
    message = ("CAPOConfig.tau=0.3 has no effect under advantage_estimator='grpo' (capo's setting); remove it, or "
               "choose advantage_estimator='capo'.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            CAPOConfig(advantage_estimator="grpo", tau=0.3, **BASE)
    assert [str(w.message) for w in caught].count(message) == 1


@pytest.mark.parametrize("kwargs", [
    dict(),  # the defaults
    dict(advantage_estimator="grpo", tau=RECOMMENDED["tau"], ref_high=2.5),  # set to the default: as if unset
    dict(advantage_estimator="grpo", noise_mask=True, ref_thresholds="auto", ref_calibration_steps=2),  # grpo-mask
    dict(tau=0.5, tau_mode="relative", advantage_scale="matched", noise_mask=False),  # the embedded preset
    dict(noise_mask=True, noise_mask_side="wrong", ref_low=1.2, ref_high=2.5, ref_thresholds="fixed"),
    dict(noise_mask=True, ref_high=1e6, ref_low=1.0),  # the real-model test's wide-open thresholds
    dict(loss_type="sapo", sapo_temperature_pos=2.0),
    dict(advantage_estimator="codapo", codapo_replay=True),
])
def test_a_coherent_configuration_warns_of_nothing(kwargs):
    assert combination_warnings(kwargs) == []


def test_every_recipe_constructs_and_only_the_grpo_twins_warn():
    """The CAPO recipes warn of nothing; a GRPO recipe keeps its CAPO twin's method settings (so the two differ only
    in advantage_estimator), which have no effect under grpo: that is its one warning."""
    from capo_trl.cli.train_args import parse_args

    for recipe in sorted((ROOT / "examples" / "recipes").glob("*.yaml")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parse_args(["--config", str(recipe), "--output_dir", "/tmp/capo-combinations-recipe"])
        got = [str(w.message) for w in caught if w.filename.endswith("config.py") and "capo_trl" in w.filename]
        if recipe.name.startswith("grpo-"):
            assert len(got) <= 1 and all("under advantage_estimator='grpo' (capo's setting" in m for m in got), got
        else:
            assert got == [], (recipe.name, got)


# ------------------------------------------------------------------------------------ correct_threshold
def unknown_range(completions, **kwargs):  # a reward function that does not say what it returns
    return [0.0 for _ in completions]


THRESHOLDS = [
    # reward functions, weights, threshold, refused (a pattern) or None (accepted)
    ([math_accuracy_reward], None, 2.0, r"^CAPOConfig\.correct_threshold=2 is above the highest total reward \(1: "
                                        r"math_accuracy_reward in \[0, 1\]\), so no completion would ever count as "
                                        r"correct .*; give a value in \(0, 1\], e.g\. 0\.5\.$"),
    ([math_accuracy_reward], None, 0.0, r"^CAPOConfig\.correct_threshold=0 is at or below the lowest total reward \(0: "
                                        r"math_accuracy_reward in \[0, 1\]\), so every completion would count as "
                                        r"correct"),
    ([math_accuracy_reward], None, 1.0, None),
    ([math_accuracy_reward, boxed_format_reward], None, 2.0, None),
    ([math_accuracy_reward, boxed_format_reward], None, 2.5, r"above the highest total reward \(2: "
                                                             r"math_accuracy_reward in \[0, 1\], boxed_format_reward"),
    ([math_accuracy_reward, boxed_format_reward], [2.0, 1.0], 2.5, None),
    ([math_accuracy_reward, boxed_format_reward], [1.0, -1.0], -0.5, None),
    ([math_accuracy_reward, boxed_format_reward], [1.0, -1.0], -1.0, r"at or below the lowest total reward \(-1"),
    ([with_grader_noise(math_accuracy_reward, 0.2)], None, 1.5, r"above the highest total reward \(1"),
    ([RLCRReward()], None, 1.5, None),
    ([RLCRReward()], None, 1.6, r"above the highest total reward \(1\.5: rlcr in \[0, 1\.5\]\)"),
    ([math_accuracy_reward, unknown_range], None, 5.0, None),  # one range unknown: nothing is knowable
]


@pytest.mark.parametrize("funcs, weights, threshold, refused", THRESHOLDS)
def test_a_threshold_no_reward_can_cross_is_refused(funcs, weights, threshold, refused):
    if refused is None:
        check_correct_threshold(funcs, weights, threshold)
        return
    with pytest.raises(UsageError) as err:
        check_correct_threshold(funcs, weights, threshold)
    assert re.search(refused, str(err.value)), str(err.value)


def test_the_trainer_and_the_cli_refuse_it_before_any_model_loads(tmp_path, capsys):
    from capo_trl import CAPOTrainer
    from capo_trl.cli.main import main

    with pytest.raises(UsageError, match=r"correct_threshold=2 is above the highest total reward"):
        CAPOTrainer(model=str(tmp_path / "no-model-here"), reward_funcs=math_accuracy_reward,
                    args=CAPOConfig(correct_threshold=2.0, **BASE))
    assert main(["train", "--correct_threshold", "2.0", "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("capo-trl train: CAPOConfig.correct_threshold=2 is above the highest total reward (1: "
                              "math_accuracy in [0, 1])"), err
