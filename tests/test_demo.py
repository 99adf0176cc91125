"""The embedded default: packaged model, arithmetic task, demo / compare / calibrate-mask end to end."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from capo_trl.cli import main
from capo_trl.compare import PRESETS, parse_methods
from capo_trl.data import ArithmeticTask, arithmetic_dataset, embedded_model_path, with_grader_noise
from capo_trl.rewards import MathReward


def test_packaged_model_loads_offline_and_solves_some_problems():
    path = embedded_model_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    prompt = tokenizer("Compute 12+30.", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, prompt.input_ids.shape[1]:], skip_special_tokens=True)
    assert "\\boxed{" in text and "12+30=" in text  # the worked-solution format it was trained on


def test_task_is_deterministic_disjoint_and_graded_correct():
    first, again = arithmetic_dataset("train", 300, seed=5), arithmetic_dataset("train", 300, seed=5)
    assert first.to_list() == again.to_list()
    assert first.to_list() != arithmetic_dataset("train", 300, seed=6).to_list()
    test = arithmetic_dataset("test", 200)
    assert not set(first["prompt"]) & set(test["prompt"])  # hash splits never leak
    with MathReward(timeout=2, workers=1) as reward:
        assert reward(completions=test["solution"], answer=test["answer"]) == [1.0] * 200
    hard = arithmetic_dataset("train", 50, task=ArithmeticTask(min_operands=4, max_operands=4, max_value=99))
    assert set(hard["num_operands"]) == {4}
    with pytest.raises(ValueError, match="min_operands"):
        ArithmeticTask(min_operands=1)


def test_grader_noise_flips_the_requested_fraction_consistently():
    def exact(prompts, completions, **kw):
        return [1.0] * len(completions)

    noisy = with_grader_noise(exact, 0.25, seed=1)
    prompts, completions = [f"p{i}" for i in range(4000)], [f"c{i}" for i in range(4000)]
    grades = noisy(prompts=prompts, completions=completions)
    assert 0.22 < 1 - sum(grades) / len(grades) < 0.28
    assert grades == noisy(prompts=prompts, completions=completions)  # the same completion, the same grade


def test_methods_parse_with_amendments_and_reject_typos():
    (label, overrides), = parse_methods("capo:tau=0.3:noise_mask=false")
    assert overrides == {**PRESETS["capo"], "tau": 0.3, "noise_mask": False} and label.startswith("capo")
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods("capoo")


@pytest.mark.slow
def test_demo_compare_and_calibrate_mask_run_end_to_end(tmp_path, capsys):
    torch.manual_seed(0)
    budget = ["--steps", "2", "--test-problems", "8", "--test-samples", "2", "--no-progress"]
    assert main(["demo", *budget]) == 0
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed and "auroc_question" in printed

    out = tmp_path / "cmp"
    assert main(["compare", "--methods", "grpo,capo", "--seeds", "1", "--out", str(out), "--val-every", "1",
                 "--val-problems", "4", "--val-samples", "2", *budget]) == 0
    for name in ("report.md", "metrics.csv", "final.csv", "summary.json", "val_curves.png", "precision_coverage.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "summary.json").read_text())
    assert set(data["summary"]) == {"start (no RL)", "grpo", "capo"}
    assert data["plotted_points"] == 2 * 3 * 3  # 2 methods x 3 panels x validations at steps 0, 1, 2
    from capo_trl.compare import replot

    assert replot(out, val_samples=2) == data["plotted_points"]  # redrawn from metrics.csv alone

    config = tmp_path / "mask.yaml"
    assert main(["calibrate-mask", "--limit", "8", "--n", "4", "--write-config", str(config)]) == 0
    written = config.read_text()
    assert "ref_high" in written and "ref_low" in written and "tau" in written
