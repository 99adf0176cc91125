"""Every method x every seed, resumable, one file per finished run: the one loop behind ``capo-trl
compare``, the test-bed comparison (:mod:`~capo_trl.harness.testbed`) and the pilot
(:mod:`~capo_trl.harness.pilot`).

A front end says where a run's record lives, how one (method, seed) becomes a JSON record, which
saved record it reuses and what it rewrites after each run (its report). The driver plans the pairs
seed-major (every method of a seed before the next seed, so a stopped study has whole seeds), reuses
the saved ones, runs the others here or ``workers`` at a time in fresh processes, and saves each
record whole the moment its run has finished, from the process that ran it.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FAILURE_TAIL = 3000  # characters of a failed worker's output shown with its error


def write_json(path: Path, data) -> None:
    """Written whole or not at all: an interrupted run never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def read_json(path: Path):
    """The saved JSON, or None when there is none or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def reuse_any(path: Path, label: str, overrides: dict, seed: int):
    """The default reuse rule: any readable record (the front end's directory names the study)."""
    return read_json(path)


def _nothing(finished: dict) -> None:
    pass


def _seconds(record: dict) -> str:
    return f"{record.get('seconds', 0):.0f} s"


@dataclass(frozen=True)
class Study:
    """What a front end tells the driver.

    ``run(label, overrides, seed)`` trains one run and returns its JSON-ready record; with worker
    processes it must be picklable (a module-level function, or a ``functools.partial`` of one).
    ``reuse(path, label, overrides, seed)`` is the saved record to keep, None to run it again (also
    how a just-saved record is read back, so a fresh run and a resumed one look the same).
    ``after(finished)`` runs once the saved runs are read and after every new one, with the
    finished records by ``(label, seed)`` in plan order; ``describe(record)`` is its console line; ``rerun``
    what the error after failed runs tells the user to do.
    """

    methods: list  # [(label, overrides)], in the order every seed runs them
    seeds: list
    path: Callable[[str, int], Path]
    run: Callable[[str, dict, int], dict]
    reuse: Callable = reuse_any
    after: Callable[[dict], None] = _nothing
    describe: Callable[[dict], str] = _seconds
    rerun: str = "Rerun the same command to run them again (finished runs are reused)."  # said after failures


def plan(methods, seeds) -> list[tuple[str, dict, int]]:
    """Seed-major: every method of a seed before the next seed; a (method, seed) named twice runs once."""
    pairs = {(label, seed): overrides for seed in seeds for label, overrides in methods}
    return [(label, overrides, seed) for (label, seed), overrides in pairs.items()]


def run_study(study: Study, workers: int = 0) -> dict:
    """Run every (method, seed) of ``study`` that has no reusable record; returns the records by (label, seed).

    ``workers=0`` runs here, one after the other, and a failure stops the study at once;
    ``workers=N`` runs N at a time, each in a fresh interpreter (its memory returned when it ends),
    and a failed run is reported while the others go on; the study raises once all have ended.
    """
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers={workers!r} is invalid; it must be an integer >= 0 (0 runs here).")
    planned = plan(study.methods, study.seeds)
    finished = {}
    for label, overrides, seed in planned:
        path = study.path(label, seed)
        record = study.reuse(path, label, overrides, seed) if path.is_file() else None
        if record is not None:
            finished[(label, seed)] = record
            print(f"[{label} seed {seed}] reused {path}", flush=True)

    def in_order():
        return {(label, seed): finished[(label, seed)] for label, _, seed in planned if (label, seed) in finished}

    study.after(in_order())
    todo = [job for job in planned if (job[0], job[2]) not in finished]
    failed = []
    for (label, overrides, seed), error in _execute(study, todo, workers):
        if error is not None:
            failed.append(f"{label} seed {seed}")
            print(f"[{label} seed {seed}] FAILED: {error}", flush=True)
            continue
        path = study.path(label, seed)
        record = study.reuse(path, label, overrides, seed)
        if record is None:
            raise RuntimeError(f"{path}: the record of {label} seed {seed} was saved but does not read back.")
        finished[(label, seed)] = record
        print(f"[{label} seed {seed}] {study.describe(record)}", flush=True)
        study.after(in_order())
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(todo)} runs failed ({', '.join(failed)}); their output is above. "
                           + study.rerun)
    return in_order()


def _run_and_save(run, path: Path, label: str, overrides: dict, seed: int) -> None:
    """One run, its record saved where the front end reads it."""
    record = run(label, overrides, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


# A worker: a plain interpreter given the parent's import path, then its pickled job on stdin. It ends
# as any Python program does: atexit handlers first (one closes the grader's worker pool), then its
# child processes are joined. A multiprocessing child joins them first and would wait for that pool forever.
_WORKER = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
           "from capo_trl.harness.driver import _worker; _worker(sys.stdin.buffer)")


def _worker(stream) -> None:
    _run_and_save(*pickle.load(stream))


def _in_worker(run, path: Path, job: tuple) -> str | None:
    """One run in a fresh interpreter: None once its record is saved, else its error and the end of its output."""
    payload = pickle.dumps(list(sys.path)) + pickle.dumps((run, path, *job))
    with tempfile.TemporaryFile() as log:
        done = subprocess.run([sys.executable, "-c", _WORKER], input=payload, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode == 0:
            return None
        log.seek(0)
        return f"exit code {done.returncode}\n" + log.read().decode(errors="replace")[-FAILURE_TAIL:]


def _execute(study: Study, todo: list, workers: int):
    """Yields ``(job, None)`` for each finished run, ``(job, error text)`` for each failed one (workers only)."""
    if not workers:
        for label, overrides, seed in todo:
            _run_and_save(study.run, study.path(label, seed), label, overrides, seed)
            yield (label, overrides, seed), None
        return
    func = getattr(study.run, "func", study.run)
    if getattr(func, "__module__", None) == "__main__":
        raise ValueError(f"{func.__qualname__} is defined in __main__, which a worker process cannot import; "
                         "define it in a module (or run with workers=0).")
    with ThreadPoolExecutor(workers) as pool:  # its queue starts the runs in the plan's order
        futures = {pool.submit(_in_worker, study.run, study.path(job[0], job[2]), job): job for job in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()


__all__ = ["Study", "plan", "read_json", "reuse_any", "run_study", "write_json"]
