"""capo_trl.harness.driver: the one methods x seeds loop behind `capo-trl compare`, the test-bed
comparison and the pilot (plan seed-major, reuse saved runs, run the rest here or in worker
processes, save each finished run whole).

Training is replaced by fakes: these tests check the driver and its front ends, in seconds.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import multiprocessing
import os
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from capo_trl.harness import driver

METHODS = [("grpo", {"advantage_estimator": "grpo"}), ("capo", {"advantage_estimator": "capo"})]


# ------------------------------------------------------------------------------------ the driver itself
def _pool_worker(stop, marker: str) -> None:
    Path(marker).write_text("closed" if stop.wait(30) else "left running")


def fake_run(calls: str, fail: str, pool: bool, label: str, overrides: dict, seed: int) -> dict:
    """A run in a worker process (module level: picklable): logs the call, says something, may fail.

    Like the grader, it leaves a worker process that an atexit handler stops: a worker that joined
    its children before running atexit handlers (a multiprocessing child does) would wait for it.
    """
    with open(calls, "a") as f:
        f.write(f"{label} {seed}\n")
    if pool:
        fork = multiprocessing.get_context("fork")
        stop = fork.Event()
        fork.Process(target=_pool_worker, args=(stop, str(Path(calls).with_name(f"{label}-{seed}.pool")))).start()
        atexit.register(stop.set)
    print(f"training {label} seed {seed}", flush=True)
    if f"{label} {seed}" == fail:
        raise RuntimeError(f"{label} seed {seed} diverged")
    return {"method": label, "seed": seed, "pid": os.getpid(), "seconds": 0.0}


def _study(tmp_path, fail: str = "", after=None, pool: bool = True) -> driver.Study:
    return driver.Study(METHODS, [0, 1], path=lambda label, seed: tmp_path / label / f"seed{seed}.json",
                        run=partial(fake_run, str(tmp_path / "calls.txt"), fail, pool),
                        after=after or (lambda finished: None))


def _calls(tmp_path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().splitlines()


def test_the_plan_is_seed_major_and_names_each_run_once():
    assert [(label, seed) for label, _, seed in driver.plan(METHODS, [3, 1, 3])] == [
        ("grpo", 3), ("capo", 3), ("grpo", 1), ("capo", 1)]


def test_worker_processes_save_every_run_and_a_rerun_runs_only_the_missing_one(tmp_path):
    seen = []
    finished = driver.run_study(_study(tmp_path, after=lambda f: seen.append(list(f))), workers=2)
    assert list(finished) == [("grpo", 0), ("capo", 0), ("grpo", 1), ("capo", 1)]  # plan order
    assert sorted(_calls(tmp_path)) == ["capo 0", "capo 1", "grpo 0", "grpo 1"]
    assert all(record["pid"] != os.getpid() for record in finished.values())  # each ran in a worker process
    pools = {p.name: p.read_text() for p in tmp_path.glob("*.pool")}  # each ended as a program does: atexit ran
    assert pools == {f"{label}-{seed}.pool": "closed" for label in ("grpo", "capo") for seed in (0, 1)}
    assert seen[0] == [] and len(seen) == 5 and seen[-1] == list(finished)  # once at the start, then per run
    saved = {key: (tmp_path / key[0] / f"seed{key[1]}.json").read_bytes() for key in finished}
    assert all(json.loads(data)["method"] == key[0] for key, data in saved.items())

    (tmp_path / "capo" / "seed0.json").unlink()
    again = driver.run_study(_study(tmp_path), workers=2)
    assert _calls(tmp_path)[4:] == ["capo 0"]  # the finished runs are reused, the missing one runs
    assert again[("capo", 0)]["pid"] != finished[("capo", 0)]["pid"]
    for key, data in saved.items():
        if key != ("capo", 0):
            assert (tmp_path / key[0] / f"seed{key[1]}.json").read_bytes() == data  # untouched


def test_a_failed_worker_run_is_reported_the_others_finish_and_the_study_raises(tmp_path, capsys):
    with pytest.raises(RuntimeError, match=r"1 of 4 runs failed \(grpo seed 1\).*finished runs are reused"):
        driver.run_study(_study(tmp_path, fail="grpo 1"), workers=2)
    printed = capsys.readouterr().out
    assert "[grpo seed 1] FAILED" in printed and "grpo seed 1 diverged" in printed  # its output tail
    assert "training grpo seed 1" in printed and "training capo seed 0" not in printed  # others stay quiet
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*.json")) == [
        "capo/seed0.json", "capo/seed1.json", "grpo/seed0.json"]


def test_a_run_defined_in_main_is_refused_with_workers(tmp_path):
    def local(label, overrides, seed):
        return {}

    local.__module__ = "__main__"
    study = driver.Study(METHODS, [0], path=lambda label, seed: tmp_path / f"{label}{seed}.json", run=local)
    with pytest.raises(ValueError, match="cannot import"):
        driver.run_study(study, workers=1)
    with pytest.raises(ValueError, match="workers=-1"):
        driver.run_study(study, workers=-1)


def test_a_front_end_says_what_to_do_after_a_failure(tmp_path):
    """The demo saves nothing, so it must not promise that a rerun reuses the finished runs."""
    study = dataclasses.replace(_study(tmp_path, fail="capo 0"), seeds=[0], rerun="The demo saves nothing.")
    with pytest.raises(RuntimeError, match=r"1 of 2 runs failed \(capo seed 0\); their output is above. The demo saves nothing.$"):
        driver.run_study(study, workers=1)


def test_in_this_process_a_failure_stops_the_study_at_once(tmp_path):
    with pytest.raises(RuntimeError, match="grpo seed 0 diverged"):
        driver.run_study(_study(tmp_path, fail="grpo 0", pool=False))
    assert _calls(tmp_path) == ["grpo 0"] and not list(tmp_path.glob("*/*.json"))


# ------------------------------------------------------------------------------------ its front ends
def _fake_result(n_problems: int, n: int, accuracy: float):
    samples = [{"score": -0.1 * (i % n), "grade": i % 3 == 0, "extracted": str(i % 5)} for i in range(n_problems * n)]
    metrics = {f"mean@{n}": accuracy, "auroc": 0.7, "auroc_question": 0.6, "ece": 0.1, "e_aurc": 0.05, "aurc": 0.3,
               "auroc_question_n": n_problems, "mean_tokens": 12.0}
    return SimpleNamespace(metrics=metrics, samples=samples,
                           curves={"precision_coverage": {"coverage": [0.5, 1.0], "precision": [1.0, accuracy]}})


@pytest.fixture
def fakes(monkeypatch):
    """Fake training and test evaluation (any front end's), and a spy on the one driver."""
    from capo_trl.harness import runs

    calls = SimpleNamespace(trained=[], studies=[])

    def train_method(overrides, seed, budget, out_dir, dataset=None, on_trainer=None):
        calls.trained.append((overrides["advantage_estimator"], seed))
        return None, [{"step": 0, "val/auroc": 0.5}], _fake_result(budget.test_problems, budget.test_samples,
                                                                    0.5 + 0.1 * seed)

    def evaluate_test(model, tokenizer, budget, seed, dataset=None):
        return _fake_result(budget.test_problems, budget.test_samples, 0.3)

    real = driver.run_study

    def run_study(study, workers=0):
        calls.studies.append([(label, seed) for label, _, seed in driver.plan(study.methods, study.seeds)])
        return real(study, workers)

    monkeypatch.setattr(runs, "train_method", train_method)
    monkeypatch.setattr(runs, "evaluate_test", evaluate_test)
    monkeypatch.setattr(driver, "run_study", run_study)
    return calls


def _compare(out):
    from capo_trl.cli.main import main

    assert main(["compare", "--methods", "grpo,capo", "--seeds", "2", "--out", str(out), "--steps", "2",
                 "--test_problems", "4", "--test_samples", "2", "--val_every", "1", "--val_problems", "4",
                 "--val_samples", "2", "--no_progress"]) == 0
    return lambda label, seed: out / "runs" / f"{label}-seed{seed}" / "result.json"


def _testbed(out):
    from capo_trl.harness import testbed

    testbed.main(["run", "--task", "guess-half", "--methods", "grpo,capo", "--seeds", "0", "1", "--steps", "2",
                  "--test_problems", "4", "--workers", "0", "--out", str(out)])
    assert testbed.summarise(out)["complete_seeds"] == [0, 1]  # the report reads every saved run
    return lambda label, seed: out / label / f"seed{seed}.json"


@pytest.mark.parametrize("front_end", [_compare, _testbed], ids=["compare", "testbed"])
def test_compare_and_the_test_bed_resume_through_the_one_driver(fakes, tmp_path, front_end):
    out = tmp_path / "out"
    path = front_end(out)
    pairs = [("grpo", 0), ("capo", 0), ("grpo", 1), ("capo", 1)]
    assert fakes.studies == [pairs] and fakes.trained == pairs  # seed-major, through driver.run_study
    saved = {pair: path(*pair).read_bytes() for pair in pairs}
    path("capo", 0).unlink()

    front_end(out)  # the same command again
    assert fakes.studies == [pairs, pairs] and fakes.trained == [*pairs, ("capo", 0)]  # only the missing run
    for pair in pairs:
        if pair != ("capo", 0):
            assert path(*pair).read_bytes() == saved[pair]
    assert json.loads(path("capo", 0).read_text())["seed"] == 0


def test_the_pilot_resumes_through_the_one_driver(fakes, tmp_path):
    from capo_trl.data.tasks import get_task
    from capo_trl.harness import pilot

    out = tmp_path / "pilot"
    argv = ["--task", "guess-half", "--model", str(get_task("guess-half").model_path()), "--seeds", "0", "1",
            "--steps", "2", "--test_problems", "4", "--out", str(out)]
    pilot.main(argv)
    assert fakes.studies == [[("grpo", 0), ("grpo", 1)]] and fakes.trained == [("grpo", 0), ("grpo", 1)]
    assert list(json.loads((out / "verdict.json").read_text())["per_seed"]) == ["0", "1"]
    kept = (out / "seed0.json").read_bytes()
    (out / "seed1.json").unlink()
    pilot.main(argv)
    assert fakes.trained == [("grpo", 0), ("grpo", 1), ("grpo", 1)]  # only the missing seed
    assert (out / "seed0.json").read_bytes() == kept and (out / "seed1.json").is_file()
    assert "GRPO seed 1" in (out / "pilot.md").read_text()
