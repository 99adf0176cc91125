"""Resuming from a checkpoint equals not stopping: weights and logged metrics, for every setting with state
(measured mask thresholds, the reference-score cache, CoDaPO's replay buffer, CDE's schedule)."""

import math
import os
import re
import shutil

import pytest
import torch
from capo_trl.testing.tiny import digit_reward, tiny_dataset
from transformers import TrainerCallback

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.errors import UsageError
from capo_trl.training.checkpoint import CAPO_STATE
from capo_trl.training.resume import checkpoint_problem, resume_checkpoint

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
    assert resumed._drift.state_dict() == straight._drift.state_dict()  # it warns as if never stopped
    assert straight._drift.steps == 4
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), f"{setting}: {name} differs by {(p - q).abs().max().item():.3g}"
    rows_a, rows_b = logged_after(straight, 2), logged_after(resumed, 2)
    assert [r["step"] for r in rows_a] == [3, 4] and [r["step"] for r in rows_b] == [3, 4]
    for a, b in zip(rows_a, rows_b):
        assert set(a) == set(b), setting
        diff = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
        assert not diff, f"{setting}: logged metrics differ after resume: {diff}"


@pytest.fixture(scope="module")
def saved_run(tiny_model_dir, tmp_path_factory):
    """A 3-step run with the mask's auto thresholds stopped after step 2, checkpointed after each step."""
    out = tmp_path_factory.mktemp("saved-run")
    trainer = make(tiny_model_dir, out, max_steps=3, save_steps=1, **SETTINGS["mask-auto"])
    trainer.add_callback(StopAt(2))
    trainer.train()
    return out


def broken_copy(saved_run, tmp_path, damage):
    """A copy of ``saved_run`` whose checkpoint-2 had ``damage(folder)`` done to it."""
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    damage(out / "checkpoint-2")
    return out


def cut(name, keep=0.5):
    def damage(folder):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:int(len(data) * keep)])
    return damage


def remove(name):
    return lambda folder: (folder / name).unlink()


DAMAGE = {  # what a process killed while saving can leave, and how checkpoint_problem names it
    "capo-state-missing": (remove(CAPO_STATE), "no capo_state.pt"),
    "capo-state-cut": (cut(CAPO_STATE), "capo_state.pt cut short"),
    "trainer-state-missing": (remove("trainer_state.json"), "no trainer_state.json"),
    "trainer-state-cut": (cut("trainer_state.json"), "trainer_state.json cut short"),
    "weights-cut": (cut("model.safetensors", 0.9), "model.safetensors cut short"),
    "weights-missing": (remove("model.safetensors"), "no model weights"),
    "optimizer-cut": (cut("optimizer.pt", 0.99), "optimizer.pt cut short"),
    "optimizer-missing": (remove("optimizer.pt"), "no optimizer.pt"),
    "rng-missing": (remove("rng_state.pth"), "no rng_state.pth"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_an_incomplete_checkpoint_is_recognised(case, saved_run, tmp_path):
    damage, problem = DAMAGE[case]
    assert checkpoint_problem(str(saved_run / "checkpoint-2")) is None
    out = broken_copy(saved_run, tmp_path, damage)
    assert checkpoint_problem(str(out / "checkpoint-2")) == problem
    with pytest.warns(UserWarning, match=f"skipping incomplete checkpoint-2 \\({re.escape(problem)}\\).*resuming from .*checkpoint-1"):
        assert resume_checkpoint(True, str(out)) == str(out / "checkpoint-1")
    with pytest.raises(UsageError, match=f"checkpoint-2 is incomplete \\({re.escape(problem)};.*resume from .*checkpoint-1, the newest"):
        resume_checkpoint(str(out / "checkpoint-2"), str(out))


def test_trls_adaptive_entropy_state_is_required_when_the_run_uses_it(saved_run):
    """TRL writes it after the checkpoint is otherwise complete and skips it silently when absent."""
    folder, name = str(saved_run / "checkpoint-2"), "entropy_ctrl_state.json"
    assert checkpoint_problem(folder, needs_json=(name,)) == f"no {name}"
    (saved_run / "checkpoint-2" / name).write_text('{"entropy_coef": 0.')
    try:
        assert checkpoint_problem(folder, needs_json=(name,)) == f"{name} cut short"
        assert checkpoint_problem(folder) is None  # a run without adaptive entropy does not read it
    finally:
        (saved_run / "checkpoint-2" / name).unlink()


def test_no_complete_checkpoint_is_refused_in_one_line(saved_run, tmp_path):
    out = broken_copy(saved_run, tmp_path, remove(CAPO_STATE))
    (out / "checkpoint-1" / "trainer_state.json").unlink()
    with pytest.raises(UsageError, match="holds no complete checkpoint: .*checkpoint-2 is incomplete") as err:
        resume_checkpoint(True, str(out))
    assert "\n" not in str(err.value) and "--overwrite_output_dir true" in str(err.value)


def test_a_finished_run_is_not_resumed(saved_run):
    """Transformers trains one step more when resumed at max_steps: refused, naming the checkpoint that is the model."""
    with pytest.raises(UsageError, match="checkpoint-2 is step 2 of max_steps=2: that run is finished"):
        resume_checkpoint(True, str(saved_run), max_steps=2)
    assert resume_checkpoint(True, str(saved_run), max_steps=3) == str(saved_run / "checkpoint-2")
    assert resume_checkpoint(True, str(saved_run)) == str(saved_run / "checkpoint-2")  # its own max_steps: 3


def test_resume_skips_an_incomplete_checkpoint_and_equals_not_stopping(saved_run, tiny_model_dir, tmp_path):
    """A kill between transformers' files and CAPO's (what the old order allowed) is no longer a silent re-measure."""
    straight = make(tiny_model_dir, tmp_path / "straight", max_steps=3, save_steps=1, **SETTINGS["mask-auto"])
    straight.train()
    out = broken_copy(saved_run, tmp_path, remove(CAPO_STATE))
    resumed = make(tiny_model_dir, out, max_steps=3, save_steps=1, **SETTINGS["mask-auto"])
    with pytest.warns(UserWarning, match="skipping incomplete checkpoint-2"):
        resumed.train(resume_from_checkpoint=True)
    assert [r["step"] for r in resumed.state.log_history if "loss" in r] == [1, 2, 3]
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    assert checkpoint_problem(str(out / "checkpoint-2")) is None  # written again, whole


def test_capo_state_is_in_the_checkpoint_before_transformers_writes_it(tiny_model_dir, tmp_path):
    """CAPO's file lands before the weights (so before trainer_state.json and any rotation), atomically."""
    seen = []

    class Watching(CAPOTrainer):
        def save_model(self, output_dir=None, _internal_call=False):
            if _internal_call:
                seen.append(sorted(os.listdir(output_dir)))
            return super().save_model(output_dir, _internal_call)

    args = CAPOConfig(output_dir=str(tmp_path / "run"), **{**COMMON, "max_steps": 2, "save_steps": 1,
                                                            "save_total_limit": 1, **SETTINGS["mask-auto"]})
    Watching(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset()).train()
    assert seen == [[CAPO_STATE], [CAPO_STATE]]
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-2"]


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
