"""capo-trl as a user has it: a wheel installed (not editable) in a fresh virtual environment, and a git repository
of the user's own, outside this checkout, holding two recipes and a two-arm study of the embedded tiny model (a
pilot of one seed: two runs; tests/test_study.py checks a confirmatory report against a hand computation).

From there, with the installed ``capo-trl`` command only: a study's plan, start (frozen with the wheel's version and
no commit), queue (killed once, then resumed), report; a study frozen with another capo-trl and one whose model was
made for another task, each refused in one line; ``capo-trl demo --help``; two training steps of the embedded model.
The fresh environment takes its dependencies (torch, TRL, ...) from the test's own environment through a path file,
added after the wheel is installed, so nothing is downloaded and this checkout's capo_trl is not importable there.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from capo_trl.training.resume import newest_complete

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in", "build_backend", "src")
# what the commands below read from the package: the embedded models, the demo's study file, train's parser
PACKAGE_DATA = ("capo_trl/assets/arith-tiny/config.json", "capo_trl/assets/arith-tiny/model.safetensors",
                "capo_trl/assets/guess-tiny/config.json", "capo_trl/assets/committed_studies.json",
                "capo_trl/assets/certify_questions.json", "capo_trl/cli/train_flags.json", "capo_trl/py.typed")


def _run(args, cwd, env, check=True, timeout=600):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(environment, the user's repository, the wheel) with the wheel installed in a fresh venv."""
    tmp = tmp_path_factory.mktemp("as-a-user")
    source = tmp / "source"  # a copy: building in place would race this checkout's other builds
    source.mkdir()
    for name in SOURCE:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                                           if (ROOT / name).is_dir() else {}))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"), str(source)],
         tmp, os.environ)
    wheel = next((tmp / "dist").glob("capo_trl-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp, os.environ)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp,
         os.environ)
    site = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp, os.environ).stdout.strip())
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz-dependencies.pth").write_text("\n".join(sorted(outer)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               CAPO_TRL_CACHE=str(tmp / "cache"))
    repo = tmp / "my-project"
    (repo / "recipes").mkdir(parents=True)
    for method in ("grpo", "capo"):
        shutil.copy(ROOT / "examples" / "recipes" / f"{method}-arith-tiny-cpu.yaml", repo / "recipes")
    study = yaml.safe_load((ROOT / "examples" / "studies" / "tiny" / "study.yaml").read_text())
    for arm in study["arms"].values():
        arm["recipe"] = arm["recipe"].replace("examples/recipes/", "recipes/")
    for key in ("primary", "secondaries", "looks"):  # a pilot of one seed: two runs (the report's analysis of a
        study.pop(key)  # confirmatory study is checked on committed records, tests/test_study.py)
    study.update(kind="pilot", seeds=[0], question="Do both methods train and test from my repository?",
                 decision={"reference": "grpo", "candidates": ["capo"], "max_accuracy_loss": 0.5, "rank_by": ["auroc"]})
    (repo / "studies" / "mine").mkdir(parents=True)
    (repo / "studies" / "mine" / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    (repo / ".gitignore").write_text("runs/\n")
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@u"]
    _run(git + ["init", "-q"], repo, env)
    _run(git + ["add", "-A"], repo, env)
    _run(git + ["commit", "-qm", "my study"], repo, env)
    return env, repo, wheel


def test_the_wheel_holds_what_the_commands_read(user):
    _, _, wheel = user
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [name for name in PACKAGE_DATA if name not in names]
    assert not [n for n in names if n.startswith("capo_trl/harness/") and "evidence" in n]  # reporting stays home


def test_commands_run_from_the_installed_package(user):
    env, repo, _ = user
    where = _run(["python", "-c", "import capo_trl; print(capo_trl.__file__)"], repo, env).stdout.strip()
    assert "site-packages" in where and not where.startswith(str(ROOT)), where
    assert _run(["capo-trl", "demo", "--help"], repo, env).stdout.startswith("usage: capo-trl demo")
    said = _run(["python", "-c", "from capo_trl.harness.demo import demo_budget, evidence; print(evidence("
                 "demo_budget()))"], repo, env).stdout  # what the demo says after its run, from the shipped file
    assert "What the evidence on this task says (tiny models on CPU" in said and "On a real model" in said
    out = repo.parent / "two-steps"
    trained = _run(["capo-trl", "train", "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations",
                    "4", "--max_completion_length", "16", "--logging_steps", "1", "--save_strategy", "steps",
                    "--save_steps", "2", "--output_dir", str(out)], repo, env)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and len([r for r in state["log_history"] if "reward" in r]) == 2, trained.stderr
    assert (out / "model.safetensors").is_file()


def _queue(repo: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(["capo-trl", "study", "queue", "studies/mine", "--slots", "2"], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.timeout(900)
def test_a_users_study_plans_starts_queues_resumes_and_reports(user):
    """The user's case of docs/studies.md, from a wheel, in the user's repository; then the refusals."""
    env, repo, _ = user
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@u"]
    assert "seeds: power" in _run(["capo-trl", "study", "plan", "studies/mine", "--sd", "0.05", "--effect", "0.05"],
                                  repo, env).stdout
    started = _run(["capo-trl", "study", "start", "studies/mine"], repo, env).stdout
    version = _run(["python", "-c", "import capo_trl; print(capo_trl.__version__)"], repo, env).stdout.strip()
    assert f"with capo-trl {version}; commit study.yaml now" in started, started
    frozen = yaml.safe_load((repo / "studies" / "mine" / "study.yaml").read_text())["frozen"]
    assert frozen["capo_trl"] == version and frozen["capo_trl_commit"] is None
    assert set(frozen["recipes"]) == {"recipes/grpo-arith-tiny-cpu.yaml", "recipes/capo-arith-tiny-cpu.yaml"}
    _run(git + ["commit", "-qam", "frozen"], repo, env)

    first, runs = _queue(repo, env), repo / "runs" / "mine"
    deadline = time.monotonic() + 300
    while not [r for r in runs.glob("*/seed*") if r.is_dir() and newest_complete(str(r))[0]]:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0] if first.poll() else ""
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the whole queue, its runs included, as a lost machine would
    resumed = [r for r in runs.glob("*/seed*") if r.is_dir() and newest_complete(str(r))[0]]
    first.wait(timeout=60)
    folder = repo / "studies" / "mine"
    assert not list(folder.glob("*/seed*.json"))  # no record of a run that did not finish
    assert "grpo: 0 of 1" in _run(["capo-trl", "study", "status", "studies/mine"], repo, env).stdout
    second = _queue(repo, env)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0 and "finished 2, failed 0" in out, out
    assert len(re.findall(r"^finished \w+ seed 0$", out, re.M)) == 2, out
    for run in resumed:  # the killed runs with a whole checkpoint went on from it (or, at the last step, took it)
        log = (run.parent / f"{run.name}.log").read_text()
        assert "--resume_from_checkpoint last" in log or "model files were taken from that checkpoint" in log, run
    records = {arm: json.loads((folder / arm / "seed0.json").read_text()) for arm in ("grpo", "capo")}
    assert all(r["global_step"] == 2 and len(r["train"]) == 2 and r["capo_trl"] == version and r["commit"] is None
               for r in records.values())
    report = _run(["capo-trl", "study", "report", "studies/mine"], repo, env).stdout
    assert "Runs finished: 2 of 2" in report and "Decision rule" in report, report
    for arm, r in records.items():  # each run's row, from its record
        row = next(line for line in report.splitlines() if line.startswith(f"| {arm} | 0 | "))
        assert row.split(" | ")[3] == f"{r['accuracy']:.3f}", (row, r["accuracy"])

    path = repo / "studies" / "mine" / "study.yaml"
    path.write_text(path.read_text().replace(f"capo_trl: {version}", "capo_trl: 0.0.1"))
    refused = _run(["capo-trl", "study", "queue", "studies/mine"], repo, env, check=False)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"capo-trl study: {path.relative_to(repo)} was frozen with capo-trl 0.0.1, but this is capo-trl {version} "
        "(installed from a wheel); install it (pip install \"capo-trl==0.0.1\"), or say in study.yaml's "
        "other_commits why another capo-trl may run it."), refused.stderr


def test_a_study_whose_model_was_made_for_another_task_is_refused(user):
    env, repo, _ = user
    site = _run(["python", "-c", "import capo_trl, pathlib; print(pathlib.Path(capo_trl.__file__).parent)"], repo,
                env).stdout.strip()
    folder = repo / "studies" / "wrong-model"
    folder.mkdir()
    study = yaml.safe_load((repo / "studies" / "mine" / "study.yaml").read_text())
    study.pop("frozen", None)
    study.update(task="guess-half", model=f"{site}/assets/arith-tiny")
    (folder / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    refused = _run(["capo-trl", "study", "check", "studies/wrong-model"], repo, env, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (f"arms.grpo: its model {site}/assets/arith-tiny is the embedded start model of arithmetic, made for that "
            "alone, not for the study's task guess-half") in refused.stderr
