"""Resuming from a checkpoint equals not stopping: weights and logged metrics, for every setting with state
(measured mask thresholds, the reference-score cache, CoDaPO's replay buffer, CDE's schedule)."""

import math

import pytest
import torch
from capo_trl.testing.tiny import digit_reward, tiny_dataset
from transformers import TrainerCallback

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.training.checkpoint import CAPO_STATE

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=4, learning_rate=5e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1, save_strategy="steps",
    save_steps=2, seed=11, temperature=1.0, disable_tqdm=True,
)
SETTINGS = {
    # thresholds measured on step 1; a resume that re-measured them on the trained policy would differ
    "mask-auto": dict(noise_mask=True, ref_thresholds="auto"),
    # the cache is hit on repeated completions; the mask wide open so that every sample is scored
    "mask-fixed-cache": dict(noise_mask=True, ref_high=1e6, ref_low=1.0, ref_cache_size=64),
    "codapo-replay": dict(advantage_estimator="codapo", codapo_replay=True),
    "cde": dict(advantage_estimator="cde", cde_stair_steps=1, cde_stairs=4),
}


class StopAt(TrainerCallback):
    """Stops training after ``step`` (the checkpoint of that step is written first), like a killed job."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def make(model, out, **overrides):
    args = CAPOConfig(output_dir=str(out), **{**COMMON, **overrides})
    return CAPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())


def logged_after(trainer, step):
    return [{k: v for k, v in row.items() if k != "epoch" and "time" not in k and "per_second" not in k}
            for row in trainer.state.log_history if row.get("step", 0) > step and "loss" in row]


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_resume_equals_uninterrupted(setting, tiny_model_dir, tmp_path):
    overrides = SETTINGS[setting]
    straight = make(tiny_model_dir, tmp_path / "straight", **overrides)
    straight.train()

    stopped = make(tiny_model_dir, tmp_path / "stopped", **overrides)
    stopped.add_callback(StopAt(2))
    stopped.train()
    assert stopped.state.global_step == 2 and (tmp_path / "stopped" / "checkpoint-2" / CAPO_STATE).is_file()
    if setting == "mask-auto":
        assert stopped._mask.measured is not None  # there is state to lose
    if setting == "codapo-replay":
        assert stopped._method_state.state_dict() != {"pending": None, "deferred": [], "replaying": False}

    resumed = make(tiny_model_dir, tmp_path / "stopped", **overrides)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), f"{setting}: {name} differs by {(p - q).abs().max().item():.3g}"
    rows_a, rows_b = logged_after(straight, 2), logged_after(resumed, 2)
    assert [r["step"] for r in rows_a] == [3, 4] and [r["step"] for r in rows_b] == [3, 4]
    for a, b in zip(rows_a, rows_b):
        assert set(a) == set(b), setting
        diff = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not diff, f"{setting}: logged metrics differ after resume: {diff}"


def test_checkpoint_without_capo_state_warns(tiny_model_dir, tmp_path):
    """A checkpoint written without CAPO's state (older version) resumes, but says what starts afresh."""
    trainer = make(tiny_model_dir, tmp_path / "run", max_steps=2, **SETTINGS["mask-auto"])
    trainer.train()
    (tmp_path / "run" / "checkpoint-2" / CAPO_STATE).unlink()
    again = make(tiny_model_dir, tmp_path / "run", max_steps=3, **SETTINGS["mask-auto"])
    with pytest.warns(UserWarning, match="measured mask thresholds.*start afresh"):
        again.train(resume_from_checkpoint=True)


def test_codapo_deferred_batches_are_resplit_for_another_process_count():
    from capo_trl.methods.codapo import CoDaPOReplay

    two = [{"pending": ["p"], "deferred": [["a0", "a1"], ["c0", "c1"]], "replaying": True},
           {"pending": ["p"], "deferred": [["b0", "b1"], ["d0", "d1"]], "replaying": True}]
    one = CoDaPOReplay.reshard(two, 0, 1, local_size=4)  # the global batches, in process order
    assert one == {"pending": ["p"], "deferred": [["a0", "a1", "b0", "b1"], ["c0", "c1", "d0", "d1"]],
                   "replaying": True}
    assert CoDaPOReplay.reshard([one], 1, 2, local_size=2)["deferred"] == [["b0", "b1"], ["d0", "d1"]]
    with pytest.raises(ValueError, match="keep the global batch size"):
        CoDaPOReplay.reshard(two, 0, 3, local_size=2)


def test_a_checkpoint_of_two_processes_resumes_on_one(tiny_model_dir, tmp_path):
    """Every process gets the same measured thresholds; pooled caches; a state that cannot be re-split is refused."""
    from capo_trl.errors import UsageError

    trainer = make(tiny_model_dir, tmp_path / "a", ref_high=1e6, ref_low=1.0, noise_mask=True,
                   ref_thresholds="auto", ref_cache_size=8)
    mask = {"measured_thresholds": (3.0, 2.0), "threshold_samples": [], "warned": []}
    cache = lambda key, value: {"keys": torch.tensor([list(key)], dtype=torch.uint8),  # noqa: E731
                                "values": torch.tensor([value], dtype=torch.float64)}
    parts = [{"mask": mask, "ref_cache": cache(b"k" * 16, -1.0)}, {"mask": mask, "ref_cache": cache(b"j" * 16, -2.0)}]
    trainer._restore(parts, 0, 1, "ckpt")
    assert trainer._mask.measured == (3.0, 2.0) and len(trainer._ref_cache) == 2

    class Unsplittable:  # a method state (a user's method) without ``reshard``
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            raise AssertionError("loaded a state written for another process layout")

    trainer._method_state = Unsplittable()
    with pytest.raises(UsageError, match="written by 2 processes and this run has 1.*resume with 2 processes"):
        trainer._restore([{"method_state": {}}] * 2, 0, 1, "ckpt")
