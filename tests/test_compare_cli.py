"""`capo-trl compare`: validation before training, results saved per run, resume, refusals.

Training and test evaluation are replaced by fakes: these tests check the harness, in seconds.
The real end-to-end run is `test_demo.py::test_demo_compare_and_calibrate_mask_run_end_to_end`.
"""

import csv
import json
from types import SimpleNamespace

import pytest

from capo_trl.cli.main import main
from capo_trl.harness import runs
from capo_trl.harness.presets import Budget, method_config

BUDGET = ["--steps", "2", "--test_problems", "4", "--test_samples", "2", "--val_every", "1", "--val_problems", "4",
          "--val_samples", "2", "--no_progress"]


def _result(acc: float, n: int = 2):
    return SimpleNamespace(metrics={f"mean@{n}": acc, "auroc": 0.9, "auroc_question": 0.8, "ece": 0.1},
                           curves={"precision_coverage": {"coverage": [0.5, 1.0], "precision": [1.0, acc]}})


@pytest.fixture
def fake(monkeypatch):
    """Records every training run and start-model evaluation; ``fail`` makes one run raise."""
    calls = SimpleNamespace(trained=[], start=0, fail=None)

    def train_method(overrides, seed, budget, out_dir):
        label = out_dir.name.rsplit("-seed", 1)[0]
        if calls.fail == (label, seed):
            raise RuntimeError("run crashed")
        calls.trained.append((label, seed))
        history = [{"step": s, "val/mean@2": 0.1 * s, "val/auroc": 0.9, "val/auroc_question": float("nan")}
                   for s in range(budget.steps + 1)]
        return None, history, _result(0.5 + 0.1 * seed)

    def evaluate_test(model, tokenizer, budget, seed):
        calls.start += 1
        return _result(0.3)

    monkeypatch.setattr(runs, "train_method", train_method)
    monkeypatch.setattr(runs, "evaluate_test", evaluate_test)
    return calls


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("capo-trl compare: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_a_typo_in_any_method_is_refused_before_training(fake, tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--methods", "grpo,capo:tauu=0.3", "--seeds", "1", "--out", str(out), *BUDGET])
    assert rc == 2
    _one_line_error(capsys, "capo:tauu=0.3", "'tauu'", "did you mean 'tau'")
    assert fake.trained == [] and fake.start == 0 and not out.exists()


@pytest.mark.parametrize("methods, needles", [
    ("grpo,capo:tau=-1", ["capo:tau=-1", "tau"]),
    ("grpo,capo:seed=3", ["capo:seed=3", "seed", "--first_seed"]),
    ("grpo,grpo", ["grpo", "twice"]),
    ("grpo,capoo", ["capoo", "did you mean 'capo'"]),
    ("capo:tau=[", ["capo:tau=["]),
])
def test_bad_method_values_are_one_line_errors(fake, tmp_path, capsys, methods, needles):
    assert main(["compare", "--methods", methods, "--seeds", "1", "--out", str(tmp_path / "o"), *BUDGET]) == 2
    _one_line_error(capsys, *needles)
    assert fake.trained == [] and fake.start == 0


