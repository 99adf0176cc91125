"""CAPOTrainer end to end on a tiny offline Qwen2 (CPU), and the drop-in guarantee."""

import contextlib
import logging
import math
import re
import warnings

import pytest
import torch
from peft import LoraConfig
from capo_trl.testing.tiny import digit_reward, tiny_dataset
from trl import GRPOConfig, GRPOTrainer

from capo_trl import CAPOConfig, CAPOTrainer

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=1e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1,
    save_strategy="no", seed=7, temperature=1.0,
)
LOOSE = dict(noise_mask=True, ref_high=1e6, ref_low=1.0)  # the mask on; a random tiny model has reference PPL ~75: keep all
CAPO_METRICS = ["capo/auroc", "capo/auroc_group", "capo/mixed_group_frac", "capo/kept_frac", "capo/dropped_correct",
                "capo/dropped_wrong", "capo/adv_abs_mean"]


def make(model, tmp_path, trainer_cls=CAPOTrainer, config_cls=CAPOConfig, reward=digit_reward, **overrides):
    args = config_cls(output_dir=str(tmp_path), **{**COMMON, **overrides})
    return trainer_cls(model=model, reward_funcs=reward, args=args, train_dataset=tiny_dataset())


def params(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@contextlib.contextmanager
def mask_warns(caplog, pattern: str):
    """The noise mask's warning matching ``pattern``, logged (accelerate's logger, main process) exactly once."""
    with caplog.at_level(logging.WARNING, logger="capo_trl.training.mask"):
        yield
    hits = [r for r in caplog.records if r.name == "capo_trl.training.mask" and re.search(pattern, r.getMessage())]
    assert len(hits) == 1, [r.getMessage()[:120] for r in caplog.records if r.name == "capo_trl.training.mask"]
    caplog.clear()


def logged(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h]


def assert_trains(trainer, trainable_only=False, generations=None):
    before = params(trainer)
    trainer.train()
    after = params(trainer)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad] if trainable_only else list(before)
    assert set(changed) == set(names), f"unchanged: {sorted(set(names) - set(changed))[:5]}"
    for name in CAPO_METRICS:
        values = logged(trainer, name)
        assert len(values) == (generations or trainer.state.max_steps), name  # one entry per generation
        assert all(v is None or math.isfinite(v) for v in values), (name, values)  # None = undefined AUROC
    assert any(v is not None for v in logged(trainer, "capo/auroc"))


def test_the_papers_mask_has_a_separate_reference_and_warns_loudly(tiny_model_dir, tmp_path, caplog):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=True)  # the paper's thresholds, the guard on (defaults)
    assert trainer.args.noise_mask and trainer.beta == 0.0 and trainer.ref_model is None
    assert trainer._capo_ref_model is not None
    with mask_warns(caplog, r"would drop every correct completion.*ref_high=2.5.*kept them"):
        assert_trains(trainer)
    ppl = logged(trainer, "capo/ref_ppl_mean")
    assert len(ppl) == 3 and all(p > 2.5 for p in ppl)  # why the paper's thresholds fail on a random model


def test_beta_positive_uses_trl_reference_logps(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, beta=0.1, **LOOSE)
    assert trainer._capo_ref_model is None and trainer.ref_model is not None
    assert_trains(trainer)
    assert "capo/ref_cache_hit_rate" not in trainer.state.log_history[0]


def test_lora_uses_base_model_as_reference(tiny_model_dir, tmp_path):
    args = CAPOConfig(output_dir=str(tmp_path), **COMMON, **LOOSE)
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert trainer._capo_ref_model is None and trainer.ref_model is None
    before = params(trainer)
    assert_trains(trainer, trainable_only=True)
    frozen = [n for n, p in trainer.model.named_parameters() if not p.requires_grad]
    assert frozen and all(torch.equal(before[n], params(trainer)[n]) for n in frozen)


def test_num_iterations_two_scores_from_old_logps(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, num_iterations=2, max_steps=4, **LOOSE)
    assert not trainer._records_rollout_logps()
    assert_trains(trainer, generations=2)


def test_mask_off(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=False)
    assert trainer._capo_ref_model is None
    assert_trains(trainer)
    assert set(logged(trainer, "capo/kept_frac")) == {1.0}


def test_recorded_rollout_logps_equal_a_forward(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=False)
    seen = {}
    original = CAPOTrainer._rollout_scores

    def spy(self, out, loss_mask, record):
        seen["recorded"] = original(self, out, loss_mask, record)
        seen["forward"] = mean_of(self._forward_logps(self.model, out), loss_mask)
        return seen["recorded"]

    from capo_trl.advantages import mean_token_logprob as mean_of

    trainer._rollout_scores = spy.__get__(trainer)
    assert trainer._records_rollout_logps()
    trainer.train()
    assert trainer._record.rollout_logps is not None
    torch.testing.assert_close(seen["recorded"], seen["forward"], atol=1e-4, rtol=1e-4)


