"""`capo-trl train` killed with SIGKILL at many moments (inside steps, inside checkpoint saves, inside
`save_total_limit`'s rotation) and resumed each time with `--resume_from_checkpoint last` ends bit for bit
where the run that was never stopped ends, or is refused in one line; never a traceback.

Two chains of kills on the embedded tiny model, with state a resume can lose: the mask's measured thresholds
(`ref_thresholds auto`) and the reference-score cache; CoDaPO's replay with the mask on and
`save_total_limit 1`. The moments are fixed (a file of the checkpoint being written appears, or a seeded
delay after a step's log line; a run that ends before its moment starts the chain afresh for the\nmoments left), the killer watches from outside. After every process, every complete
checkpoint must equal the uninterrupted run's (weights byte for byte, every logged metric), and the final
model must too. The runs are forked from one process that imported the CLI once (`fork_train.py`), so
that twenty starts fit in a minute; the first uninterrupted run is a plain `python -m capo_trl.cli train`,
which the forked one must equal too.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from capo_trl.training.resume import CAPO_STATE, TRAINER_STATE, checkpoint_problem, newest_complete

HERE = Path(__file__).resolve().parent
MAX_STEPS = 5
RUN = ["--max_steps", str(MAX_STEPS), "--save_strategy", "steps", "--save_steps", "1", "--per_device_train_batch_size",
       "16", "--num_generations", "4", "--max_completion_length", "12", "--dataset_limit", "64", "--warmup_steps", "0",
       "--learning_rate", "1e-3", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "5",
       "--reward_funcs", "capo_trl.testing.tiny:digit_reward"]  # the embedded model and task: no model named
SETTINGS = {
    "mask-auto": ["--noise_mask", "true", "--ref_thresholds", "auto"],
    "codapo-replay-limit1": ["--advantage_estimator", "codapo", "--codapo_replay", "true", "--noise_mask", "true",
                             "--ref_thresholds", "auto", "--save_total_limit", "1"],
}
# (what to wait for, which checkpoint: the k-th after the one resumed from, or the k-th step line)
MOMENTS = {
    "mask-auto": [
        ("file", 1, "model.safetensors"),  # inside the first save: nothing complete yet, so resuming is refused
        ("step", 1, None),  # a seeded delay (< 0.05 s) after step 1's log line: in step 2 or its save
        ("file", 1, TRAINER_STATE),  # the save's last file (the old order wrote CAPO's state after it)
        ("file", 1, ""),  # the checkpoint folder appears: CAPO's state being written
        ("file", 1, "optimizer.pt"),
        ("step", 1, None),
        ("last", MAX_STEPS, TRAINER_STATE),  # the last checkpoint written: the run is finished there
    ],
    "codapo-replay-limit1": [
        ("step", 1, None),
        ("file", 1, TRAINER_STATE),  # rotation deletes the older checkpoint right after this
        ("file", 1, "rng_state.pth"),
        ("file", 2, "model.safetensors"),
        ("step", 2, None),
        ("file", 1, TRAINER_STATE),
    ],
}
VOLATILE = ("time", "per_second", "epoch")  # log keys that differ between equal runs


def env() -> dict:
    path = os.pathsep.join([str(HERE.parent / "src"), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}


class Launcher:
    """Drives ``fork_train.py``: start a run, watch it, kill its process group, read its exit status."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fork_train.py")], env=env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.buffer = b""

    def line(self, timeout: float) -> str | None:
        """The launcher's next line, or None if none comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"the launcher died (status {self.proc.wait(10)})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def start(self, argv: list[str], log: Path) -> int:
        self.proc.stdin.write((json.dumps({"argv": argv, "log": str(log)}) + "\n").encode())
        self.proc.stdin.flush()
        answer = self.line(120)  # the first answer waits for the imports
        assert answer and answer.startswith("pid "), answer
        return int(answer.split()[1])

    def ended(self, timeout: float = 0.0) -> int | None:
        answer = self.line(timeout)
        return None if answer is None else int(answer.split()[1])

    def close(self):
        try:
            self.proc.stdin.write(b"\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def launcher():
    launcher = Launcher()
    yield launcher
    launcher.close()


def reached(moment, out: Path, start: int, log: Path, armed: dict) -> bool:
    kind, k, name = moment
    if armed["fresh"] and not armed.get("cleared"):  # an overwriting run: the old run's checkpoints count for none
        armed["cleared"] = not any(out.glob("checkpoint-*"))  # until it has deleted them
        return False
    if kind in ("file", "last"):  # the k-th checkpoint after the one resumed from; "last": checkpoint-k
        return (out / f"checkpoint-{k if kind == 'last' else start + k}" / name).exists()
    if "at" not in armed:  # "step": the k-th step's log line of this process, then the seeded delay
        if log.read_text(errors="replace").count("{'loss'") >= k:
            armed["at"] = time.monotonic() + armed["delay"]
        return False
    return time.monotonic() >= armed["at"]


def run_until(launcher, argv, out, log, moment, rng, deadline=120.0) -> tuple[int, bool]:
    """Start a run, SIGKILL its process group at ``moment`` (None: let it end); (exit status, killed). A run that
    overwrites the folder starts from step 0 whatever checkpoints the old run left."""
    fresh = "--overwrite_output_dir" in argv or not newest_complete(str(out))[0]
    start = 0 if fresh else int(newest_complete(str(out))[0].rsplit("-", 1)[1])
    armed = {"delay": rng.uniform(0.0, 0.05) if rng else 0.0, "fresh": "--overwrite_output_dir" in argv}
    pid = launcher.start(argv, log)
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        status = launcher.ended(0.0005)
        if status is not None:
            return status, False
        if moment is not None and reached(moment, out, start, log, armed):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended just now
                pass
            status = launcher.ended(30)
            return status, status == -signal.SIGKILL
    os.killpg(pid, signal.SIGKILL)
    pytest.fail(f"{log} ran past {deadline} s")


def logged(folder: Path) -> list[dict]:
    rows = json.loads((folder / TRAINER_STATE).read_text())["log_history"]
    return [{k: v for k, v in r.items() if not any(word in k for word in VOLATILE)} for r in rows]


def same_as_reference(folder: Path, ref: Path) -> None:
    """A checkpoint (or the final model folder) equals the uninterrupted run's: weights and every logged number."""
    assert (folder / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes(), \
        f"{folder} has other weights than the run never stopped"
    if (folder / TRAINER_STATE).exists():
        assert logged(folder) == logged(ref), f"{folder} logged other metrics than the run never stopped"


def check_checkpoints(out: Path, ref: Path, figures: Counter) -> None:
    for folder in sorted(out.glob("checkpoint-*")):
        if checkpoint_problem(str(folder)) is None:
            same_as_reference(folder, ref / folder.name)
            figures["complete checkpoints equal"] += 1


def chain(launcher, setting: str, out: Path, ref: Path, seed: int) -> Counter:
    """Kill a run at each of its moments in turn, resuming it each time; then let it finish."""
    rng, figures, fresh = random.Random(seed), Counter(), False
    moments = list(MOMENTS[setting])
    for attempt in range(2 * len(moments) + 4):
        moment = moments[0] if moments else None
        resume = ([] if attempt == 0 else ["--overwrite_output_dir", "true"] if fresh
                  else ["--resume_from_checkpoint", "last"])
        log = out.parent / f"{setting}-{attempt}.log"
        status, killed = run_until(launcher, [*RUN, *SETTINGS[setting], "--output_dir", str(out), *resume], out, log,
                                   moment, rng)
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log}:\n{text[-3000:]}"
        figures["processes"] += 1
        fresh = False
        states = {f.name: checkpoint_problem(str(f)) or "complete" for f in sorted(out.glob("checkpoint-*"))}
        print(f"  {setting} #{attempt} {' '.join(resume) or 'fresh'}: moment {moment}, exit {status}, {states}")
        if killed:
            moments.pop(0)
            figures["kills"] += 1
            broken = [f for f in out.glob("checkpoint-*") if checkpoint_problem(str(f))]
            figures["kills leaving an incomplete checkpoint"] += bool(broken)
        elif status == 2:  # refused: one line on stderr, "capo-trl train: ..."
            last = text.strip().splitlines()[-1]
            assert last.startswith("capo-trl train: resume_from_checkpoint") and "Traceback" not in text, last
            figures["refusals"] += 1
            if "no complete checkpoint" in last:
                fresh = True
            else:  # killed after the last checkpoint: that checkpoint is the trained model
                assert f"is step {MAX_STEPS} of max_steps={MAX_STEPS}" in last, last
                same_as_reference(out / f"checkpoint-{MAX_STEPS}", ref / f"checkpoint-{MAX_STEPS}")
                figures["ends equal"] += 1
                check_checkpoints(out, ref, figures)
                return figures
        else:
            assert status == 0, f"{log} exited with {status}:\n{text[-3000:]}"
            same_as_reference(out, ref)
            figures["ends equal"] += 1
            check_checkpoints(out, ref, figures)
            if not moments:
                return figures
            # the run finished before its moment came (a fast machine: fewer steps were left than the moment
            # needs): start the chain afresh for the moments left, so every moment is tried on every machine
            figures["chains restarted"] += 1
            fresh = True
            continue
        figures["resumes skipping an incomplete checkpoint"] += "skipping incomplete" in text
        check_checkpoints(out, ref, figures)
    pytest.fail(f"{setting}: {len(moments)} moments left after {figures['processes']} processes: {figures}")


