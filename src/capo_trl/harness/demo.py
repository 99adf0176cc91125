"""`capo-trl demo`: GRPO and CAPO side by side on an embedded task, accuracy and calibration before and after
(CPU, minutes)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from . import runs
from .driver import Study, run_study
from .evidence import REAL_RESULT, STUDY_RESULTS, real_words, study_words
from .presets import Budget, check_budget, check_methods, parse_methods
from .runs import HEADLINE, START, headline

# The task `capo-trl demo` trains when none is named: the test bed where GRPO loses calibration.
DEMO_TASK = "guess-half"

# What the evidence on each task supports (docs/results/), said after a demo on that task and only there; the test
# beds' words are the blocks their pages render (capo_trl.harness.evidence.study_words).
EVIDENCE = {"arithmetic": """
What the evidence on this task says: on arithmetic GRPO does not lose calibration, so there is nothing for CAPO
to repair. RL raises accuracy and pooled AUROC over the start model whatever the method; per-question AUROC moves
by a few hundredths either way from seed to seed. In a pre-registered comparison (6 seeds, 600 steps, 1,024 test
problems) CAPO with the noise mask (the default then) had per-question AUROC 0.023 below GRPO's (95% interval
-0.049 to +0.003), with 6.5 points less accuracy and higher ECE (docs/results/arithmetic-powered/). Without the
mask one seed in five collapsed into long, improbable endings, with it none did: if mean length climbs, turn it
on (capo-trl compare --methods grpo,capo,capo-mask). Where GRPO does lose calibration: capo-trl demo (its
default task, guess-half).""",
            "guess": """