def test_reference_cache_hits_skip_forwards(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, max_completion_length=1, max_steps=4, **LOOSE)
    trainer.train()  # one-token completions over a 16-prompt dataset repeat quickly
    rates = logged(trainer, "capo/ref_cache_hit_rate")
    assert len(rates) == 4 and all(0 <= r <= 1 for r in rates) and max(rates) > 0
    assert 0 < len(trainer._ref_cache) <= trainer._ref_cache.lookups


def test_drop_in_grpo_is_bit_identical_to_grpotrainer(tiny_model_dir, tmp_path):
    ours = make(tiny_model_dir, tmp_path / "capo", advantage_estimator="grpo", max_steps=4)
    ours.train()  # build and train one after the other: a trainer's __init__ reseeds the global RNG
    theirs = make(tiny_model_dir, tmp_path / "grpo", trainer_cls=GRPOTrainer, config_cls=GRPOConfig, max_steps=4)
    theirs.train()
    assert logged(ours, "loss") == logged(theirs, "loss")
    assert logged(ours, "grad_norm") == logged(theirs, "grad_norm")
    assert any(g > 0 for g in logged(ours, "grad_norm"))
    mine, reference = params(ours), params(theirs)
    assert all(torch.equal(mine[n], reference[n]) for n in reference)
    assert logged(ours, "capo/auroc")  # plus a calibration monitor GRPOTrainer does not have


def test_reward_returning_all_none_gives_zero_advantages(tiny_model_dir, tmp_path):
    seen = []
    trainer = make(tiny_model_dir, tmp_path, reward=lambda completions, **kw: [None] * len(completions),
                   max_steps=2, **LOOSE)
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        seen.append(out["advantages"])
        return out

    trainer._generate_and_score_completions = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert seen and all((a == 0).all() for a in seen)
    assert all(v == 0 for v in logged(trainer, "capo/adv_abs_mean"))


def test_grpo_config_is_refused_with_the_fix(tiny_model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), **COMMON)
    with pytest.raises(TypeError, match="CAPOConfig"):
        CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())


def test_relative_tau_scales_with_the_score_spread(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, tau=0.5, tau_mode="relative", advantage_scale="bounded",
                   noise_mask=False, max_steps=3)
    trainer.train()
    pairs = list(zip(logged(trainer, "capo/tau"), logged(trainer, "capo/score_spread")))
    assert len(pairs) == 3
    for tau, spread in pairs:
        if spread is not None:  # NaN (logged as None) when no group is mixed
            assert tau == pytest.approx(0.5 * spread)
    assert any(spread is not None for _, spread in pairs)


def test_auto_thresholds_measure_the_quartile_rule_once(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=True, ref_thresholds="auto", ref_calibration_steps=1,
                   max_steps=3)
    trainer.train()
    highs, lows = logged(trainer, "capo/ref_high"), logged(trainer, "capo/ref_low")
    assert highs and len(set(highs)) == 1 and len(set(lows)) == 1  # measured once, then frozen
    assert highs[0] > 1.0 and lows[0] > 1.0
    assert min(logged(trainer, "capo/kept_frac")) < 1.0  # the rule drops the extreme quartiles


def test_bounded_scale_at_huge_tau_trains_exactly_like_grpo(tiny_model_dir, tmp_path):
    capo = make(tiny_model_dir, tmp_path / "capo", tau=1e9, advantage_scale="bounded", noise_mask=False)
    capo.train()
    grpo = make(tiny_model_dir, tmp_path / "grpo", advantage_estimator="grpo")
    grpo.train()
    for name in ("grad_norm", "reward"):
        assert logged(capo, name) == pytest.approx(logged(grpo, name), rel=1e-4, abs=1e-6)
    mine, reference = params(capo), params(grpo)
    assert all(torch.allclose(mine[n], reference[n], atol=1e-5) for n in reference)


# ----------------------------------------------------------------------------------- bad input, found early
def test_too_little_data_fails_before_the_model_loads(tmp_path):
    from capo_trl.errors import UsageError

    args = CAPOConfig(output_dir=str(tmp_path), **COMMON)  # 8 completions / 4 generations = 2 prompts a batch
    for rows, message in ((0, "empty"), (1, "1 rows, fewer than the 2 distinct prompts")):
        with pytest.raises(UsageError, match=message):
            CAPOTrainer(model="no/such-model", reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(rows))


def test_max_steps_zero_is_refused():
    with pytest.raises(ValueError, match="max_steps=0 .* trains nothing"):
        CAPOConfig(output_dir="unused", **{**COMMON, "max_steps": 0})