def test_kill_anywhere_then_resume_last_equals_never_stopping(launcher, tmp_path):
    totals = Counter()
    for n, setting in enumerate(SETTINGS):
        ref = tmp_path / f"{setting}-reference"  # every checkpoint kept, to compare each (rotation changes no number)
        unlimited = " ".join(SETTINGS[setting]).replace("--save_total_limit 1", "").split()
        argv = [*RUN, *unlimited, "--output_dir", str(ref)]
        if n == 0:  # a plain process, as a user starts it: the forked runs must equal it
            done = subprocess.run([sys.executable, "-m", "capo_trl.cli", "train", *argv], env=env(), timeout=300,
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-3000:]
            forked = tmp_path / f"{setting}-forked"
            status, _ = run_until(launcher, [*argv[:-1], str(forked)], forked, tmp_path / "forked.log", None, None)
            assert status == 0
            same_as_reference(forked, ref)
            same_as_reference(forked / f"checkpoint-{MAX_STEPS}", ref / f"checkpoint-{MAX_STEPS}")
        else:
            status, _ = run_until(launcher, argv, ref, tmp_path / f"{setting}-reference.log", None, None)
            assert status == 0
        last = ref / f"checkpoint-{MAX_STEPS}"
        assert (last / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()  # the model
        # the state a resume could lose is there: measured thresholds, and (CoDaPO) a replay under way
        states = [torch.load(ref / f"checkpoint-{s}" / CAPO_STATE, weights_only=True)["processes"][0]
                  for s in range(1, MAX_STEPS + 1)]
        assert all(s["mask"]["measured_thresholds"] is not None for s in states[1:]), setting
        if "codapo" in setting:
            assert any(s["method_state"]["pending"] for s in states), "no replay was planned at any checkpoint"
        figures = chain(launcher, setting, tmp_path / setting, ref, seed=n)
        print(setting, dict(figures))
        totals.update(figures)
    print("total", dict(totals))
    assert totals["ends equal"] == len(SETTINGS) + totals["chains restarted"]
    assert totals["kills"] >= 10 and totals["kills leaving an incomplete checkpoint"] >= 4, totals
    assert totals["refusals"] >= 2, totals  # nothing complete yet; the finished run


def test_the_killer_hits_a_run_just_started_and_an_overwriting_run_at_its_own_checkpoint(launcher, tmp_path):
    """What the chain relies on: a kill right after the start reaches the run (its process group exists before its
    pid is told), and an overwriting run's file moment waits for its own checkpoint, not the old run's leftovers."""
    out, argv = tmp_path / "run", [*RUN, *SETTINGS["mask-auto"], "--output_dir", str(tmp_path / "run")]
    status, killed = run_until(launcher, argv, out, tmp_path / "at-once.log", ("step", 0, None), None)
    assert (status, killed) == (-signal.SIGKILL, True)
    (out / "checkpoint-1").mkdir(parents=True, exist_ok=True)  # an old run's incomplete checkpoint
    (out / "checkpoint-1" / "model.safetensors").write_bytes(b"cut short")
    log = tmp_path / "overwrite.log"
    status, killed = run_until(launcher, [*argv, "--overwrite_output_dir", "true"], out, log, ("file", 1, ""), None)
    assert (status, killed) == (-signal.SIGKILL, True)
    stale = out / "checkpoint-1" / "model.safetensors"  # killed in its own first save: the leftover is gone
    assert (out / "checkpoint-1").is_dir() and not (stale.exists() and stale.read_bytes() == b"cut short")
