"""skip_zero_advantage_rows: rows whose advantage is exactly zero leave the loss forward and backward, and
the trained weights equal those of a run that forwards every row.

Tolerance: plain SGD, so a weight differs only by what the gradient differs, and the gradient only
by the order of its float32 sums (fewer rows in the batch matmuls). Measured: <= 4e-9 after 3 steps
(one or two ulps of weights of magnitude ~0.01-1); ATOL = 1e-7 is one ulp at 1.0, while every run below
moves its weights by more than MOVED = 1e-4, so a changed normaliser (a factor 2 here: half the rows
tie) or a skipped row that carried gradient would be ~1000x over the tolerance.
"""

import pytest
import torch
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer

ATOL, MOVED = 1e-7, 1e-4
COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=5e-2,
    optim="sgd", bf16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=5,
    disable_tqdm=True,
)


def half_tied(completions, **kwargs):
    """Per batch of two groups of 4: the first all right (tied: advantage 0), the second mixed."""
    return [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0][: len(completions)]


def train(model, out, reward=half_tied, peft_config=None, **overrides):
    trainer = CAPOTrainer(model=model, reward_funcs=reward, train_dataset=tiny_dataset(), peft_config=peft_config,
                          args=CAPOConfig(output_dir=str(out), **{**COMMON, **overrides}))
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return trainer, start