def test_prompts_longer_than_the_context(tiny_model_dir, tmp_path):
    from datasets import Dataset

    from capo_trl.errors import UsageError

    def data(length):
        return Dataset.from_list([{"prompt": "1" * length, "answer": "1"}] * 4)

    args = CAPOConfig(output_dir=str(tmp_path), **COMMON)  # the tiny model's context: 256 positions
    with pytest.raises(UsageError, match=r"4 prompt\(s\) \(all 4 checked\) are 300 tokens.*context.*256"):
        CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=data(300))
    with pytest.warns(UserWarning, match=r"plus max_completion_length=8 exceed the model's context of 256"):
        CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=data(250))


def test_infinite_reward_names_the_function(tiny_model_dir, tmp_path):
    from capo_trl.errors import UsageError

    def exploding_reward(completions, **kwargs):
        return [float("inf")] + [1.0] * (len(completions) - 1)

    trainer = make(tiny_model_dir, tmp_path, reward=[digit_reward, exploding_reward], max_steps=1)
    with pytest.raises(UsageError, match=r"reward function 'exploding_reward' returned inf for 1 of 8 completions"):
        trainer.train()


def test_auto_thresholds_say_when_they_cannot_measure(tiny_model_dir, tmp_path, caplog):
    def constant_reward(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = make(tiny_model_dir, tmp_path, reward=constant_reward, noise_mask=True, ref_thresholds="auto",
                   max_steps=2)
    with mask_warns(caplog, r"measured no mask thresholds after 1 generation batch.*stays off"):
        trainer.train()
    assert trainer._mask.measured is None and not logged(trainer, "capo/ref_high")


def test_the_default_mask_never_silently_stops_learning(tiny_model_dir, tmp_path, caplog):
    """Real-valued rewards all >= correct_threshold count as correct; the paper's ref_high drops them all
    on a model whose reference PPL is ~75. The guard keeps that batch in the loss (and says so)."""
    def length_reward(completions, **kwargs):
        return [0.5 + len(c) / 100 for c in completions]  # every completion "correct", distinct rewards

    trainer = make(tiny_model_dir, tmp_path / "guard", reward=length_reward, noise_mask=True)
    before = params(trainer)
    with mask_warns(caplog, "noise_mask_guard"):
        trainer.train()
    assert all(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert logged(trainer, "capo/mask_guard_kept") == [1.0, 1.0, 1.0] and set(logged(trainer, "capo/kept_frac")) == {1.0}
    literal = make(tiny_model_dir, tmp_path / "literal", reward=length_reward, noise_mask=True, noise_mask_guard=False)
    before = params(literal)
    with mask_warns(caplog, "training without correct answers"):
        literal.train()
    assert all(torch.equal(before[n], p) for n, p in literal.model.named_parameters())  # what the guard prevents
    assert set(logged(literal, "capo/kept_frac")) == {0.0}


def test_truncated_flags_are_trls_clipped_rows(tiny_model_dir, tmp_path):
    """truncated_pairs='tied' gets, row by row, the completions TRL clips (no EOS): under
    mask_truncated_completions exactly the rows whose completion mask TRL zeroed."""
    trainer = make(tiny_model_dir, tmp_path, noise_mask=False, truncated_pairs="tied", mask_truncated_completions=True)
    flags, masks = [], []
    advantages, generate = trainer.method.advantages, trainer._generate_and_score_completions
    trainer.method.advantages = lambda batch: (flags.append(batch.truncated), advantages(batch))[1]
    trainer._generate_and_score_completions = lambda inputs: (
        lambda out: (masks.append(out["completion_mask"]), out)[1])(generate(inputs))
    trainer.train()
    assert len(flags) == len(masks) == 3
    for truncated, mask in zip(flags, masks):
        assert truncated.dtype == torch.bool
        assert torch.equal(truncated, mask.sum(1) == 0)
    assert [f.float().mean().item() for f in flags] == logged(trainer, "completions/clipped_ratio")
    assert any(0 < f.float().mean() < 1 for f in flags)  # some rows of each kind (max_completion_length=8)


@pytest.mark.parametrize("masked", [True, False])
def test_warns_once_when_every_completion_is_truncated_and_masked(tiny_model_dir, tmp_path, caplog, masked):
    """min_new_tokens = max_completion_length: no completion can end. Masked out of the loss, the steps train
    nothing (the parameters stay as they were) and the trainer says so once; trained on, no warning."""
    trainer = make(tiny_model_dir, tmp_path, noise_mask=False, max_completion_length=4,
                   generation_kwargs={"min_new_tokens": 4}, mask_truncated_completions=masked)
    before = params(trainer)
    with caplog.at_level(logging.WARNING, logger="capo_trl.training.trainer"):
        trainer.train()
    hits = [r.getMessage() for r in caplog.records if r.name == "capo_trl.training.trainer"]
    assert logged(trainer, "completions/clipped_ratio") == [1.0, 1.0, 1.0]
    unchanged = all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert unchanged == masked
    if masked:
        assert len(hits) == 1 and "global_step 0: all 8 completions of the rollout ran to max_completion_length=4" in hits[0], hits
    else:
        assert hits == []
