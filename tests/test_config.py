import pytest

from capo_trl import CAPOConfig

BASE = dict(output_dir="/tmp/capo-config-test", use_cpu=True, bf16=False, report_to="none")


def test_defaults_are_the_recommendation_and_grpo_stays_plain():
    from capo_trl.training.defaults import RECOMMENDED

    cfg = CAPOConfig(**BASE)
    assert {k: getattr(cfg, k) for k in RECOMMENDED} == RECOMMENDED
    assert CAPOConfig(advantage_estimator="grpo", **BASE).noise_mask is False
    assert CAPOConfig(advantage_estimator="grpo", noise_mask=True, **BASE).noise_mask is True


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("advantage_estimator", "ppo", "advantage_estimator='ppo'"),
        ("advantage_normalization", "mean", "advantage_normalization"),
        ("surrogate", "hinge", "surrogate"),
        ("tau", 0.0, "tau=0.0"),
        ("tau", -1.0, "tau"),
        ("tau", float("inf"), "tau"),
        ("ref_high", 0.0, "ref_high"),
        ("ref_low", 0.5, "perplexities"),
        ("correct_threshold", float("nan"), "correct_threshold"),
        ("ref_cache_size", -1, "ref_cache_size"),
        ("ref_cache_size", 1.5, "ref_cache_size"),
        ("tau_mode", "auto", "tau_mode"),
        ("advantage_scale", "unit", "advantage_scale"),
        ("advantage_scale", "grpo", "advantage_scale"),
        ("ref_thresholds", "quartile", "ref_thresholds"),
        ("ref_calibration_steps", 0, "ref_calibration_steps"),
        ("truncated_pairs", "masked", "truncated_pairs"),
    ],
)
def test_invalid_values_name_the_field(field, value, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        CAPOConfig(**{field: value}, **BASE)
    assert field in str(err.value)


def grpo_fields() -> set[str]:
    from dataclasses import fields

    from trl import GRPOConfig

    return {f.name for f in fields(GRPOConfig)}


def test_help_metadata_for_every_new_field():
    from dataclasses import fields

    from capo_trl.methods import BUILTIN

    baselines = {f.name for m in BUILTIN if m.Args is not None and m.name != "capo" for f in fields(m.Args)}
    new = {f.name for f in fields(CAPOConfig)} - grpo_fields() - baselines
    assert new == {"advantage_estimator", "tau", "advantage_normalization", "surrogate", "noise_mask",
                   "ref_high", "ref_low", "correct_threshold", "ref_cache_size", "tau_mode", "advantage_scale", "truncated_pairs",
                   "score_span",
                   "ref_thresholds", "ref_calibration_steps", "method_kwargs", "noise_mask_guard", "ref_scoring",
                   "noise_mask_side", "noise_mask_normalizer", "skip_zero_advantage_rows", "share_prompt_prefill", "score_span",
                   "share_prompt_in_loss", "sampler", "share_lower_layers"}
    for f in fields(CAPOConfig):
        if f.name in new:
            assert f.metadata.get("help"), f.name


def test_docs_config_table_lists_every_capo_field():
    from dataclasses import fields
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    doc = (docs / "config.md").read_text() + (docs / "baselines.md").read_text()
    base = grpo_fields()
    for f in fields(CAPOConfig):
        if f.name not in base:
            assert f"`{f.name}`" in doc, f"neither docs/config.md nor docs/baselines.md documents {f.name}"


def test_noise_mask_refuses_a_moving_reference():
    with pytest.raises(ValueError, match="sync_ref_model"):
        CAPOConfig(sync_ref_model=True, beta=0.1, noise_mask=True, **BASE)
    assert CAPOConfig(sync_ref_model=True, beta=0.1, noise_mask=False, **BASE).sync_ref_model