@pytest.mark.parametrize("flag, value", [
    ("--seeds", "0"), ("--steps", "0"), ("--test_problems", "0"), ("--test_samples", "0"), ("--val_every", "0"),
    ("--val_problems", "0"), ("--val_samples", "0"), ("--learning_rate", "0"), ("--grader_noise", "1.5"),
    ("--first_seed", "-1"),
])
def test_bad_numbers_are_one_line_errors(fake, tmp_path, capsys, flag, value):
    rc = main(["compare", "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "o"), *BUDGET, flag, value])
    assert rc == 2
    _one_line_error(capsys, flag)
    assert fake.trained == [] and fake.start == 0


def test_missing_model_is_a_one_line_error(fake, tmp_path, capsys):
    rc = main(["compare", "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "o"), *BUDGET,
               "--model", str(tmp_path / "no-such-model")])
    assert rc == 2
    _one_line_error(capsys, "no-such-model", "no such directory")
    assert fake.trained == [] and fake.start == 0


def test_finished_runs_survive_a_crash_and_a_rerun_trains_only_the_missing_ones(fake, tmp_path, capsys):
    out = tmp_path / "cmp"
    cmd = ["compare", "--methods", "grpo,capo", "--seeds", "1", "--out", str(out), *BUDGET]
    fake.fail = ("capo", 0)
    with pytest.raises(RuntimeError, match="run crashed"):
        main(cmd)
    saved = json.loads((out / "runs" / "grpo-seed0" / "result.json").read_text())
    assert saved["method"] == "grpo" and saved["seed"] == 0 and len(saved["history"]) == 3
    assert saved["headline"]["accuracy"] == 0.5
    report = (out / "report.md").read_text()  # the partial comparison is readable
    assert "| grpo |" in report and "| capo |" not in report and "1 of 2 runs" in report
    with (out / "final.csv").open() as f:
        assert [r["method"] for r in csv.DictReader(f)] == ["start (no RL)", "grpo"]
    assert fake.trained == [("grpo", 0)] and fake.start == 1
    capsys.readouterr()

    fake.fail = None
    assert main(cmd) == 0  # the same command resumes: grpo and the start model are reused
    assert fake.trained == [("grpo", 0), ("capo", 0)] and fake.start == 1
    data = json.loads((out / "summary.json").read_text())
    assert set(data["summary"]) == {"start (no RL)", "grpo", "capo"} and data["complete"] is True
    assert (out / "val_curves.png").stat().st_size > 0
    assert "| capo |" in (out / "report.md").read_text()

    # more seeds on the same budget: only the new seed is trained
    assert main([*cmd[:4], "2", *cmd[5:]]) == 0
    assert fake.trained[2:] == [("grpo", 1), ("capo", 1)] and fake.start == 1
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["method"], r["seed"]) for r in rows} == {("grpo", "0"), ("capo", "0"), ("grpo", "1"), ("capo", "1")}


def test_a_rerun_with_another_budget_or_methods_is_refused_unless_overwrite(fake, tmp_path, capsys):
    out = tmp_path / "cmp"
    cmd = ["compare", "--methods", "grpo", "--seeds", "1", "--out", str(out), *BUDGET]
    assert main(cmd) == 0
    capsys.readouterr()
    assert main([*cmd, "--steps", "3"]) == 2
    _one_line_error(capsys, "steps", "--overwrite")
    assert main(["compare", "--methods", "capo", *cmd[3:]]) == 2
    _one_line_error(capsys, "methods", "--overwrite")
    assert fake.trained == [("grpo", 0)]
    assert main([*cmd, "--steps", "3", "--overwrite"]) == 0
    assert fake.trained == [("grpo", 0), ("grpo", 0)] and fake.start == 2
    assert json.loads((out / "runs" / "grpo-seed0" / "result.json").read_text())["budget"]["steps"] == 3


def test_a_non_empty_output_directory_is_refused_unless_overwrite(fake, tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cmd = ["compare", "--methods", "grpo", "--seeds", "1", "--out", str(out), *BUDGET]
    assert main(cmd) == 2
    _one_line_error(capsys, "notes.txt", "--overwrite")
    assert fake.trained == []
    assert main([*cmd, "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "report.md").is_file()
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    assert main(["compare", "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "file"), *BUDGET]) == 2
    _one_line_error(capsys, "is a file")


def test_train_method_and_validation_build_the_same_config(tmp_path):
    budget = Budget(steps=3, val_every=1)
    args = method_config({"advantage_estimator": "capo", "tau": 0.3}, 7, budget, tmp_path / "r")
    assert (args.max_steps, args.seed, args.tau, args.num_generations) == (3, 7, 0.3, budget.num_generations)
    assert args.per_device_train_batch_size == budget.prompts_per_step * budget.num_generations


def test_console_shows_a_bar_and_the_table_not_metric_dicts(tiny_model_dir, tmp_path, capsys):
    """A real (tiny) comparison: TRL's per-step metric dicts stay in the logs, not on the console."""
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "grpo", "--seeds", "1", "--steps", "3", "--model", tiny_model_dir, "--out",
            str(out), "--test_problems", "2", "--test_samples", "2", "--val_every", "2", "--val_problems", "2",
            "--val_samples", "2"]
    assert main(argv) == 0
    console = capsys.readouterr()
    assert "{'loss'" not in console.out + console.err and "'learning_rate'" not in console.out + console.err
    report = (out / "report.md").read_text()
    assert "1 seed per method" in report and "±" not in report  # one seed: no spread printed
    result = json.loads(next((out / "runs").glob("grpo-seed0/result.json")).read_text())
    assert result["headline"]  # the metrics themselves are kept