What the evidence on this task says (a quarter of the items can only be guessed): in three pre-registered
pilots (300, 600 and 1,000 steps, 3 seeds each) GRPO lost pooled AUROC on 2 of 3 seeds at most, so `guess` is
not a test bed, and no study compared GRPO and CAPO on it (docs/results/guess-pilots/). Where GRPO does lose
calibration: capo-trl demo (its default task, guess-half) and capo-trl demo --task guess-redraw.""",
            }

# Each task's demo budget where the harness's default (200 steps at 2e-4) would not show what the task is for:
# on guess-half, 300 steps at 4e-4 (the test bed's total step size, 600 at 2e-4, the rate decaying linearly to 0)
# made GRPO lose pooled AUROC on 3 of 3 seeds in an exploratory pilot, and CAPO without the mask broke on none;
# at 200 steps and 6e-4 it broke on 1 of 3 (docs/results/demo-budget/).
DEMO_BUDGETS = {"guess-half": dict(steps=300, learning_rate=4e-4)}
DEMO_METHODS = "grpo,capo"


def demo_budget(task: str = DEMO_TASK, **fields) -> Budget:
    """The demo's budget on ``task``: 200 steps (``DEMO_BUDGETS`` may say otherwise), validation 4 times on 64
    problems x 4, test 256 x 8; ``fields`` (None: the task's default) amend it."""
    chosen = {**dict(steps=200, val_problems=64, test_problems=256, test_samples=8), **DEMO_BUDGETS.get(task, {})}
    chosen.update({k: v for k, v in fields.items() if v is not None})
    chosen.setdefault("val_every", max(1, chosen["steps"] // 4))
    return Budget(task=task, **chosen)


def evidence(budget: Budget) -> str:
    """What the committed studies say about the task the demo ran, how far its one run can speak to it, and what
    the real model's study found (another model and task: said apart)."""
    return (_tiny_evidence(budget) + "\nOn a real model, not this demo's (docs/results/smollm2-study/):\n"
            + real_words(REAL_RESULT))


def _tiny_evidence(budget: Budget) -> str:
    task = budget.task
    if task in EVIDENCE:
        return EVIDENCE[task]
    if task not in STUDY_RESULTS:
        return f"\nNo committed study compared GRPO and CAPO on {task} (docs/results/): this one run is not evidence.\n"
    text = "\nWhat the evidence on this task says (tiny models on CPU; docs/results/):\n" + study_words(task)
    piloted = DEMO_BUDGETS.get(task)
    lr = _rate(budget.learning_rate)
    if piloted and budget.model is None and all(getattr(budget, k) == v for k, v in piloted.items()):
        tail = (f"This demo's budget on {task} ({budget.steps} steps at learning rate {lr}) was chosen in an "
                "exploratory pilot (docs/results/demo-budget/)")
    else:
        tail = (f"The studies trained 600 steps at learning rate 2e-4; this run's budget ({budget.steps} steps at "
                f"{lr}{', another start model' if budget.model else ''}) was not tested for showing it")
    tail += ", and each arm above is one run of one seed: read it against the intervals above, not as evidence."
    return text + "\n" + textwrap.fill(tail, width=110, break_on_hyphens=False) + "\n"


def _rate(value: float) -> str:
    """A learning rate as the docs write it: 4e-4, not 0.0004."""
    return f"{value:g}" if value >= 1e-3 else f"{value:.0e}".replace("e-0", "e-")


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


class _AboveTheBars:
    """stdout while the bars are drawn: each line is written above them (tqdm.write), not through them."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> int:
        from tqdm import tqdm

        if text.strip():
            tqdm.write(text.rstrip("\n"), file=self.out)
        return len(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def _arm_bars(labels: list[str], steps: int, progress_dir: str, enabled: bool, every: float = 0.5):
    """One progress bar per arm (its training steps, then its test), redrawn from the arms' step files."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    width = max(len(label) for label in labels)
    bars = {label: tqdm(total=steps, desc=f"{label:<{width}} training", position=i, unit="step", leave=True,
                        dynamic_ncols=True) for i, label in enumerate(labels)}
    stop = threading.Event()

    def refresh():
        for label, bar in bars.items():
            try:
                step = int(_step_file(progress_dir, label).read_text() or 0)
            except (OSError, ValueError):
                continue
            if step > bar.n:
                bar.update(step - bar.n)
                if step >= steps:
                    bar.set_description(f"{label:<{width}} trained, testing")

    def redraw():
        while not stop.wait(every):
            refresh()

    import transformers

    loading_bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # the start model's "Loading weights" would cut through them
    watcher = threading.Thread(target=redraw, daemon=True)
    watcher.start()
    try:
        with contextlib.redirect_stdout(_AboveTheBars(sys.stdout)):
            yield
    finally:
        if loading_bars:
            transformers.utils.logging.enable_progress_bar()
        stop.set()
        watcher.join(timeout=5)
        refresh()  # the last steps, had the arms finished between two reads
        for bar in bars.values():
            bar.close()


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
    and what the committed studies found on that task (CPU, minutes).

    ``plot``: where to write the PNG (pooled AUROC over steps; the test split before and after); None: none.
    The methods and the budget are checked first (a UsageError naming ``--methods`` or the budget flag),
    so a typo fails at once, not after the first evaluation. The start model is evaluated while the arms train,
    each arm's progress drawn as a bar (``budget.progress``).
    """
    budget = budget or demo_budget()
    parsed = parse_methods(methods, flag="--methods")
    check_budget(budget)
    check_methods(parsed, budget, flag="--methods")
    with tempfile.TemporaryDirectory() as tmp:  # nothing is saved: the demo only reports
        index = {label: i for i, (label, _) in enumerate(parsed)}
        progress_dir = tmp if budget.progress else None
        study = Study(parsed, [seed], path=lambda label, _: Path(tmp) / f"{index[label]}.json",
                      run=partial(train_and_test, budget, progress_dir),
                      describe=lambda r: f"trained and tested in {r['seconds']:.0f} s",
                      rerun="The demo saves nothing: rerun it to train every arm again.")
        print(f"training {', '.join(label for label, _ in parsed)} side by side on {budget.task}, one process each "
              f"({budget.steps} steps, seed {seed}); evaluating the start model meanwhile", flush=True)
        labels = [label for label, _ in parsed]
        with _arm_bars(labels, budget.steps, tmp, budget.progress), ThreadPoolExecutor(1) as pool:
            arms = pool.submit(run_study, study, len(parsed))
            start_budget = dataclasses.replace(budget, progress=False)  # its bars would run through the arms'
            before = headline(runs.evaluate_start(start_budget).metrics, budget.test_samples)
            records = list(arms.result().values())
    print(f"\n{', '.join(r['method'] for r in records)} side by side on the embedded task {budget.task}: "
          f"{budget.steps} RL steps each at learning rate {_rate(budget.learning_rate)}, seed {seed}; test split "
          f"{budget.test_problems} problems x {budget.test_samples} samples")
    print(_table(before, records))
    print()
    print(_curves(records, budget))
    print(evidence(budget))
    if plot is not None:
        from ..evaluation.plots import demo_figure

        path = demo_figure(before, records, plot, f"{budget.task}, {budget.steps} RL steps, seed {seed}")
        print(f"\nwrote {path}")
    return {"before": before, **{r["method"]: r for r in records}}


__all__ = ["DEMO_BUDGETS", "DEMO_TASK", "STUDY_RESULTS", "demo", "demo_budget", "evidence", "train_and_test"]
