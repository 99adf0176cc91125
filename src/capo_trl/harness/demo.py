"""`capo-trl demo`: GRPO and CAPO side by side on an embedded task, accuracy and calibration before and after
(CPU, minutes)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from . import runs
from ..evaluation.plots import DEMO_PANELS
from .driver import Study, run_study
from .presets import Budget, check_budget, check_methods, parse_methods
from .runs import HEADLINE, START, headline

# The task `capo-trl demo` trains when none is named: the test bed where GRPO loses calibration.
DEMO_TASK = "guess-half"

# Each task's demo budget where the harness's default (200 steps at 2e-4) would not show what the task is for:
# on guess-half, 300 steps at 4e-4 (the test bed's total step size, 600 at 2e-4, the rate decaying linearly to 0)
# made GRPO lose pooled AUROC on 3 of 3 seeds in an exploratory pilot, and CAPO without the mask broke on none;
# at 200 steps and 6e-4 it broke on 1 of 3 (docs/results/: the demo budget pilot).
DEMO_BUDGETS = {"guess-half": dict(steps=300, learning_rate=4e-4)}
DEMO_METHODS = "grpo,capo"


def demo_budget(task: str = DEMO_TASK, **fields) -> Budget:
    """The demo's budget on ``task``: 200 steps (``DEMO_BUDGETS`` may say otherwise), validation 4 times on 64
    problems x 4, test 256 x 8; ``fields`` (None: the task's default) amend it."""
    chosen = {**dict(steps=200, val_problems=64, test_problems=256, test_samples=8), **DEMO_BUDGETS.get(task, {})}
    chosen.update({k: v for k, v in fields.items() if v is not None})
    chosen.setdefault("val_every", max(1, chosen["steps"] // 4))
    return Budget(task=task, **chosen)


@functools.cache
def committed() -> dict:
    """What the committed studies say, as the package ships it (``assets/committed_studies.json``, written from
    docs/results/ by ``scripts/results_demo.py`` and held equal to the records by a test)."""
    return json.loads((Path(__file__).resolve().parents[1] / "assets" / "committed_studies.json").read_text())


def evidence(budget: Budget) -> str:
    """What the committed studies say about the task the demo ran, how far its one run can speak to it, and what
    the real model's studies found (another model and task: said apart)."""
    return (_tiny_evidence(budget) + "\nOn a real model, not this demo's (docs/results/: its first confirmatory study):\n"
            + committed()["real"])


def _tiny_evidence(budget: Budget) -> str:
    task = committed()["tasks"].get(budget.task)
    if task is None:
        return (f"\nNo committed study compared GRPO and CAPO on {budget.task} (docs/results/): this one run is not "
                "evidence.\n")
    if "study" not in task:
        return task["words"]
    text = "\nWhat the evidence on this task says (tiny models on CPU; docs/results/):\n" + task["words"]
    piloted = DEMO_BUDGETS.get(budget.task)
    lr = _rate(budget.learning_rate)
    if piloted and budget.model is None and all(getattr(budget, k) == v for k, v in piloted.items()):
        tail = (f"This demo's budget on {budget.task} ({budget.steps} steps at learning rate {lr}) was chosen in an "
                "exploratory pilot (docs/results/: the demo budget pilot)")
    else:
        tail = (f"The studies trained 600 steps at learning rate 2e-4; this run's budget ({budget.steps} steps at "
                f"{lr}{', another start model' if budget.model else ''}) was not tested for showing it")
    tail += ", and each arm above is one run of one seed: read it against the intervals above, not as evidence."
    return text + "\n" + textwrap.fill(tail, width=110, break_on_hyphens=False) + "\n"


def _rate(value: float) -> str:
    """A learning rate as the docs write it: 4e-4, not 0.0004."""
    return f"{value:g}" if value >= 1e-3 else f"{value:.0e}".replace("e-0", "e-")


# ------------------------------------------------------------------------------------ the committed study
# The committed study the demo's one run is read against, in its printout and its picture.
SHOWN = dict(DEMO_PANELS)  # each endpoint the demo sets against the study: higher is better in each
CPU_VARIATION = (
    "These numbers are one run of one seed, and not the same on every machine: the same command and seed give "
    "other numbers on another kind of CPU or another torch build (float rounding differs, and the sampled answers "
    "part ways from there); no committed file measures by how much. Read them against the committed study's seeds, "
    "not against another machine's run or docs/demo.png.")


def _same_method(a: dict, b: dict) -> bool:
    """Two presets train alike: equal but for skip_zero_advantage_rows, which leaves every update unchanged."""
    drop = "skip_zero_advantage_rows"
    return {k: v for k, v in a.items() if k != drop} == {k: v for k, v in b.items() if k != drop}


def committed_study(budget: Budget, methods: list) -> dict | None:
    """The committed pre-registered study of the demo's task (:func:`committed`): for each demo arm (``methods``:
    parsed ``[(label, overrides)]``) that one of its arms trained, every :data:`SHOWN` endpoint on each seed of the
    look that ended it, with their mean and 95% t interval; its start model's; its budget. None where no study ran
    this task from its own start model."""
    study = committed()["tasks"].get(budget.task, {}).get("study")
    if budget.model is not None or budget.grader_noise or study is None:
        return None
    arms = {}
    for label, overrides in methods:
        arm = next((name for name, a in study["arms"].items() if _same_method(overrides, a["method"])), None)
        if arm is not None:
            arms[label] = {"arm": arm, **{key: study["arms"][arm][key] for key in SHOWN}}
    return {**study, "arms": arms}


def against_study(before: dict, records: list[dict], study: dict | None, budget: Budget) -> str:
    """This run's test numbers beside the committed study's seeds, endpoint by endpoint (higher is better)."""
    if study is None:
        return ""
    width = max(len(START), *(len(r["method"]) for r in records))
    lines = [f"This run against the committed study's {study['seeds']} seeds ({study['folder']}: {study['steps']} "
             f"steps each,\ntest split {study['test_problems']} problems x 8); higher is better in each:"]
    for key, name in SHOWN.items():
        lines.append(f"  {name}: this run | study mean [95% t interval] (lowest to highest seed)")
        lines.append(f"    {START:<{width}} {_value(before[key])} | {study['start'][key]:.3f} (one evaluation)")
        for r in records:
            s = study["arms"].get(r["method"])
            said = ("no arm of the study trained this method" if s is None else
                    f"{s[key]['mean']:.3f} [{s[key]['low']:.3f}, {s[key]['high']:.3f}] ({min(s[key]['values']):.3f} "
                    f"to {max(s[key]['values']):.3f}; the study's {s['arm']})")
            lines.append(f"    {r['method']:<{width}} {_value(r['after'][key])} | {said}")
    return "\n".join(lines)


def _value(v) -> str:
    return "  nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


# ------------------------------------------------------------------------------------ the arms and their bars
def _step_file(progress_dir: str, label: str) -> Path:
    return Path(progress_dir) / (label.replace("/", "_") + ".step")


def _report_steps(path: Path):
    """A callback that writes the trainer's step to ``path`` (read by the parent's progress bar)."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(str(state.global_step))
            tmp.replace(path)

    return lambda trainer: trainer.add_callback(Steps())


def train_and_test(budget: Budget, progress_dir: str | None, label: str, overrides: dict, seed: int) -> dict:
    """One arm of the demo, in its own process: trained, tested, its numbers kept (no model is saved).

    With ``progress_dir``, each finished step is written to a file there, from which the parent draws this arm's bar.
    """
    import torch

    torch.set_num_threads(1)  # one core per arm: the arms run side by side
    started = time.time()
    report = _report_steps(_step_file(progress_dir, label)) if progress_dir else None
    with tempfile.TemporaryDirectory() as tmp:
        _, history, after = runs.train_method(overrides, seed, dataclasses.replace(budget, progress=False), Path(tmp),
                                              on_trainer=report)
    return {"method": label, "after": headline(after.metrics, budget.test_samples), "history": history,
            "mean_tokens": after.metrics.get("mean_tokens"), "seconds": time.time() - started}


@contextlib.contextmanager
def _arm_bars(labels: list[str], steps: int, progress_dir: str, enabled: bool, every: float = 0.5):
    """One progress bar per arm (its training steps, then its test), redrawn from the arms' step files.

    Yields ``done(label, text)``, which shows ``text`` on that arm's bar and returns it. While the bars are drawn,
    what is printed (the finished-run lines) is held, and written once they have closed: no line cuts through a bar.
    """
    if not enabled:
        yield lambda label, text: text
        return
    from tqdm import tqdm

    width = max(len(label) for label in labels)
    bars = {label: tqdm(total=steps, desc=f"{label:<{width}} training", position=i, unit="step", leave=True,
                        dynamic_ncols=True) for i, label in enumerate(labels)}
    finished: dict = {}
    stop = threading.Event()

    def describe(label):
        text = finished.get(label) or ("trained, testing" if bars[label].n >= steps else "training")
        bars[label].set_description(f"{label:<{width}} {text}")

    def done(label, text):
        finished[label] = text
        describe(label)
        return text

    def refresh():
        for label, bar in bars.items():
            try:
                step = int(_step_file(progress_dir, label).read_text() or 0)
            except (OSError, ValueError):
                continue
            if step > bar.n:
                bar.update(step - bar.n)
                describe(label)

    def redraw():
        while not stop.wait(every):
            refresh()

    import transformers

    loading_bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # the start model's "Loading weights" would cut through them
    watcher = threading.Thread(target=redraw, daemon=True)
    watcher.start()
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            yield done
    finally:
        if loading_bars:
            transformers.utils.logging.enable_progress_bar()
        stop.set()
        watcher.join(timeout=5)
        refresh()  # the last steps, had the arms finished between two reads
        for bar in bars.values():
            bar.close()
        sys.stdout.write(held.getvalue())
        sys.stdout.flush()


def _table(before: dict, records: list[dict]) -> str:
    rows = [(START, before)] + [(r["method"], r["after"]) for r in records]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}} " + " ".join(f"{k:>15}" for k in HEADLINE)]
    lines += [f"{name:<{width}} " + " ".join(f"{values[k]:>15.4f}" for k in HEADLINE) for name, values in rows]
    return "\n".join(lines)


def _curves(records: list[dict], budget: Budget) -> str:
    steps = [h["step"] for h in records[0]["history"]]
    width = max(len(r["method"]) for r in records)
    lines = [f"validation pooled AUROC over steps ({budget.val_problems} problems x {budget.val_samples} samples):",
             f"{'step':<{width}} " + " ".join(f"{s:>7}" for s in steps)]
    for r in records:
        lines.append(f"{r['method']:<{width}} " + " ".join(f"{h.get('val/auroc', float('nan')):>7.3f}" for h in r["history"]))
    return "\n".join(lines)


def demo(budget: Budget | None = None, methods: str = DEMO_METHODS, plot: str | Path | None = None,
         seed: int = 0) -> dict:
    """GRPO and CAPO (``methods``) trained side by side, one process each, on an embedded task (default
    :data:`DEMO_TASK`); accuracy and calibration of the start model and of each, the validation AUROC over steps,
    this run against the committed study's seeds on that task, and what that study found (CPU, minutes).

    ``plot``: where to write the PNG (each test endpoint, this run against the committed study's seeds); None: none.
    The methods and the budget are checked first (a UsageError naming ``--methods`` or the budget flag),
    so a typo fails at once, not after the first evaluation. The start model is evaluated while the arms train,
    each arm's progress drawn as a bar (``budget.progress``).
    """
    budget = budget or demo_budget()
    parsed = parse_methods(methods, flag="--methods")
    check_budget(budget)
    check_methods(parsed, budget, flag="--methods")
    started, load = time.time(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory() as tmp:  # nothing is saved: the demo only reports
        index = {label: i for i, (label, _) in enumerate(parsed)}
        progress_dir = tmp if budget.progress else None
        print(f"training {', '.join(label for label, _ in parsed)} side by side on {budget.task}, one process each "
              f"({budget.steps} steps, seed {seed}); evaluating the start model meanwhile", flush=True)
        labels = [label for label, _ in parsed]
        with _arm_bars(labels, budget.steps, tmp, budget.progress) as done, ThreadPoolExecutor(1) as pool:
            study = Study(parsed, [seed], path=lambda label, _: Path(tmp) / f"{index[label]}.json",
                          run=partial(train_and_test, budget, progress_dir),
                          describe=lambda r: done(r["method"], f"trained and tested in {r['seconds']:.0f} s"),
                          rerun="The demo saves nothing: rerun it to train every arm again.")
            arms = pool.submit(run_study, study, len(parsed))
            start_budget = dataclasses.replace(budget, progress=False)  # its bars would run through the arms'
            before = headline(runs.evaluate_start(start_budget).metrics, budget.test_samples)
            records = list(arms.result().values())
    seconds = time.time() - started
    cores = f"{os.cpu_count()} CPU cores" + (f", load average {load:.1f} at its start" if load is not None else "")
    print("\n" + textwrap.fill(
        f"{', '.join(r['method'] for r in records)} side by side on the embedded task {budget.task}: {budget.steps} "
        f"RL steps each at learning rate {_rate(budget.learning_rate)}, seed {seed}; test split "
        f"{budget.test_problems} problems x {budget.test_samples} samples; {seconds:.0f} s of wall time here "
        f"({cores})", width=110, break_on_hyphens=False))
    print(_table(before, records))
    print(textwrap.fill(CPU_VARIATION, width=110, break_on_hyphens=False))
    print()
    print(_curves(records, budget))
    committed = committed_study(budget, parsed)
    compared = against_study(before, records, committed, budget)
    if compared:
        print("\n" + compared)
    print(evidence(budget))
    if plot is not None:
        from ..evaluation.plots import demo_figure

        title = (f"{budget.task}: this run ({budget.steps} RL steps at learning rate {_rate(budget.learning_rate)}, "
                 f"seed {seed}; test {budget.test_problems} problems x {budget.test_samples})")
        drawn = None if committed is None else {
            "label": (f"committed study, {committed['seeds']} seeds of {committed['steps']} steps "
                      f"({committed['folder']}; test {committed['test_problems']} x 8)"),
            "start": committed["start"], "arms": committed["arms"]}
        path = demo_figure(before, records, plot, title, drawn, run_label=f"this run (seed {seed})")
        print(f"\nwrote {path}")
    return {"before": before, "study": committed, **{r["method"]: r for r in records}}


__all__ = ["CPU_VARIATION", "DEMO_BUDGETS", "DEMO_TASK", "against_study", "committed", "committed_study", "demo",
           "demo_budget", "evidence", "train_and_test"]
