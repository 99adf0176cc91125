"""A study is a file: its checks, and a 2-arm, 2-seed study run end to end on the embedded tiny model from its file
(queue, a kill, the queue again, which resumes, then the report, checked against a hand computation)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from capo_trl.cli.main import main
from capo_trl.errors import UsageError
from capo_trl.harness.study import load_study
from capo_trl.harness.study_report import screen
from capo_trl.training.resume import newest_complete

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
])
def test_a_bad_study_file_names_the_key_and_the_fix(tmp_path, changes, match):
    with pytest.raises(UsageError, match=match):
        load_study(project(tmp_path, **changes))


def test_a_bad_file_is_one_line_from_the_cli(tmp_path, capsys):
    folder = project(tmp_path, kind="sweep")
    assert main(["study", "status", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capo-trl study: ") and "\n" not in err


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


def test_a_frozen_study_runs_only_its_frozen_code(tmp_path, monkeypatch):
    """Frozen at a commit, a study runs under any commit with the same src/ tree (the one that writes the frozen
    line changes only study.yaml), refuses another tree unless its file says why, and never mixes them in a report."""
    from capo_trl.cli import study_run
    from capo_trl.harness import study_report

    study = load_study(project(tmp_path, frozen_commit="abc123"))
    monkeypatch.setattr(study_run, "frozen_tree", lambda commit: {"abc123": "tree-1"}.get(commit))
    monkeypatch.setattr(study_run, "code_version", lambda: ("def456", "tree-1"))
    assert study_run.check_commit(study) == ("def456", "tree-1")
    monkeypatch.setattr(study_run, "code_version", lambda: ("def456", "tree-2"))
    with pytest.raises(UsageError, match="frozen at abc123.*src/ differs.*git worktree add --detach"):
        study_run.check_commit(study)
    monkeypatch.setattr(study_run, "code_version", lambda: (None, None))
    with pytest.raises(UsageError, match="not a clean git checkout"):
        study_run.check_commit(study)
    lenient = load_study(project(tmp_path, frozen_commit="abc123", other_commits="a bug fix outside training"))
    assert study_run.check_commit(lenient) == (None, None)
    base = {"auroc": 0.6, "accuracy": 0.5, "mean_tokens": 10, "train": []}
    runs = {"grpo": {0: {**base, "src_tree": "tree-1"}}, "capo": {0: {**base, "src_tree": "tree-2"}}}
    monkeypatch.setattr(study_report, "records", lambda study, into=None: runs)
    with pytest.raises(UsageError, match="several versions of src/"):
        study_report.report(study)


def _queue(folder: Path, runs: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "capo_trl.cli", "study", "queue", str(folder), "--slots", "2",
                             "--runs", str(runs)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.timeout(900)  # four training runs in their own processes, twice started: minutes on a loaded CPU
def test_a_study_runs_from_its_file_resumes_after_a_kill_and_reports(tmp_path, capsys):
    folder, runs = project(tmp_path), tmp_path / "runs"
    first = _queue(folder, runs)
    deadline = time.monotonic() + 300

    def saved():  # the runs with a whole checkpoint (a run killed while saving restarts from scratch)
        return [run for run in runs.glob("tiny/*/seed*") if run.is_dir() and newest_complete(str(run))[0]]

    while not saved():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0] if first.poll() else ""
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the whole queue, its runs included, as a lost machine would
    resumed = saved()
    first.wait(timeout=60)
    assert not list(folder.glob("*/seed*.json"))  # no record of a run that did not finish

    assert main(["study", "status", str(folder)]) == 0
    assert "complete seeds: 0 of 2" in capsys.readouterr().out
    second = _queue(folder, runs)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out
    assert "finished 4, failed 0" in out and len(re.findall(r"^finished \w+ seed \d$", out, re.M)) == 4, out
    for run in resumed:  # the killed runs with a whole checkpoint went on from it
        assert "--resume_from_checkpoint last" in (run.parent / f"{run.name}.log").read_text(), run

    records = {(arm, s): json.loads((folder / arm / f"seed{s}.json").read_text()) for arm in ("grpo", "capo")
               for s in (0, 1)}
    assert all(r["global_step"] == 2 and "commit" in r and len(r["train"]) == 2 for r in records.values())
    assert main(["study", "report", str(folder)]) == 0
    report = capsys.readouterr().out
    value = {k: 0.5 if v is None else v for k, v in ((k, records[k]["auroc"]) for k in records)}
    diffs = np.array([value["capo", s] - value["grpo", s] for s in (0, 1)])
    interval = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    expected = (f"| capo - grpo (primary) | auroc | {diffs.mean():+.3f} | [{interval.low:+.3f}, "
                f"{interval.high:+.3f}] |")
    assert expected in report, report
    accuracy = np.mean([records["capo", s]["accuracy"] - records["grpo", s]["accuracy"] for s in (0, 1)])
    assert f"| capo - grpo | accuracy | {accuracy:+.3f} [" in report, report
