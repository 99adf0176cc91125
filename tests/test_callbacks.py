"""CalibrationCallback inside a short CAPOTrainer run: val/* metrics reach log_history."""

import math

import pytest
from eval_helpers import PNG, DigitGrader, one_torch_thread
from capo_trl.testing.tiny import digit_reward, tiny_dataset
from transformers import TrainerControl, TrainerState

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.evaluation.callbacks import CalibrationCallback

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # a fixture, imported to be used by this module


def test_callback_logs_during_capo_training(tiny_model_dir, tmp_path):
    args = CAPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=2, learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False,
        logging_steps=1, save_strategy="no", seed=3, temperature=0.9, noise_mask=True, ref_high=1e6,
        ref_low=1.0,
    )
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    monitor = CalibrationCallback(tiny_dataset(4), every_n_steps=1, n=4, grader=DigitGrader())
    trainer.add_callback(monitor.bind(trainer))
    trainer.train()

    assert [h["step"] for h in monitor.history] == [0, 1, 2]
    logged = [h for h in trainer.state.log_history if "val/auroc" in h]
    assert [h["step"] for h in logged] == [0, 1, 2]
    for entry, hist in zip(logged, monitor.history):
        for key in ("val/mean@4", "val/pass@4", "val/maj@4", "val/pc@4", "val/auroc", "val/auroc_question",
                    "val/auroc_draw", "val/ece", "val/brier", "val/aurc"):
            assert key in entry and key in hist
            assert entry[key] == (None if math.isnan(hist[key]) else hist[key])  # NaN is logged as None
    # TRL's own rollout metrics still reach the regular per-step logs
    assert len([h for h in trainer.state.log_history if "capo/auroc" in h]) == 2
    # sampling follows the trainer's settings, so s is the trainer's score
    cfg = monitor.last_result.config
    assert (cfg["temperature"], cfg["max_new_tokens"], cfg["n"]) == (0.9, 8, 4)
    assert monitor.plot(tmp_path / "fig.png").read_bytes()[:8] == PNG


def test_unbound_callback_says_how_to_bind():
    monitor = CalibrationCallback(tiny_dataset(2), every_n_steps=1)
    with pytest.raises(RuntimeError, match=r"callback.bind\(trainer\)"):
        monitor.on_train_begin(None, TrainerState(), TrainerControl())
    with pytest.raises(ValueError, match="every_n_steps"):
        CalibrationCallback(tiny_dataset(2), every_n_steps=0)
    with pytest.raises(ValueError, match="no evaluation"):
        monitor.plot("never.png")


def test_a_resumed_run_keeps_its_points_and_measures_none_twice(tiny_model_dir, tmp_path):
    """Stopped at step 3 (after the step-2 point) and resumed: the points are 0, 2, 4 as without the stop, and
    the summary starts at step 0, not at the resume."""
    from capo_trl.cli.train import calibration_summary

    def run(max_steps, resume=None):
        args = CAPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
            max_steps=max_steps, learning_rate=1e-2, lr_scheduler_type="constant", bf16=False, use_cpu=True,
            report_to="none", gradient_checkpointing=False, logging_steps=1, save_strategy="steps", save_steps=1,
            seed=3, noise_mask=True, ref_high=1e6, ref_low=1.0,
        )
        trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args,
                              train_dataset=tiny_dataset())
        monitor = CalibrationCallback(tiny_dataset(4), every_n_steps=2, n=4, grader=DigitGrader())
        trainer.add_callback(monitor.bind(trainer))
        trainer.train(resume_from_checkpoint=resume)
        return trainer, monitor

    run(3)
    trainer, monitor = run(4, resume=str(tmp_path / "checkpoint-3"))
    assert [h["step"] for h in monitor.history] == [0, 2, 4]
    assert [h["step"] for h in trainer.state.log_history if "val/auroc" in h] == [0, 2, 4]
    summary = calibration_summary(trainer)
    assert (summary["start"]["step"], summary["end"]["step"]) == (0, 4)
    trainer, monitor = run(4, resume=str(tmp_path / "checkpoint-2"))  # resumed on a point: not measured again
    assert [h["step"] for h in trainer.state.log_history if "val/auroc" in h] == [0, 2, 4]
