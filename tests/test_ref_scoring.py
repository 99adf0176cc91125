"""ref_scoring="needed": the mask's reference forward skips completions whose verdict cannot change the
loss, and the trained weights are then identical to scoring them all."""

import pytest
import torch
from capo_trl.testing.tiny import digit_reward, tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=5e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1, save_strategy="no",
    seed=5, temperature=1.0, disable_tqdm=True, noise_mask=True, ref_high=1.2, ref_low=1.1,
)


def train(model, out, **overrides):
    trainer = CAPOTrainer(model=model, reward_funcs=digit_reward, train_dataset=tiny_dataset(),
                          args=CAPOConfig(output_dir=str(out), **{**COMMON, **overrides}))
    scored = []
    original = trainer._reference_scores

    def counting(out_, loss_mask, record, want=None):
        scored.append(loss_mask.size(0) if want is None else int(want.sum()))
        return original(out_, loss_mask, record, want)

    trainer._reference_scores = counting
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    return trainer, sum(scored), rows


@pytest.mark.parametrize("loss_type, guard", [("grpo", True), ("dr_grpo", False), ("sapo", True)])
def test_needed_is_exact_where_the_normaliser_ignores_dropped_rows(tiny_model_dir, tmp_path, loss_type, guard):
    kw = dict(loss_type=loss_type, noise_mask_guard=guard)
    full, n_full, _ = train(tiny_model_dir, tmp_path / "all", ref_scoring="all", **kw)
    part, n_part, rows = train(tiny_model_dir, tmp_path / "needed", ref_scoring="needed", **kw)
    assert n_part < n_full, (n_part, n_full)  # the digit task ties groups: something was skipped
    for (name, a), b in zip(full.model.state_dict().items(), part.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(r["capo/ref_scored_frac"] < 1.0 for r in rows[:1])
    auto, n_auto, _ = train(tiny_model_dir, tmp_path / "auto", **kw)
    assert n_auto == n_part  # "auto" picks "needed" for these loss types


def test_auto_scores_everything_where_it_would_not_be_exact(tiny_model_dir, tmp_path):
    _, n_auto, rows = train(tiny_model_dir, tmp_path / "auto", loss_type="dapo")
    assert n_auto == 3 * 8 and not any("capo/ref_scored_frac" in r for r in rows)
    _, n_needed, rows = train(tiny_model_dir, tmp_path / "needed", loss_type="dapo", ref_scoring="needed")
    assert n_needed < n_auto and all("capo/ref_scored_frac" in r for r in rows)


def test_ref_scoring_is_checked():
    with pytest.raises(ValueError, match="ref_scoring"):
        CAPOConfig(output_dir="x", ref_scoring="some")


def by_position(completions, **kwargs):
    """Per batch of two groups of 4: the first group all correct (tied), the second mixed."""
    return [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0][: len(completions)]


def test_rows_the_guard_depends_on_are_scored(tiny_model_dir, tmp_path):
    """Every scored correct answer is dropped (ref_high below every PPL), so whether the guard keeps the
    correct class depends on the tied group's unscored ones: they must be scored, and the weights match."""
    results = []
    for scoring in ("all", "needed"):
        args = CAPOConfig(output_dir=str(tmp_path / scoring), **{**COMMON, "loss_type": "grpo", "ref_scoring": scoring})
        trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=by_position, train_dataset=tiny_dataset(), args=args)
        trainer.train()
        results.append(trainer)
    full, part = results
    for (name, a), b in zip(full.model.state_dict().items(), part.model.state_dict().values()):
        assert torch.equal(a, b), name
    rows = [r for r in part.state.log_history if "loss" in r]
    assert all(r["capo/mask_guard_kept"] > 0 for r in rows)  # the guard fired, as it does when scoring all
    table = part._logs  # TRL's completions table: s, the reference PPL and the verdict per completion
    assert len(table["extra"]["capo_score"]) == len(table["extra"]["ref_ppl"]) == len(table["prompt"])
    assert {type(k) for k in table["extra"]["kept"]} == {bool}
