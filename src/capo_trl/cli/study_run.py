"""Running a study: one run (train, resuming from its last checkpoint; test; keep its record) and the queue.

A run trains with ``capo-trl train`` (the arm's recipe and overrides, the study's task, steps, seed and model) and
tests the trained model with ``capo-trl eval`` (the study's test settings), both in the run's own process and each
done once: a run killed at any point resumes from its last checkpoint, and a finished one is never redone. Its record,
``<arm>/seed<k>.json``, holds the test endpoints (per item kind where the task has guessable items), the kept keys
of the training log, wall times and the commit it ran under; it is written whole, last.

The queue runs every (arm, seed) the study still lacks, seed-major (every arm of a seed before the next seed), in
``slots`` processes of one thread each, each with the study's deadline per run; a record that exists is skipped,
so a queue restarted on a new machine redoes only unfinished runs (from their checkpoints where the runs folder
survived, else from scratch).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..errors import UsageError
from ..harness.driver import write_json
from .. import __version__
from ..harness.study import Study, refuse_unrunnable, repo_root
from ..harness.study_freeze import check_code, code_version

ENDPOINT_KEYS = ("auroc", "auroc_question", "ece", "e_aurc")


def record_of(report: dict, samples_csv: Path, task: str, n: int) -> dict:
    """What a study keeps of one test evaluation: the endpoints, length and format, per item kind."""
    from ..data.guessing import guess_breakdown
    from ..data.tasks import get_task

    m = report["metrics"]
    out = {"accuracy": m[f"mean@{n}"], "accuracy_ci": [m[f"mean@{n}_ci_low"], m[f"mean@{n}_ci_high"]],
           **{k: m[k] for k in ENDPOINT_KEYS}, "auroc_question_n": m["auroc_question_n"],
           "mean_tokens": m["mean_tokens"], "finished_frac": m["finished_frac"], "answered_frac": m["answered_frac"]}
    with open(samples_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    problems = get_task(task).dataset("test", m["n_problems"])
    if "guessable" not in problems.column_names:  # a task without guessable items has no per-kind endpoints
        return out
    samples = [{"grade": None if r["grade"] == "" else float(r["grade"]), "score": float(r["score"]),
                "extracted": r["extracted"] or None} for r in rows]
    kinds = guess_breakdown(samples, problems, n)
    return {**out, **{k: v for k, v in kinds.items() if not (isinstance(v, float) and math.isnan(v))}}


def _train_args(study: Study, arm: str, seed: int, run: Path) -> list[str]:
    spec = study.arms[arm]
    args = ["train", "--config", spec.recipe, "--dataset_name", study.arm_task(arm), "--seed", str(seed),
            "--max_steps", str(study.arm_steps(arm)), "--output_dir", str(run)]
    if study.model:
        args += ["--model_name_or_path", study.model]
    args += spec.flags()
    from ..training.resume import newest_complete

    if newest_complete(str(run))[0] is not None:
        args += ["--resume_from_checkpoint", "last"]
    elif any(run.iterdir()):  # killed before a whole checkpoint: start afresh, clearing what it left
        args += ["--overwrite_output_dir", "true"]
    return args


def _test_args(study: Study, arm: str, run: Path) -> list[str]:
    t = study.test
    return ["eval", "--model", str(run), "--benchmark", study.arm_task(arm), "--split", t.split, "--limit",
            str(t.problems), "--n", str(t.samples), "--max_new_tokens", str(t.max_new_tokens), "--batch_size",
            str(t.batch_size), "--seed", str(t.seed), "--device", "cpu", "--no_progress", "--out", str(run / "test"),
            "--overwrite"] + (["--dtype", t.dtype] if t.dtype != "float32" else []) + \
        (["--sampler", t.sampler] if t.sampler != "multinomial" else [])


def _command(args: list[str]) -> int:
    """``capo-trl train`` or ``capo-trl eval`` with ``args``, in this process; its exit status."""
    if args[0] == "train":
        from .train import parse_args, run_and_end
        from .train_flags import precheck

        try:
            precheck(args[1:])
            run_and_end(*parse_args(args[1:]))
        except ValueError as err:  # a bad recipe or flag (UsageError included): one line, as the CLI says it
            print(f"capo-trl train: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
        return 0
    import argparse

    from .evaluate import add_eval_parser

    parser = argparse.ArgumentParser(prog="capo-trl", allow_abbrev=False)
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(args)
    try:
        return parsed.func(parsed)
    except UsageError as err:
        print(f"capo-trl eval: {err}", file=sys.stderr)
        return 2


def _step(args: list[str], log: Path) -> None:
    """One ``capo-trl`` command of a run, in this process (one import of TRL for training and test), its output
    appended to ``log``; an error naming the log when it fails. The queue's deadline bounds the whole run."""
    with open(log, "a") as out:
        out.write(f"$ capo-trl {shlex.join(args)}\n")
        out.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            code = _command(args)
        except SystemExit as err:
            code = err.code
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if code:
        raise UsageError(f"capo-trl {args[0]} failed (exit {code}); see {log}.")