def assert_same_weights(tiny_model_dir, tmp_path, reward=half_tied, peft_config=None, **overrides):
    """Skipping off and on: weights equal to ATOL, the run moved them, and rows were skipped."""
    off, start = train(tiny_model_dir, tmp_path / "off", reward, peft_config, skip_zero_advantage_rows=False,
                       **overrides)
    on, _ = train(tiny_model_dir, tmp_path / "on", reward, peft_config, skip_zero_advantage_rows=True, **overrides)
    assert not off._skip_rows and on._skip_rows
    moved = 0.0
    for (name, a), b in zip(off.model.state_dict().items(), on.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
        moved = max(moved, (a - start[name]).abs().max().item())
    assert moved > MOVED
    rows = [r for r in on.state.log_history if "loss" in r]
    assert all(r["capo/skipped_frac"] > 0 for r in rows) and not any("capo/skipped_frac" in r for r in
                                                                     off.state.log_history)
    for r_off, r_on in zip([r for r in off.state.log_history if "loss" in r], rows):
        assert r_on.get("reward") == r_off.get("reward")  # the same completions were sampled
        assert r_on["loss"] == pytest.approx(r_off["loss"], rel=1e-4, abs=1e-7)  # logged, from the same drift
    return on


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo", "luspo", "vespo"])
@pytest.mark.parametrize("num_iterations", [1, 2])
def test_weights_equal_a_run_that_forwards_every_row(tiny_model_dir, tmp_path, loss_type, num_iterations):
    on = assert_same_weights(tiny_model_dir, tmp_path, loss_type=loss_type, num_iterations=num_iterations)
    assert {r["capo/skipped_frac"] for r in on.state.log_history if "loss" in r} == {0.5}  # one tied group of two


def test_gradient_accumulation_and_the_mask(tiny_model_dir, tmp_path):
    """Two micro-batches per step, and the noise mask dropping rows (ref_high below every PPL of the random
    model drops every correct answer, and the guard is off): dropped rows are skipped too."""
    on = assert_same_weights(tiny_model_dir, tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             noise_mask=True, noise_mask_guard=False, ref_high=1.5, ref_low=1.0,
                             loss_type="dapo")
    rows = [r for r in on.state.log_history if "loss" in r]
    assert all(r["capo/kept_frac"] < 1.0 for r in rows) and max(r["capo/skipped_frac"] for r in rows) > 0.5


def test_a_lora_adapter(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian")
    assert_same_weights(tiny_model_dir, tmp_path, peft_config=lora)


@pytest.mark.parametrize("method", ["simko", "dcpo", "scapo", "cde"])
def test_methods_whose_loss_reads_only_the_advantage_of_such_rows(tiny_model_dir, tmp_path, method):
    """SimKO's log-probs (full logits), DCPO's and SCAPO's per-token advantages, CDE's shaped rewards."""
    assert_same_weights(tiny_model_dir, tmp_path, advantage_estimator=method, max_steps=2)


def test_default_is_on_where_exact_and_off_for_grpo():
    base = dict(output_dir="x", use_cpu=True, bf16=False)
    from capo_trl.methods import resolve_method
    from capo_trl.training.skipping import resolve_skipping

    def resolved(**kw):
        config = CAPOConfig(**base, **kw)
        return resolve_skipping(config, resolve_method(config.advantage_estimator)(config))

    assert resolved() and resolved(loss_type="dapo") and resolved(advantage_estimator="dr_grpo")
    assert not resolved(advantage_estimator="grpo")  # the bit-for-bit drop-in
    assert resolved(advantage_estimator="grpo", skip_zero_advantage_rows=True)
    assert not resolved(beta=0.04) and not resolved(entropy_coef=0.01) and not resolved(top_entropy_quantile=0.5)
    assert not resolved(advantage_estimator="c2gspg")  # its calibration term reads every row


@pytest.mark.parametrize("kw, named", [
    (dict(beta=0.04), "beta=0.04"), (dict(entropy_coef=0.01), "entropy bonus"),
    (dict(top_entropy_quantile=0.2), "top_entropy_quantile=0.2"), (dict(advantage_estimator="c2gspg"), "c2gspg"),
])
def test_on_where_not_exact_is_refused(kw, named):
    with pytest.raises(ValueError, match=rf"skip_zero_advantage_rows=True is not exact with .*{named}"):
        CAPOConfig(output_dir="x", use_cpu=True, bf16=False, skip_zero_advantage_rows=True, **kw)
    with pytest.raises(ValueError, match="skip_zero_advantage_rows='yes' is invalid"):
        CAPOConfig(output_dir="x", use_cpu=True, bf16=False, skip_zero_advantage_rows="yes")


def test_a_micro_batch_without_advantages_still_runs_one_row(tiny_model_dir, tmp_path):
    """Every group ties: one row per micro-batch is still forwarded (a graph, and collective backwards)."""
    on, start = train(tiny_model_dir, tmp_path / "on", lambda completions, **kw: [1.0] * len(completions),
                      skip_zero_advantage_rows=True, max_steps=2)
    rows = [r for r in on.state.log_history if "loss" in r]
    assert [r["capo/skipped_frac"] for r in rows] == [7 / 8, 7 / 8] and all(r["loss"] == 0.0 for r in rows)
    for name, value in on.model.state_dict().items():
        assert torch.equal(value, start[name]), name  # no advantage, no gradient: SGD leaves the weights


def test_grpo_mode_with_skipping_on_equals_grpotrainer(tiny_model_dir, tmp_path):
    """TRL's GRPOTrainer against CAPOTrainer in "grpo" mode: bit for bit with the default (off, tested in
    test_trainer.py), and to ATOL with skipping on."""
    from trl import GRPOConfig, GRPOTrainer

    theirs = GRPOTrainer(model=tiny_model_dir, reward_funcs=half_tied, train_dataset=tiny_dataset(),
                         args=GRPOConfig(output_dir=str(tmp_path / "trl"), **COMMON))
    theirs.train()
    ours, _ = train(tiny_model_dir, tmp_path / "ours", advantage_estimator="grpo", skip_zero_advantage_rows=True)
    for (name, a), b in zip(theirs.model.state_dict().items(), ours.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
    rows = [r for r in ours.state.log_history if "loss" in r]
    assert all(r["capo/skipped_frac"] == 0.5 for r in rows)


@pytest.mark.parametrize("advantages, mask, rows", [
    ([0.0, 0.5, 0.0, -0.5], [[1, 1], [1, 0], [1, 1], [1, 1]], [1, 3]),  # the rows with an advantage
    ([0.0, 0.0, 0.0], [[1, 1], [1, 0], [1, 1]], [0]),  # none: one row still runs
    ([0.0, 0.0, 0.0], [[0, 0], [1, 1], [1, 0]], [1]),  # ...one that has loss tokens
    ([0.0, 0.5, 0.0], [[0, 0], [0, 0], [1, 0]], [1, 2]),  # the forwarded rows have none: one more that has
    ([0.0, 0.0], [[0, 0], [0, 0]], [0]),  # no row has tokens: the logged entropy is TRL's 0 either way
    ([float("nan"), 0.0], [[1, 1], [1, 1]], [0]),
])
def test_rows_to_forward(advantages, mask, rows):
    """Discrete: which rows run. The extra row has loss tokens whenever any row has, so the skipped rows' filled
    entropy is the forwarded rows' mean and the logged entropy is never a made-up 0."""
    from capo_trl.training.skipping import rows_to_forward

    assert rows_to_forward(torch.tensor(advantages), torch.tensor(mask)).tolist() == rows
