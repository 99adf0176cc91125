"""The learning-rate pilot (docs/results/smollm2-lr/study.yaml): its arms are the study's at a third of the learning
rate, and its criterion applies the protocol's checks and decisions (written before the pilot's runs) through the
generic criterion (capo_trl.harness.criterion) and its page's block."""

import dataclasses
import json
from pathlib import Path

import pytest
from script_loader import load_script

from capo_trl.harness import study_report
from capo_trl.harness.study import load_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
GRPO, CAPO = "grpo-lr3e-4", "capo-nomask-lr3e-4"


def test_arms_are_the_study_arms_at_a_third_of_the_learning_rate():
    lr, study = load_study(RESULTS / "smollm2-lr"), load_study(RESULTS / "smollm2-study")
    assert list(lr.arms) == [GRPO, CAPO]
    for arm, base in zip(lr.arms, ("grpo", "capo-nomask")):
        mine, theirs = lr.arms[arm], study.arms[base]
        assert mine.recipe == theirs.recipe and mine.flags()[:-2] == theirs.flags()
        assert mine.flags()[-2:] == ["--learning_rate", "3e-4"]
    assert (lr.task, lr.steps, lr.test) == (study.task, study.steps, study.test)
    assert "entropy" in lr.train_log and set(study.train_log) - {"capo/mask_guard_kept"} < set(lr.train_log)


def test_the_study_cli_takes_the_learning_rate_over_the_recipe(tmp_path):
    """The flag the arm adds wins over the 1e-3 of the GRPO recipe the pilot ran (its frozen commit's; both SmolLM2
    recipes train at 3e-4 now). Parsed, not trained."""
    import subprocess

    from capo_trl.cli.train_args import parse_args

    pilot = load_study(RESULTS / "smollm2-lr")
    arm = pilot.arms[GRPO]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{pilot.frozen_commit}:{arm.recipe}"],
                                     capture_output=True, text=True, check=True).stdout)
    assert "learning_rate: 1.0e-3" in recipe.read_text()
    _, training_args, _ = parse_args(["--config", str(recipe), "--dataset_name", "addition", *arm.flags(),
                                      "--output_dir", "unused"])
    assert training_args.learning_rate == pytest.approx(3e-4) and training_args.mask_truncated_completions


START = {"accuracy": 0.27, "auroc": 0.86, "mean_tokens": 23.7, "finished_frac": 0.95}


def write(folder, arm, seed, **rec):
    (folder / arm).mkdir(parents=True, exist_ok=True)
    (folder / arm / f"seed{seed}.json").write_text(json.dumps({**START, **rec}))


@pytest.fixture
def pilot(tmp_path):
    """The pilot's study.yaml over a folder of synthetic records, its start model beside it where the file says."""
    for name in ("smollm2-study", "lr"):
        (tmp_path / name).mkdir()
    (tmp_path / "smollm2-study" / "start.json").write_text(json.dumps(START))
    study = dataclasses.replace(load_study(RESULTS / "smollm2-lr"), folder=tmp_path / "lr")
    assert study.criterion["start"] == "../smollm2-study/start.json"
    return study, tmp_path / "lr"


def test_checks_are_the_study_rule_and_the_pilots_criterion(pilot):
    study, _ = pilot

    def checks(rec):
        return {k: v for k, v in study_report.checks(study, {GRPO: {100: rec}, CAPO: {}})["runs"][GRPO][100].items()
                if k != "required_met"}
    loses = {**START, "accuracy": 0.29, "auroc": 0.83}  # exactly at both margins, no collapse
    assert checks(loses) == {"collapsed": False, "accuracy_rises": True, "auroc_falls": True,
                             "loses_calibration": True, "trains": True}
    keeps = {**loses, "auroc": 0.8301}
    assert checks(keeps)["loses_calibration"] is False and checks(keeps)["trains"] is True
    drifted = {**loses, "mean_tokens": 30.0, "auroc": 0.5}
    assert checks(drifted) == {"collapsed": True, "accuracy_rises": True, "auroc_falls": True,
                               "loses_calibration": False, "trains": False}
    assert checks({**loses, "finished_frac": 0.49})["collapsed"] is True


@pytest.mark.parametrize("capo_drifts, grpo_keeps, candidate, recipe_lr", [
    (False, False, True, True), (True, False, False, False), (False, True, False, True)])
def test_the_decisions_are_taken_only_once_all_six_ran(pilot, capo_drifts, grpo_keeps, candidate, recipe_lr):
    study, folder = pilot
    for seed in study.seeds:
        write(folder, GRPO, seed, accuracy=0.35, auroc=0.80 if not (grpo_keeps and seed == 102) else 0.85)
        if seed != 102:
            write(folder, CAPO, seed, accuracy=0.33, auroc=0.86)
    partial = study_report.checks(study)
    assert {arm: sorted(r) for arm, r in partial["runs"].items()} == {GRPO: [100, 101, 102], CAPO: [100, 101]}
    assert partial["complete"] == {GRPO: True, CAPO: False} and partial["decided"] is None
    write(folder, CAPO, 102, accuracy=0.33, auroc=0.86, mean_tokens=32.0 if capo_drifts else 23.0)
    result = study_report.checks(study)
    count = {arm: {k: sum(r[k] for r in result["runs"][arm].values()) for k in ("collapsed", "loses_calibration",
                                                                                 "trains")} for arm in study.arms}
    assert count[CAPO] == {"collapsed": int(capo_drifts), "loses_calibration": 0, "trains": 3 - int(capo_drifts)}
    assert count[GRPO]["loses_calibration"] == 3 - int(grpo_keeps)
    assert result["decided"] == {"candidate": candidate, "recipe_learning_rate": recipe_lr}


def test_its_page_shows_each_run_checks_and_the_decisions_once_all_ran(pilot, monkeypatch):
    study, folder = pilot
    real = load_script("results_real")
    monkeypatch.setattr(real, "study", lambda name: study)
    train = [{"step": 5, "completions/clipped_ratio": 0.25}, {"step": 10, "completions/clipped_ratio": 0.5}]
    write(folder, GRPO, 100, accuracy=0.35, auroc=0.80, auroc_question=0.7, ece=0.4, e_aurc=0.1, train=train)
    page = real.render_real_lr()
    assert "| 100 | `grpo-lr3e-4` | no | yes | yes | 0.350 | 0.800 | 0.700 | 0.400 | 0.100 | 0.950 | 23.7 | 0.50 |" in page
    assert "| 100 | `capo-nomask-lr3e-4` | not run yet |" in page
    assert "Decisions: not yet (they are taken when all six runs are in)." in page
    for seed in study.seeds:
        for arm in study.arms:
            auroc = 0.80 - (0.01 * (seed - 100) if arm == CAPO else 0.0)
            write(folder, arm, seed, accuracy=0.35, auroc=auroc, auroc_question=None, ece=0.4, e_aurc=0.1, train=train)
    page = real.render_real_lr()
    assert page.count("| undefined |") == 6 and "not run yet" not in page
    assert ("a candidate setting for a second study: yes; the CAPO SmolLM2 recipe's learning rate "
            "becomes 3e-4: yes.\n") in page  # no CAPO run collapsed, every GRPO run lost calibration
    assert page.endswith("`capo-nomask-lr3e-4` minus `grpo-lr3e-4`, by seed: 100 +0.000, 101 -0.010, 102 -0.020.\n")
