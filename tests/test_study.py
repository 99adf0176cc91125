"""A study is a file: its checks, and a 2-arm, 2-seed study run end to end on the embedded tiny model from its file
(queue, a kill, the queue again, which resumes, then the report, checked against a hand computation)."""

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from results_evidence import measure_real
from scipy import stats

from capo_trl.cli.main import main
from capo_trl.errors import UsageError
from capo_trl.harness.study import load_study
from capo_trl.harness.study_report import screen

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "studies" / "tiny" / "study.yaml"  # the study docs/studies.md runs
STUDY = yaml.safe_load(EXAMPLE.read_text())


def project(tmp_path: Path, **changes) -> Path:
    """A project folder with the tiny recipes and a study folder holding ``study.yaml``; returns the study folder."""
    root = tmp_path / "project"
    (root / "examples" / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("")
    for name in ("grpo-arith-tiny-cpu.yaml", "capo-arith-tiny-cpu.yaml"):
        shutil.copy(ROOT / "examples" / "recipes" / name, root / "examples" / "recipes" / name)
    folder = root / "studies" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.yaml").write_text(yaml.safe_dump({**STUDY, **changes}, sort_keys=False))
    return folder


@pytest.mark.parametrize("changes, match", [
    ({"kind": "sweep"}, "kind = 'sweep'; use one of"),
    ({"task": "arithmetik"}, "did you mean 'arithmetic'"),
    ({"seeds": [0, 0]}, "seeds must be a list of distinct integers"),
    ({"primary": {"endpoint": "auroc", "arm": "capo", "minus": "ppo"}}, "primary.minus = 'ppo' is not an arm"),
    ({"looks": [{"seeds": 3, "alpha": 0.05}]}, r"the last \(3\) be at most the 2 seeds"),
    ({"primary": None}, "a confirmatory study fixes its primary contrast"),
    ({"deadline": "next week"}, "write it as 2027-01-15"),
    ({"arms": {"grpo": {"recipe": "examples/recipes/nope.yaml"}}}, "is not a file"),
    ({"arms": {"grpo": {"recipe": "examples/recipes/grpo-arith-tiny-cpu.yaml"}}}, "save no checkpoint at step 2"),
    ({"colapse": {}}, r"unknown keys \['colapse'\]"),
    ({"steps": 0}, "steps = 0; it must be an integer >= 1"),
    ({"safety": ["accuracyy"]}, r"safety: \['accuracyy'\] is no metric a record holds"),
    ({"safety": "accuracy"}, "safety = 'accuracy'; write a list of distinct names"),
    ({"descriptive": ["ece", "ece"]}, "descriptive = .*write a list of distinct names"),
    ({"train_log": "reward"}, "train_log = 'reward'; write a list"),
    ({"test": {"problem": 5}}, r"test: unknown keys \['problem'\]; the keys are \['problems'"),
    ({"test": {"split": "nosuch"}}, r"test.split = 'nosuch'; use one of \['train', 'validation', 'test'\]"),
    ({"test": {"samples": 0}}, "test.samples = 0; it must be an integer >= 1"),
    ({"test": {"dtype": "bf16"}}, r"test.dtype = 'bf16'; use one of \['float32', 'bfloat16'\]"),
    ({"other_commits": 123}, "other_commits = 123; say in words why"),
])
def test_a_bad_study_file_names_the_key_and_the_fix(tmp_path, changes, match):
    with pytest.raises(UsageError, match=match):
        load_study(project(tmp_path, **changes))


def test_a_bad_file_is_one_line_from_the_cli(tmp_path, capsys):
    folder = project(tmp_path, kind="sweep")
    assert main(["study", "status", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capo-trl study: ") and "\n" not in err


def test_the_names_a_study_may_list_are_the_records_metrics():
    from capo_trl.harness.study_keys import METRIC, Plan

    for name in (*Plan.descriptive, *Plan.safety, "guessable/modal_share", "precision@0.8", "pass@8", "finished_frac"):
        assert METRIC.fullmatch(name), name
    for name in ("accuracyy", "coverage", "derivable/", "auroc question"):
        assert not METRIC.fullmatch(name), name


@pytest.mark.parametrize("kind, says", [("pilot", "ends when every run has finished"), ("measurement", "no deadline")])
def test_close_is_refused_in_one_line_for_a_study_that_is_not_confirmatory(tmp_path, capsys, kind, says):
    folder = project(tmp_path, kind=kind)
    data = {k: v for k, v in STUDY.items() if k not in ("primary", "looks", "secondaries", "family_alpha")}
    data["kind"] = kind
    if kind == "measurement":
        data = {k: v for k, v in data.items() if k not in ("seeds", "steps", "decision", "criterion")}
        data["cannot_run"] = "a measurement of the start model, run by hand"
        data["arms"] = {"start": {"task": "arithmetic"}}
    (folder / "study.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["study", "close", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capo-trl study: ") and "\n" not in err and says in err
    assert not (folder / "closed.json").exists()


def test_a_pilot_picks_by_its_rule(tmp_path):
    folder = project(tmp_path, kind="pilot", decision={
        "reference": "grpo", "candidates": ["capo"], "max_accuracy_loss": 0.03, "rank_by": ["auroc"]})
    study = load_study(folder)
    base = {"mean_tokens": 10, "finished_frac": 1.0, "train": [{"completions/clipped_ratio": 0.1}]}
    runs = {"grpo": {s: {**base, "accuracy": 0.5, "auroc": 0.6} for s in (0, 1)},
            "capo": {s: {**base, "accuracy": 0.48, "auroc": 0.7} for s in (0, 1)}}
    assert screen(study, runs)["pick"] == "capo"
    runs["capo"][1] = {**runs["capo"][1], "accuracy": 0.4}  # loses 0.05 on average: more than the margin
    assert screen(study, runs)["pick"] is None
    runs["capo"][1] = {**runs["capo"][1], "accuracy": 0.5, "train": [{"completions/clipped_ratio": 1.0}]}  # drifted
    assert screen(study, runs)["arms"]["capo"]["drifted_runs"] == 1 and screen(study, runs)["pick"] is None


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def _committed(folder: Path) -> Path:
    """The study's project as a git repository with one commit; returns its root."""
    root = folder.parents[1]
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "protocol")
    return root


def _as_wheel(monkeypatch, version: str = "1.2.0") -> None:
    """This capo-trl as a wheel of ``version`` would be: no checkout, no commit."""
    from capo_trl.harness import study_freeze

    monkeypatch.setattr(study_freeze, "is_checkout", lambda: False)
    monkeypatch.setattr(study_freeze, "__version__", version)


def test_start_freezes_what_the_runs_depend_on_and_a_run_refuses_what_changed(tmp_path, monkeypatch):
    """Frozen from a wheel in a user's own repository: the repository's commit, capo-trl's version, the study file's
    and each recipe's digest. The same version runs it; another version, a changed study file or a changed recipe is
    refused in one line that says what to do, unless other_commits says why they may differ."""
    from capo_trl.harness import study_freeze

    folder = project(tmp_path)
    root = _committed(folder)
    _as_wheel(monkeypatch)
    frozen = study_freeze.start(load_study(folder))
    assert frozen["commit"] == _git(root, "rev-parse", "HEAD") and frozen["capo_trl"] == "1.2.0"
    assert frozen["capo_trl_commit"] is None and set(frozen["recipes"]) == {
        "examples/recipes/grpo-arith-tiny-cpu.yaml", "examples/recipes/capo-arith-tiny-cpu.yaml"}
    text = (folder / "study.yaml").read_text()
    assert "frozen_commit" not in text and yaml.safe_load(text)["frozen"] == frozen
    study = load_study(folder)
    assert study.frozen == frozen and study.frozen_commit == frozen["commit"]
    study_freeze.check_code(study)  # the version it was frozen with
    with pytest.raises(UsageError, match="frozen already"):
        _git(root, "commit", "-qam", "frozen")
        study_freeze.start(load_study(folder))

    monkeypatch.setattr(study_freeze, "__version__", "1.3.0")
    with pytest.raises(UsageError) as err:
        study_freeze.check_code(study)
    assert str(err.value) == (f"{folder}/study.yaml was frozen with capo-trl 1.2.0, but this is capo-trl 1.3.0 "
                              "(installed from a wheel); install it (pip install \"capo-trl==1.2.0\"), or say in "
                              "study.yaml's other_commits why another capo-trl may run it.")
    monkeypatch.setattr(study_freeze, "__version__", "1.2.0")
    recipe = root / "examples" / "recipes" / "capo-arith-tiny-cpu.yaml"
    recipe.write_text(recipe.read_text().replace("learning_rate:", "learning_rate: 1.0e-3  # was:\n# learning_rate:", 1))
    with pytest.raises(UsageError, match=r"other text in the recipes \['examples/recipes/capo-arith-tiny-cpu.yaml'\]"):
        study_freeze.check_code(study)
    _git(root, "checkout", "--", "examples")
    (folder / "study.yaml").write_text(text.replace("seeds: [0, 1]", "seeds: [0, 1, 2]").replace(
        "- 0\n- 1\n", "- 0\n- 1\n- 2\n"))
    with pytest.raises(UsageError, match="changed since `capo-trl study start` froze it"):
        study_freeze.check_code(load_study(folder))
    (folder / "study.yaml").write_text(text + "other_commits: a fix of the test split's seed, reviewed\n")
    monkeypatch.setattr(study_freeze, "__version__", "1.3.0")
    study_freeze.check_code(load_study(folder))  # the file says why


def test_a_study_frozen_at_a_commit_runs_under_that_src_tree_only(tmp_path, monkeypatch):
    """A file older than the frozen: block names only a commit of capo-trl's repository: any commit with the same
    src/ tree runs it; another tree, a checkout with uncommitted changes or a wheel is refused; a report never mixes
    records of two trees."""
    from capo_trl.harness import study_freeze, study_report

    study = load_study(project(tmp_path, frozen_commit="abc123"))
    monkeypatch.setattr(study_freeze, "changed_recipes", lambda study: [])
    monkeypatch.setattr(study_freeze, "is_checkout", lambda: True)
    monkeypatch.setattr(study_freeze, "frozen_tree", lambda commit: {"abc123": "tree-1"}.get(commit))
    monkeypatch.setattr(study_freeze, "code_version", lambda: ("def456", "tree-1"))
    study_freeze.check_code(study)
    monkeypatch.setattr(study_freeze, "code_version", lambda: ("def456", "tree-2"))
    with pytest.raises(UsageError, match="frozen with capo-trl at commit abc123, but this is capo-trl .*at commit "
                                         "def456.*run it from a git checkout of capo-trl that holds that commit"):
        study_freeze.check_code(study)
    monkeypatch.setattr(study_freeze, "code_version", lambda: (None, None))
    with pytest.raises(UsageError, match="a checkout with uncommitted changes in src/"):
        study_freeze.check_code(study)
    _as_wheel(monkeypatch)
    with pytest.raises(UsageError, match="installed from a wheel"):
        study_freeze.check_code(study)
    study_freeze.check_code(load_study(project(tmp_path, frozen_commit="abc123", other_commits="a bug fix")))
    base = {"auroc": 0.6, "accuracy": 0.5, "mean_tokens": 10, "train": []}
    runs = {"grpo": {0: {**base, "src_tree": "tree-1"}}, "capo": {0: {**base, "src_tree": "tree-2"}}}
    monkeypatch.setattr(study_report, "records", lambda study, into=None: runs)
    with pytest.raises(UsageError, match="several versions of src/"):
        study_report.report(study)
    wheels = {"grpo": {0: {**base, "capo_trl": "1.2.0", "src_tree": None}},  # from wheels: their versions
              "capo": {0: {**base, "capo_trl": "1.3.0", "src_tree": None}}}
    monkeypatch.setattr(study_report, "records", lambda study, into=None: wheels)
    with pytest.raises(UsageError, match=r"several versions of src/ \['capo-trl 1.2.0', 'capo-trl 1.3.0'\]"):
        study_report.report(study)


FAKE_CLI = """import json, os, sys
with open(os.environ["CAPO_FAKE_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "code": __file__}, f)
"""


def test_this_projects_frozen_study_runs_its_commits_code_by_itself(tmp_path, monkeypatch, capsys):
    """A study frozen with capo-trl at a commit that the running checkout holds, but is not: `run` checks that
    commit out into a worktree under the runs folder and runs itself from there (no PYTHONPATH, no worktree by hand).
    The checkout here is a stand-in repository whose frozen commit's capo_trl.cli records how it was called."""
    from capo_trl.harness import study_freeze

    code = tmp_path / "capo-trl"
    (code / "src" / "capo_trl" / "cli").mkdir(parents=True)
    (code / "src" / "capo_trl" / "__init__.py").write_text("")
    (code / "src" / "capo_trl" / "cli" / "__init__.py").write_text("")
    (code / "src" / "capo_trl" / "cli" / "__main__.py").write_text(FAKE_CLI)
    _git(code, "init", "-q")
    _git(code, "add", "-A")
    _git(code, "commit", "-q", "-m", "the frozen code")
    frozen = _git(code, "rev-parse", "HEAD")
    (code / "src" / "capo_trl" / "cli" / "__main__.py").write_text("raise SystemExit('today\'s code ran')\n")
    _git(code, "commit", "-qam", "today")
    monkeypatch.setattr(study_freeze, "CODE", code)

    folder = project(tmp_path)
    _committed(folder)
    data = {**yaml.safe_load((folder / "study.yaml").read_text()), "frozen_commit": None}
    data["frozen"] = {"commit": frozen, "capo_trl": "0.1.0", "capo_trl_commit": frozen,
                      "study": study_freeze.study_digest(data), "recipes": {}}
    (folder / "study.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    out, runs = tmp_path / "called.json", tmp_path / "runs"
    monkeypatch.setenv("CAPO_FAKE_OUT", str(out))
    assert main(["study", "run", str(folder), "capo", "1", "--runs", str(runs)]) == 0
    called = json.loads(out.read_text())
    worktree = (runs / ".code" / frozen[:12]).resolve()
    assert called["argv"] == ["study", "run", str(folder), "capo", "1", "--runs", str(runs)]
    assert Path(called["code"]).resolve() == worktree / "src" / "capo_trl" / "cli" / "__main__.py"
    assert _git(worktree, "rev-parse", "HEAD") == frozen
    assert "running the capo-trl it was frozen with" in capsys.readouterr().err


def _arms(**overrides) -> dict:
    arms = yaml.safe_load(EXAMPLE.read_text())["arms"]
    return {name: {**arm, "overrides": {**arm["overrides"], **overrides}} for name, arm in arms.items()}


ARITH_TINY = str(ROOT / "src" / "capo_trl" / "assets" / "arith-tiny")


@pytest.mark.parametrize("changes, says", [
    ({"task": "guess-half", "model": ARITH_TINY},
     "its model .*arith-tiny is the embedded start model of arithmetic, made for that alone, not for the study's task "
     "guess-half; leave out the study's model: key \\(the task then trains its own start model, guess-tiny\\)"),
    ({"model": "EMPTY"}, r"its model .*empty cannot load \(ValueError: Unrecognized model in .*\); fix model_name_or_path"),
    ({"arms": _arms(max_prompt_length=2)}, "every sampled prompt is longer than max_prompt_length 2 \\(shortest 13 "
                                           "tokens\\), so training would drop them all"),
    ({"arms": _arms(max_completion_length=250)}, "a prompt of 17 tokens plus max_completion_length 250 exceeds the "
                                                 "model's context of 128 tokens"),
    ({"model": "TINY"}, r"the start model cannot learn this task: only 0 of 32 train prompts' groups \(4 samples each, "
                        r"temperature 1\) have both grades, accuracy 0.000, so almost every group ties"),
])
def test_a_study_that_cannot_learn_is_refused_before_its_first_run(tmp_path, tiny_model_dir, capsys, changes, says):
    """`check` (which `start` and `queue` run first): the model made for another task, a model that cannot load,
    prompts that do not fit, and a start model whose groups all tie (a random tiny model: accuracy 0) are refused in
    one line naming the arm and the fix, before anything trains."""
    (tmp_path / "empty").mkdir()
    changes = {k: {"EMPTY": str(tmp_path / "empty"), "TINY": str(tiny_model_dir)}.get(v, v) if isinstance(v, str)
               else v for k, v in changes.items()}
    folder, runs = project(tmp_path, **changes), tmp_path / "runs"
    for verb in ("check", "queue"):
        assert main(["study", verb, str(folder), "--runs", str(runs)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(f"arms.grpo: {says}", err), err
    assert not (runs / "tiny" / "grpo").exists() and not (runs / "tiny" / "check.json").exists()


def test_a_study_that_can_learn_passes_its_check_once(tmp_path, capsys, monkeypatch):
    """The example study's arms share one setting: checked once, its numbers said, and kept in the runs folder so a
    queue restarted on the same machine does not sample again; a changed recipe is checked afresh."""
    from capo_trl.cli import study_check

    folder, runs = project(tmp_path), tmp_path / "runs"
    assert main(["study", "check", str(folder), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and re.fullmatch(r"check grpo: arithmetic, arith-tiny: prompts of \d+-\d+ tokens fit; (\d+) "
                                          r"of 32 train prompts' groups \(4 samples each, temperature 1\) have both "
                                          r"grades, accuracy [01]\.\d{3}", out[0]), out
    assert int(out[0].split("fit; ")[1].split()[0]) * study_check.MIN_SIGNAL >= study_check.PROMPTS
    monkeypatch.setattr(study_check, "_signal", lambda *a: pytest.fail("sampled again"))
    assert study_check.check(load_study(folder), runs) == [out[0].split(": ", 1)[1]]
    recipe = folder.parents[1] / "examples" / "recipes" / "capo-arith-tiny-cpu.yaml"
    recipe.write_text(recipe.read_text() + "\n# a comment\n")
    with pytest.raises(pytest.fail.Exception, match="sampled again"):
        study_check.check(load_study(folder), runs)


def test_the_report_is_the_hand_computation_of_its_records(tmp_path):
    """The example study's report at its look, from four records (committed records of a real study, their
    numbers changed): the primary contrast's mean and t interval and the accuracy contrast as scipy gives them from
    the same files, the means without a start row (no start.json), and what a result constant is written from."""
    folder = project(tmp_path)
    source = sorted((ROOT / "docs" / "results" / "smollm2-pick-guess-half").glob("*/seed*.json"))[0]
    records = {}
    for i, (arm, seed) in enumerate((a, s) for a in ("grpo", "capo") for s in (0, 1)):
        record = {**json.loads(source.read_text()), "arm": arm, "seed": seed, "auroc": 0.6 + 0.04 * i * i - 0.01 * seed,
                  "accuracy": 0.4 + 0.03 * (i % 3), "src_tree": "tree-1", "task": "arithmetic", "global_step": 2}
        record = {k: v for k, v in record.items() if "/" not in k}  # arithmetic has no guessable items
        (folder / arm).mkdir(exist_ok=True)
        (folder / arm / f"seed{seed}.json").write_text(json.dumps(record))
        records[arm, seed] = record
    report = study_report(folder)
    diffs = np.array([records["capo", s]["auroc"] - records["grpo", s]["auroc"] for s in (0, 1)])
    interval = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert (f"| capo - grpo (primary) | auroc | {diffs.mean():+.3f} | [{interval.low:+.3f}, {interval.high:+.3f}] |"
            in report), report
    accuracy = np.mean([records["capo", s]["accuracy"] - records["grpo", s]["accuracy"] for s in (0, 1)])
    assert f"| capo - grpo | accuracy | {accuracy:+.3f} [" in report, report
    means = report.split("Means over the look's seeds (descriptive):", 1)[1]
    assert "| start |" not in means and "nan" not in means and "guessable" not in means, means
    assert f"| grpo | {np.mean([records['grpo', s]['auroc'] for s in (0, 1)]):.3f} |" in means, means
    measured = measure_real(load_study(folder))  # what a result constant in results_evidence is written from
    assert measured["look"] and measured["start"] is None  # no start.json: None, not a nan that never equals itself
    assert ast.literal_eval(repr(measured)) == measured


def test_plan_prices_the_study_from_the_first_finished_run_of_each_arm(tmp_path, capsys):
    """Core-hours for the planned seeds from each arm's first finished record (every training attempt and the test,
    one thread each); before one of each arm has finished, it says which to run."""
    folder = project(tmp_path)
    (folder / "grpo").mkdir()
    (folder / "grpo" / "seed1.json").write_text(json.dumps({"train_s": [600, 1200], "test_s": 300}))
    plan = ["study", "plan", str(folder), "--sd", "0.05", "--effect", "0.05"]
    assert main(plan) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        f"cost: unknown until a run of each arm has finished (capo have none): run one (capo-trl study run {folder} "
        "capo 0) and plan again")
    (folder / "capo").mkdir()
    (folder / "capo" / "seed0.json").write_text(json.dumps({"train_s": [1500], "test_s": 300}))
    assert main(plan) == 0
    seeds, cost = capsys.readouterr().out.splitlines()
    hours = int(seeds.split()[0]) * (2100 + 1800) / 3600
    assert cost == (f"cost: {hours:.1f} core-hours for {seeds.split()[0]} seeds x 2 arms ({hours / 2:.1f} h on two "
                    "slots), from the first finished run of each arm (grpo seed 1: 35 core-min, capo seed 0: 30 "
                    "core-min)")


def study_report(folder: Path) -> str:
    from capo_trl.harness.study_report import report

    return report(load_study(folder))


def test_a_run_killed_after_its_last_checkpoint_is_finished_from_it(tmp_path):
    """Killed after its last step's checkpoint but before ``train.done`` (while the final model was being saved),
    a run is not resumed (transformers would refuse or train one step more) nor retrained: its model files come from
    that checkpoint, and its record equals the one the uninterrupted run wrote. Real training and test."""
    from capo_trl.cli import study_run

    study, runs = load_study(project(tmp_path)), tmp_path / "runs"
    path = study_run.run_one(study, "grpo", 0, runs)
    whole = json.loads(path.read_text())
    run = runs / "tiny" / "grpo" / "seed0"
    path.unlink()
    shutil.rmtree(run / "test")
    for item in run.iterdir():  # the window: the last checkpoint saved, no final model, no train.done
        if item.is_file() and item.name != "times.json":
            item.unlink()
    again = json.loads(study_run.run_one(study, "grpo", 0, runs).read_text())
    log = (runs / "tiny" / "grpo" / "seed0.log").read_text()
    assert log.count("$ capo-trl train") == 1 and "its model files were taken from that checkpoint" in log
    drop = ("train_s", "test_s")
    assert {k: v for k, v in again.items() if k not in drop} == {k: v for k, v in whole.items() if k not in drop}
    assert again["train_s"] == whole["train_s"]  # the run trained once; no time is added for taking the files


# ------------------------------------------------------------------------------------ the keys every study may need
PRESET_STUDY = {"arms": {"grpo": {"preset": "grpo"}, "capo": {"preset": "capo:tau=0.3"}},
                "budget": {"val_every": 5, "test_problems": 4}, "cannot_run": "its runs came from the test-bed driver"}


@pytest.mark.parametrize("changes, match", [
    ({"records": "runs.json"}, r"records = 'runs.json' gives two runs the same record; add \{arm\} or \{seed\}"),
    ({"records": "{arm}/{run}.json"}, r"records = .*write a path relative to the study's folder ending in .json"),
    ({"records": "../{arm}/seed{seed}.json"}, "write a path relative to the study's folder"),
    ({"arms": {"grpo": {"preset": "grpo"}}}, r"\['grpo'\] are harness presets.*budget:.*cannot_run:"),
    ({**PRESET_STUDY, "arms": {"grpo": {"preset": "grpo-masc"}}}, "arms.grpo.preset: unknown method 'grpo-masc'; did you mean"),
    ({**PRESET_STUDY, "arms": {"grpo": {"preset": "grpo", "recipe": "x.yaml"}}}, r"arms.grpo must be \{recipe"),
    ({**PRESET_STUDY, "budget": {"steps": 3}}, r"budget.steps: not a harness budget field \(the file's steps: key"),
    ({**PRESET_STUDY, "budget": {"val_every": 0}}, "budget: --val_every must be an integer >= 1"),
    ({"budget": {"val_every": 5}}, "only arms with a preset train under a harness budget"),
    ({"cannot_run": ""}, "cannot_run = ''; say in words why capo-trl study cannot run"),
    ({"cannot_run": ["a list"]}, "say in words why capo-trl study cannot run"),
    ({"task": None}, "task is missing; every study states it"),
    ({"deadline": None}, "deadline is missing; every study states it"),
    ({"kind": "measurement", "cannot_run": "eval"}, "a measurement trains nothing, so it has no seeds"),
    ({"criterion": {"checks": {"up": {"endpoint": "accuracy", "change": 0.02}}}}, "criterion must have start and checks"),
    ({"criterion": {"start": "s.json", "checks": {"up": {"endpoint": "acuracy", "change": 0.02}}}},
     r"criterion.checks.up.endpoint = 'acuracy': use one of"),
    ({"criterion": {"start": "s.json", "checks": {"up": {"endpoint": "accuracy", "change": 0}}}},
     "other than 0 .its sign says up or down"),
    ({"criterion": {"start": "s.json", "checks": {"both": {"all": ["up"]}}}}, r"name a check listed before it"),
    ({"criterion": {"start": "s.json", "checks": {"c": {"rule": "length"}}}}, "the one rule is collapse"),
    ({"criterion": {"start": "s.json", "checks": {"c": {"rule": "collapse"}}, "required": ["d"]}},
     r"criterion.required = \['d'\]: list names of its checks"),
    ({"criterion": {"start": "s.json", "checks": {"c": {"rule": "collapse"}},
                    "decisions": {"go": [{"arm": "capo", "check": "c", "on": "all"}]}}},
     r"decisions.go\[0\] = .*seeds: all\|none"),
])
def test_a_bad_key_names_itself_and_the_fix(tmp_path, changes, match):
    with pytest.raises(UsageError, match=match):
        load_study(project(tmp_path, **changes))


def test_arms_may_run_their_own_task_and_steps_and_records_follow_the_pattern(tmp_path):
    folder = project(tmp_path, task=None, records="{task}-{arm}-seed{seed}.json",
                     arms={"grpo": {**STUDY["arms"]["grpo"], "task": "guess"},
                           "capo": {**STUDY["arms"]["capo"], "task": "arithmetic", "steps": 4}})
    study = load_study(folder)
    assert (study.arm_task("grpo"), study.arm_steps("grpo"), study.arm_task("capo"), study.arm_steps("capo")) == \
        ("guess", 2, "arithmetic", 4)
    assert study.record_path("grpo", 1) == folder / "guess-grpo-seed1.json"
    from capo_trl.cli import study_run

    args = study_run._train_args(study, "capo", 0, tmp_path)
    assert args[args.index("--dataset_name") + 1] == "arithmetic" and args[args.index("--max_steps") + 1] == "4"
    assert study_run._test_args(study, "grpo", tmp_path)[4] == "guess"
    assert "--dtype" not in study_run._test_args(study, "grpo", tmp_path)  # float32: the command of every record
    bf16 = load_study(project(tmp_path / "bf16", test={"problems": 4, "dtype": "bfloat16"}))
    assert study_run._test_args(bf16, "grpo", tmp_path)[-2:] == ["--dtype", "bfloat16"]


def test_a_study_the_runner_cannot_run_is_refused_with_the_files_reason(tmp_path, capsys):
    """Preset arms (the test-bed driver's) with their budget and the reason: status and report read the records;
    start, run and queue refuse, saying why."""
    folder = project(tmp_path, **PRESET_STUDY)
    study = load_study(folder)
    assert study.plan.arms == {"grpo": "grpo", "capo": "capo:tau=0.3"} and study.budget == PRESET_STUDY["budget"]
    for verb in (["start", str(folder)], ["run", str(folder), "grpo", "0"], ["queue", str(folder)]):
        assert main(["study", *verb]) == 2
        err = capsys.readouterr().err
        assert f"says capo-trl study cannot {verb[0]} it (cannot_run): its runs came from the test-bed driver" in err
    assert main(["study", "status", str(folder)]) == 0
    assert "capo-trl study cannot run it: its runs came from the test-bed driver" in capsys.readouterr().out


def test_a_measurement_names_its_tasks_and_trains_nothing(tmp_path, capsys):
    data = {"question": "the start?", "kind": "measurement", "arms": {"arithmetic": {"task": "arithmetic"}},
            "records": "{arm}/report.json", "deadline": None, "cannot_run": "capo-trl eval made it"}
    folder = tmp_path / "start"
    folder.mkdir()
    (folder / "study.yaml").write_text(yaml.safe_dump(data))
    assert load_study(folder).seeds == [] and load_study(folder).plan is None
    (folder / "arithmetic").mkdir()
    (folder / "arithmetic" / "report.json").write_text("{}")
    assert main(["study", "status", str(folder)]) == 0 and "arithmetic: measured" in capsys.readouterr().out
    data["arms"]["arithmetic"]["recipe"] = "x.yaml"
    (folder / "study.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError, match=r"must be \{task: NAME\}: a measurement trains nothing"):
        load_study(folder)


def test_a_pilots_criterion_checks_each_run_against_the_start_and_decides_once_all_ran(tmp_path, capsys):
    """Each form of check, `all` with a negated earlier check, required, and a decision over arms and seeds; the
    pilot's report shows the checks as runs finish."""
    criterion = {"start": "start.json", "checks": {
        "collapsed": {"rule": "collapse"}, "up": {"endpoint": "accuracy", "change": 0.02},
        "down": {"endpoint": "auroc", "change": -0.03}, "worse": {"endpoint": "e_aurc", "ratio": 1.25},
        "short": {"endpoint": "mean_tokens", "at_most": 20}, "ends": {"endpoint": "finished_frac", "at_least": 0.5},
        "loses": {"all": ["up", "down", "not collapsed"]}},
        "required": ["up", "down"], "decisions": {"go": [{"arm": "capo", "check": "collapsed", "seeds": "none"},
                                                         {"arm": "grpo", "check": "loses", "seeds": "all"}]}}
    folder = project(tmp_path, kind="pilot", criterion=criterion)
    study = load_study(folder)
    start = {"accuracy": 0.5, "auroc": 0.8, "e_aurc": 0.1, "mean_tokens": 10, "finished_frac": 1.0}
    (folder / "start.json").write_text(json.dumps(start))
    lost = {**start, "accuracy": 0.52, "auroc": 0.77, "e_aurc": 0.125, "mean_tokens": 20, "finished_frac": 0.5}
    from capo_trl.harness.study_report import checks

    result = checks(study, {"grpo": {0: lost}, "capo": {}})
    assert result["runs"]["grpo"][0] == {"collapsed": False, "up": True, "down": True, "worse": True, "short": True,
                                         "ends": True, "loses": True, "required_met": True}
    assert result["decided"] is None and result["complete"] == {"grpo": False, "capo": False}
    kept = {**lost, "auroc": None, "e_aurc": 0.1249, "mean_tokens": 24.0}  # an undefined AUROC fails its checks
    result = checks(study, {"grpo": {0: lost, 1: lost}, "capo": {0: kept, 1: lost}})
    assert result["runs"]["capo"][0] == {"collapsed": True, "up": True, "down": False, "worse": False, "short": False,
                                         "ends": True, "loses": False, "required_met": False}
    assert result["meets"] == {"grpo": True, "capo": False} and result["decided"] == {"go": False}
    assert checks(study, {"grpo": {0: lost, 1: lost}, "capo": {0: lost, 1: lost}})["decided"] == {"go": True}
    (folder / "grpo").mkdir()
    (folder / "grpo" / "seed0.json").write_text(json.dumps(lost))
    assert main(["study", "report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| grpo | 0 | no | yes | yes | yes | yes | yes | yes | yes |" in out and "`grpo` not yet" in out


# ------------------------------------------------------------------------------------ this project's studies
RESULTS = ROOT / "docs" / "results"
STUDIES = sorted(path.parent for path in RESULTS.rglob("study.yaml"))


def test_every_results_folder_with_records_has_its_study_file():
    """Each run's record (``*seed<k>.json``) lies in a folder with a study.yaml, or in one of its arm folders; the
    real model's start and its sweep, which have none, have their file too (a measurement; one record per arm)."""
    records = [p for p in RESULTS.rglob("*.json") if re.search(r"seed\d+\.json$", p.name)]
    orphans = sorted(str(p.relative_to(RESULTS)) for p in records
                     if not any((parent / "study.yaml").is_file() for parent in p.parents if RESULTS in parent.parents))
    assert records and not orphans, orphans
    assert {"smollm2-start", "smollm2-sweep"} <= {p.name for p in STUDIES}


@pytest.mark.parametrize("folder", STUDIES, ids=[str(p.relative_to(RESULTS)) for p in STUDIES])
def test_each_study_file_says_what_its_records_ran(folder):
    """Each committed study.yaml loads, names commits that exist, and agrees with what its runs recorded: the
    test-bed driver's config.json and budget.json (method labels, seeds, steps, budget), each record's recipe,
    flags, task and steps, and a pilot's criterion gives the verdict its runner wrote (verdict.json, summary.json)."""
    from capo_trl.harness.study_report import checks, records

    study = load_study(folder)
    if study.frozen_commit:
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{study.frozen_commit}^{{commit}}"]).returncode \
            == 0
    if not study.cannot_run and study.frozen_commit:  # today's runner runs it (it existed at the frozen commit) ...
        runner = f"{study.frozen_commit}:src/capo_trl/cli/study_run.py"
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", runner]).returncode == 0, runner
    # ... or the file says why not
    if study.kind == "measurement":
        assert all(study.record_path(arm, None).is_file() for arm in study.arms)
        return
    runs = records(study)
    config = folder / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        assert c["methods"] == list(study.plan.arms.values()) and c["seeds"] == study.seeds
        assert c.get("steps", study.steps) == study.steps
        assert c.get("val_every", (study.budget or {}).get("val_every")) == (study.budget or {}).get("val_every")
        for arm, spec in c.get("arms", {}).items():
            assert (spec["recipe"], spec["flags"]) == (study.arms[arm].recipe, study.arms[arm].flags())
    if (folder / "budget.json").is_file():
        budget = json.loads((folder / "budget.json").read_text())["budget"]
        assert {k: v for k, v in budget.items() if k not in ("steps", "task", "model", "progress")} == study.budget
        assert (budget["steps"], budget["model"], budget.get("task", study.task)) == (study.steps, study.model, study.task)
    for arm, seed in study.own_runs():
        if (rec := runs[arm].get(seed)) is not None:
            assert rec.get("recipe", study.arms[arm].recipe) == study.arms[arm].recipe, (arm, seed)
            assert rec.get("flags", study.arms[arm].flags()) == study.arms[arm].flags(), (arm, seed)
            assert rec.get("task", study.arm_task(arm)) == study.arm_task(arm), (arm, seed)
            assert rec.get("global_step", study.arm_steps(arm)) == study.arm_steps(arm), (arm, seed)
    if study.criterion is None:
        return
    result = checks(study)
    verdict = json.loads((folder / "verdict.json").read_text()) if (folder / "verdict.json").is_file() else None
    if verdict is not None and "per_seed" in verdict:  # a test-bed pilot's
        (arm,) = study.arms
        assert {str(s): c for s, c in result["runs"][arm].items()} == verdict["per_seed"]
        assert result["meets"][arm] == verdict["test_bed"]
    elif verdict is not None:  # a real-model pilot's, per task
        for task, v in verdict.items():
            assert [{str(s): c for s, c in result["runs"][task].items()}, result["meets"][task]] == \
                [v["per_seed"], v["test_bed"]]
            assert list(result["runs"][task][0]) == list(v["per_seed"]["0"])  # the checks in the protocol's order
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else {}
    if "pilot" in summary:  # the comparison's stage A, as the test-bed driver's report computed it
        assert {str(s): c for s, c in result["runs"]["grpo"].items()} == summary["pilot"]["per_seed"]
    if "decided" in summary:  # the learning-rate pilot's, as its runner's summary computed it
        for arm, by_seed in result["runs"].items():
            assert {str(s): {k: v for k, v in c.items() if k != "required_met"} for s, c in by_seed.items()} == \
                summary["runs"][arm]
        assert result["decided"] == {"candidate": summary["decided"]["candidate"],
                                     "recipe_learning_rate": summary["decided"]["recipe_learning_rate"] is not None}


def test_the_confirmatory_studies_reports_are_their_pages_blocks():
    """`capo-trl study report` on a committed confirmatory study prints the block its page renders (the five-arm
    comparison's page shows its test-bed driver's tables instead, compare.md)."""
    from capo_trl.harness.study_report import report

    shown = []
    for folder in STUDIES:
        study = load_study(folder)
        if study.kind != "confirmatory" or (folder / "compare.md").is_file():
            continue
        shown.append(folder.name)
        page = (folder / "README.md").read_text()
        block = page.split(f"<!-- table: {folder.name} (rendered by scripts/results_tables.py) -->\n")[1]
        assert report(study) == block.split("<!-- end table -->")[0], folder.name
    assert len(shown) == 6, shown