def run_one(study: Study, arm: str, seed: int, runs: Path, into: Path | None = None) -> Path:
    """Train (resuming), test and keep one run's record; returns the record's path. Done steps are not redone."""
    refuse_unrunnable(study, "run")
    if arm not in study.own_arms():
        raise UsageError(f"arm {arm!r}: this study runs {study.own_arms()}.")
    if seed not in study.seeds:
        raise UsageError(f"seed {seed}: this study's seeds are {study.seeds}.")
    if study.reused(arm, seed):
        raise UsageError(f"{arm} seed {seed}: this study reuses its record from {study.reuse[arm]['folder']}; it runs "
                         f"{arm} for seeds {[s for a, s in study.own_runs() if a == arm]}.")
    path = study.record_path(arm, seed, into)
    if path.is_file():
        return path
    check_code(study)
    commit, tree = code_version()
    root = repo_root(study.folder)
    run = (runs / study.name / arm / f"seed{seed}").resolve()
    run.mkdir(parents=True, exist_ok=True)
    log = run.parent / f"seed{seed}.log"
    times = json.loads((run / "times.json").read_text()) if (run / "times.json").is_file() else {}
    here = Path.cwd()
    os.chdir(root)  # the recipes' paths are the repository's
    try:
        _train_and_test(study, arm, seed, run, log, times)
    finally:
        os.chdir(here)
    checkpoint = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    logged = [{"step": r["step"], **{k: r[k] for k in study.train_log if k in r}}
              for r in state["log_history"] if "reward" in r]
    spec = study.arms[arm]
    record = {"arm": arm, "task": study.arm_task(arm), "seed": seed, "global_step": state["global_step"],
              "recipe": spec.recipe, "flags": spec.flags(), "capo_trl": __version__, "commit": commit, "src_tree": tree,
              **record_of(json.loads((run / "test" / "report.json").read_text()), run / "test" / "samples.csv",
                          study.arm_task(arm), study.test.samples),
              "train": logged, **times}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    return path


# What a checkpoint holds only to resume training (Trainer's and CAPO's state): the rest is the model as saved.
RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "capo_state.pt", "capo_state_*.pt", "rng_state*.pth")


def _finish_from_checkpoint(run: Path, steps: int, log: Path) -> bool:
    """A run killed after its last step's checkpoint but before ``train.done`` (while the final model was being
    saved, say) has trained: resuming it would be refused (transformers trains one step more). Its model files are
    taken from that checkpoint into ``run``, as the final save writes them (the same weights), and True returned."""
    import shutil

    from ..training.resume import newest_complete

    folder = newest_complete(str(run))[0]
    if folder is None or json.loads((Path(folder) / "trainer_state.json").read_text())["global_step"] < steps:
        return False
    for item in Path(folder).iterdir():
        if item.is_file() and not any(item.match(pattern) for pattern in RESUME_ONLY):
            shutil.copy2(item, run / item.name)
    with open(log, "a") as out:
        out.write(f"training had reached step {steps} ({Path(folder).name}) when it stopped: its model files were "
                  "taken from that checkpoint\n")
    return True


def _train_and_test(study: Study, arm: str, seed: int, run: Path, log: Path, times: dict) -> None:
    """Train (resuming from the last checkpoint), then test, each once: a step that finished is not redone."""
    if not (run / "train.done").is_file():
        t0 = time.time()
        if not _finish_from_checkpoint(run, study.arm_steps(arm), log):
            _step(_train_args(study, arm, seed, run), log)
            times.setdefault("train_s", []).append(round(time.time() - t0))
        (run / "train.done").write_text("")
        write_json(run / "times.json", times)
    if not (run / "test" / "report.json").is_file():
        t0 = time.time()
        _step(_test_args(study, arm, run), log)
        times["test_s"] = round(time.time() - t0)
        write_json(run / "times.json", times)


def pending(study: Study, into: Path | None = None) -> list[tuple[str, int]]:
    """The runs still to do, seed-major, arms in the file's order."""
    return [(arm, seed) for arm, seed in study.own_runs() if not study.record_path(arm, seed, into).is_file()]


def queue(study: Study, runs: Path, slots: int = 2, into: Path | None = None, on_record: str | None = None,
          log=print) -> dict:
    """Run every pending (arm, seed) in ``slots`` worker processes of one thread each; ``on_record`` (a shell
    command, given the record's path as ``$STUDY_RECORD``) runs after each record is written. Returns what
    finished and what failed (a failed run is not retried in this call: its log says why)."""
    refuse_unrunnable(study, "queue")
    check_code(study)
    todo, lock = pending(study, into), threading.Lock()
    done, failed = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    log(f"{study.name}: {len(todo)} runs to do, {slots} at a time")

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                arm, seed = todo.pop(0)
            args = [sys.executable, "-m", "capo_trl.cli", "study", "run", str(study.folder), arm, str(seed),
                    "--runs", str(runs)] + (["--into", str(into)] if into else [])
            log(f"start {arm} seed {seed}")
            try:
                ended = subprocess.run(args, env=env, capture_output=True, text=True,
                                       timeout=study.run_hours * 3600 + 600)
                ok, why = ended.returncode == 0, (ended.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired:
                ok, why = False, f"ran past {study.run_hours} h"
            with lock:
                (done if ok else failed).append((arm, seed))
            log(f"{'finished' if ok else 'FAILED'} {arm} seed {seed}" + ("" if ok else f": {why}"))
            if ok and on_record:
                hook = subprocess.run(on_record, shell=True, timeout=600, capture_output=True, text=True,
                                      env={**env, "STUDY_RECORD": str(study.record_path(arm, seed, into))})
                log(f"on_record {arm} seed {seed}: exit {hook.returncode}")

    threads = [threading.Thread(target=worker) for _ in range(max(1, slots))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"finished": done, "failed": failed}
