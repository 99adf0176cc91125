"""scripts/real_lr.py: its arms are the study's at a third of the learning rate, and its summary applies the
protocol's checks and decisions (written before the pilot's runs)."""

import json

import pytest

from script_loader import load_script


def test_arms_are_the_study_arms_at_a_third_of_the_learning_rate():
    lr, study = load_script("real_lr"), load_script("real_study")
    assert list(lr.ARMS) == ["grpo-lr3e-4", "capo-nomask-lr3e-4"]
    for arm, base in zip(lr.ARMS, ("grpo", "capo-nomask")):
        recipe, flags = lr.ARMS[arm]
        assert (recipe, flags[:-2]) == study.ARMS[base] and flags[-2:] == ["--learning_rate", "3e-4"]
    assert "entropy" in lr.LOG and set(study.TRAIN_LOG) < set(lr.LOG)


def test_the_study_cli_takes_the_learning_rate_over_the_recipe():
    """The flag the runner appends wins over the recipe's 1e-3 (parsed, not trained; the GRPO recipe's, since the
    CAPO recipe's is 3e-4 now)."""
    lr = load_script("real_lr")
    from capo_trl.cli.train_args import parse_args

    recipe, flags = lr.ARMS["grpo-lr3e-4"]
    assert "learning_rate: 1.0e-3" in (lr.ROOT / recipe).read_text()
    _, training_args, _ = parse_args(["--config", str(lr.ROOT / recipe), "--dataset_name", "addition", *flags,
                                      "--output_dir", "unused"])
    assert training_args.learning_rate == pytest.approx(3e-4) and training_args.mask_truncated_completions


START = {"accuracy": 0.27, "auroc": 0.86, "mean_tokens": 23.7, "finished_frac": 0.95}


def write(folder, arm, seed, **rec):
    (folder / arm).mkdir(parents=True, exist_ok=True)
    (folder / arm / f"seed{seed}.json").write_text(json.dumps({**START, **rec}))


@pytest.fixture
def pilot(tmp_path, monkeypatch):
    lr = load_script("real_lr")
    monkeypatch.setattr(lr, "OUT", tmp_path / "lr")
    (tmp_path / "start.json").write_text(json.dumps(START))
    monkeypatch.setattr(lr, "START", tmp_path / "start.json")
    return lr, tmp_path / "lr"


def test_checks_are_the_study_rule_and_the_pilots_criterion(pilot):
    lr, _ = pilot
    start = START
    loses = {**START, "accuracy": 0.29, "auroc": 0.83}  # exactly at both margins, no collapse
    assert lr.checks(loses, start) == {"collapsed": False, "accuracy_rises": True, "auroc_falls": True,
                                       "loses_calibration": True, "trains": True}
    keeps = {**loses, "auroc": 0.8301}
    assert lr.checks(keeps, start)["loses_calibration"] is False and lr.checks(keeps, start)["trains"] is True
    drifted = {**loses, "mean_tokens": 30.0, "auroc": 0.5}
    assert lr.checks(drifted, start) == {"collapsed": True, "accuracy_rises": True, "auroc_falls": True,
                                         "loses_calibration": False, "trains": False}
    assert lr.checks({**loses, "finished_frac": 0.49}, start)["collapsed"] is True


@pytest.mark.parametrize("capo_drifts, grpo_keeps, candidate, recipe_lr", [
    (False, False, True, "3e-4"), (True, False, False, None), (False, True, False, "3e-4")])
def test_summary_decides_only_once_all_six_ran(pilot, capo_drifts, grpo_keeps, candidate, recipe_lr):
    lr, folder = pilot
    for seed in lr.SEEDS:
        write(folder, lr.GRPO, seed, accuracy=0.35, auroc=0.80 if not (grpo_keeps and seed == 102) else 0.85)
        if seed != 102:
            write(folder, lr.CAPO, seed, accuracy=0.33, auroc=0.86)
    partial = lr.summary()
    assert partial["done"] == {lr.GRPO: [100, 101, 102], lr.CAPO: [100, 101]}
    assert partial["complete"] is False and partial["decided"] is None and partial["runs"][lr.CAPO][102] is None
    write(folder, lr.CAPO, 102, accuracy=0.33, auroc=0.86, mean_tokens=32.0 if capo_drifts else 23.0)
    result = lr.summary()
    assert result["count"][lr.CAPO] == {"collapsed": int(capo_drifts), "loses_calibration": 0,
                                        "trains": 3 - int(capo_drifts)}
    assert result["count"][lr.GRPO]["loses_calibration"] == 3 - int(grpo_keeps)
    assert result["decided"] == {"candidate": candidate, "recipe_learning_rate": recipe_lr}


def test_its_page_shows_each_run_checks_and_the_decisions_once_all_ran(pilot, monkeypatch):
    lr, folder = pilot
    real = load_script("results_real")
    monkeypatch.setattr(real, "real_lr", lr)
    train = [{"step": 5, "completions/clipped_ratio": 0.25}, {"step": 10, "completions/clipped_ratio": 0.5}]
    write(folder, lr.GRPO, 100, accuracy=0.35, auroc=0.80, auroc_question=0.7, ece=0.4, e_aurc=0.1, train=train)
    page = real.render_real_lr()
    assert "| 100 | `grpo-lr3e-4` | no | yes | yes | 0.350 | 0.800 | 0.700 | 0.400 | 0.100 | 0.950 | 23.7 | 0.50 |" in page
    assert "| 100 | `capo-nomask-lr3e-4` | not run yet |" in page and "Decisions: not yet" in page
    for seed in lr.SEEDS:
        for arm in lr.ARMS:
            auroc = 0.80 - (0.01 * (seed - 100) if arm == lr.CAPO else 0.0)
            write(folder, arm, seed, accuracy=0.35, auroc=auroc, auroc_question=None, ece=0.4, e_aurc=0.1, train=train)
    page = real.render_real_lr()
    assert page.count("| undefined |") == 6 and "not run yet" not in page
    assert ("a candidate setting for a second study: yes; the CAPO SmolLM2 recipe's learning rate "
            "becomes 3e-4: yes.\n") in page  # no CAPO run collapsed, every GRPO run lost calibration
    assert page.endswith("`capo-nomask-lr3e-4` minus `grpo-lr3e-4`, by seed: 100 +0.000, 101 -0.010, 102 -0.020.\n")
