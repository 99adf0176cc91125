"""scripts/results_real.py's exploratory reading of a real-model study's training logs: which runs logged a window
of only truncated completions, and whether they trained again (the study's arms and rules from its study.yaml)."""

import dataclasses
import json

from script_loader import load_script


def log(*windows):
    """Training-log entries every 5 steps from (clipped ratio, gradient norm) pairs."""
    return [{"step": 5 * (i + 1), "completions/clipped_ratio": c, "grad_norm": g} for i, (c, g) in enumerate(windows)]


def test_the_first_all_truncated_log_and_what_followed():
    real = load_script("results_real")
    assert real.all_truncated_from(log((0.1, 0.2), (0.99, 0.0))) is None  # 0.99 is not every completion
    assert real.all_truncated_from(log((0.1, 0.2), (1.0, 0.0), (1.0, 0.0), (0.994, 0.0))) == \
        {"step": 10, "lowest_clipped_after": 0.994, "gradient_after": False}
    assert real.all_truncated_from(log((1.0, 0.0), (0.5, 0.3))) == \
        {"step": 5, "lowest_clipped_after": 0.5, "gradient_after": True}
    assert real.all_truncated_from(log((0.2, 0.1), (1.0, 0.0))) == \
        {"step": 10, "lowest_clipped_after": None, "gradient_after": False}  # the last log: nothing after it


def test_its_block_counts_per_arm_and_says_whether_any_trained_again(tmp_path, monkeypatch):
    """The study's arms, seeds and collapse rule from its study.yaml; the records from a folder of two seeds."""
    real = load_script("results_real")
    folder = tmp_path / "smollm2-study"
    folder.mkdir()
    study = dataclasses.replace(real.study("smollm2-study"), folder=folder, seeds=[100, 101])
    healthy, stuck = log((0.1, 0.2), (0.4, 0.1)), log((0.3, 0.2), (1.0, 0.0), (1.0, 0.0))
    for arm in study.arms:
        (folder / arm).mkdir()
        for seed in (100, 101):
            drifted = arm != "grpo" and seed == 101
            rec = {"train": stuck if drifted else healthy, "mean_tokens": 32.0 if drifted else 23.0,
                   "finished_frac": 0.0 if drifted else 0.9}
            (folder / arm / f"seed{seed}.json").write_text(json.dumps(rec))
    monkeypatch.setattr(real, "study", lambda name: study)
    block = real.render_real_stuck("smollm2-study")
    assert "| `grpo` | 2 | 0 | - | - | 0 | 0.40 | 0 |" in block
    assert "| `capo-nomask` | 2 | 1 | 10-10 | 1.000 | 0 | 0.40 | 1 |" in block
    assert block.endswith("Of the 3 that logged again after it, the lowest clipped ratio logged was 1.000 and 0 "
                          "logged a gradient again (with `mask_truncated_completions` a truncated completion is out "
                          "of the loss, so a step whose completions all ran to the limit trains nothing).\n")
    recovered = {"train": log((1.0, 0.0), (0.2, 0.5)), "mean_tokens": 23.0, "finished_frac": 0.9}
    (folder / "grpo" / "seed100.json").write_text(json.dumps(recovered))
    block = real.render_real_stuck("smollm2-study")
    assert "| `grpo` | 2 | 1 | 5-5 | 0.200 | 1 | 0.40 | 0 |" in block
    assert block.endswith("the lowest clipped ratio logged was 0.200 and 1 logged a gradient again.\n")
