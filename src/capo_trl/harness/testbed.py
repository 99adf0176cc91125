"""The pre-registered comparison on a test bed task: several methods x seeds, paired by seed.

``run`` trains every (method, seed) from the task's start model, seed-major (every method of seed 0,
then of seed 1, ...), ``--workers`` processes at a time (the harness's one driver,
:mod:`capo_trl.harness.driver`; ``0`` runs here), and writes ``<method>/seed<k>.json`` under
``--out`` (test-split endpoints, per item kind, abstention coverage, what the noise mask dropped in
training, validation history). A finished run is reused when the command is rerun. ``report``
renders ``compare.md`` and ``summary.json`` from those files alone: per-arm means, each arm's paired
difference from the reference arm with a 95% t interval over complete seeds, the pilot criterion
(:mod:`capo_trl.harness.pilot`) on the reference arm, and the mask's tally.

    python -m capo_trl.harness.testbed run --task guess-half --methods grpo,grpo-mask,capo-mask,capo-paper,capo-nomask \\
      --seeds 0 1 2 3 4 5 --steps 600 --workers 2 --out runs/testbed/compare
    python -m capo_trl.harness.testbed report --out runs/testbed/compare
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np

from . import driver
from .paired import paired_interval
from .pilot import record, verdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET_PRECISION, CONFIDENCE = 0.8, 0.95  # abstention: pre-registered in protocol-4.md
SECONDARY = ("accuracy", "e_aurc", "ece", "auroc_question", "coverage@0.8", "guessable/modal_share",
             "guessable/mean_score", "derivable/mean_score", "mean_tokens")


def abstention(samples: list[dict], n: int) -> dict:
    """Threshold on ``s`` fitted on the first half of the test problems, coverage/precision on the second half."""
    from ..evaluation.selective import select_threshold, selective_report

    half = len(samples) // n // 2 * n
    groups = [i // n for i in range(len(samples))]
    s = np.array([x["score"] for x in samples], dtype=float)
    y = np.array([bool(x["grade"]) for x in samples], dtype=float)
    chosen = select_threshold(s[:half], y[:half], TARGET_PRECISION, CONFIDENCE, groups=groups[:half])
    held = selective_report(chosen.threshold, s[half:], y[half:], CONFIDENCE, groups=groups[half:])
    return {f"coverage@{TARGET_PRECISION}": held["coverage"], f"precision@{TARGET_PRECISION}": held["precision"],
            "abstention_threshold": chosen.threshold}


def evaluation_record(result, task, budget) -> dict:
    """What a run keeps of its test evaluation: the pilot's record plus abstention coverage."""
    problems = task.dataset("test", budget.test_problems)
    return {**record(result, problems, budget.test_samples), **abstention(result.samples, budget.test_samples)}


def tally_mask(trainer, counts: Counter) -> None:
    """Count, per training completion, item kind x correct/wrong x kept/dropped/unmasked by the noise mask."""
    inner = trainer._generate_and_score_completions
    threshold = trainer.args.correct_threshold

    def counted(inputs):
        out = inner(inputs)
        rec = trainer._record
        if trainer.model.training and rec.rewards is not None:
            keep = rec.keep.tolist() if rec.keep is not None else [None] * len(inputs)
            for row, reward, kept in zip(inputs, rec.rewards.tolist(), keep):
                kind = "guessable" if row["guessable"] else "derivable"
                verdict_ = "unmasked" if kept is None else "kept" if kept else "dropped"
                counts[f"{kind}/{'correct' if reward >= threshold else 'wrong'}/{verdict_}"] += 1
        return out

    trainer._generate_and_score_completions = counted


def train_record(task_name: str, steps: int, val_every: int, test_problems: int, out: str, label: str,
                 overrides: dict, seed: int) -> dict:
    """One run of the comparison (in its worker process): its record, ``<out>/<label>/seed<k>.json``."""
    import torch

    from . import runs
    from ..data.tasks import get_task
    from .presets import Budget

    torch.set_num_threads(1)
    task = get_task(task_name)
    budget = Budget(task=task_name, steps=steps, val_every=val_every, test_problems=test_problems,
                    model=task.model_path(), progress=False)  # the task: its training reward too
    counts: Counter = Counter()
    t0 = time.time()
    _, history, result = runs.train_method(overrides, seed, budget, Path(out) / label / f"run-seed{seed}", task.dataset,
                                           on_trainer=lambda trainer: tally_mask(trainer, counts))
    return {**evaluation_record(result, task, budget), "method": label, "seed": seed,
            "mask": dict(sorted(counts.items())), "seconds": time.time() - t0, "history": history}


def _describe(record: dict) -> str:
    return (f"{time.strftime('%H:%M:%S')} {record['seconds']:.0f} s, auroc {record['auroc']:.3f}, "
            f"accuracy {record['accuracy']:.3f}")


def run_all(args, methods: list) -> None:
    """Every method x seed of ``run``, seed-major, ``--workers`` processes at a time (the harness's one driver)."""
    out = Path(args.out)
    study = driver.Study(methods, args.seeds, path=lambda label, seed: out / label / f"seed{seed}.json",
                  run=partial(train_record, args.task, args.steps, args.val_every, args.test_problems, str(out)),
                  after=lambda finished: report(out), describe=_describe)
    driver.run_study(study, workers=args.workers)


def run_start(task_name: str, test_problems: int, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import runs
    from ..data.tasks import get_task
    from .presets import Budget

    path = Path(out) / "start.json"
    if path.is_file():
        return
    task = get_task(task_name)
    budget = Budget(test_problems=test_problems, model=task.model_path(), progress=False)
    model, tok = AutoModelForCausalLM.from_pretrained(budget.model), AutoTokenizer.from_pretrained(budget.model)
    result = runs.evaluate_test(model, tok, budget, seed=0, dataset=task.dataset)
    path.write_text(json.dumps(evaluation_record(result, task, budget), indent=2) + "\n")


def summarise(out: Path) -> dict:
    """Everything the report says, from the files under ``out`` only."""
    config = json.loads((out / "config.json").read_text())
    methods, seeds, ref = config["methods"], config["seeds"], config["methods"][0]
    start = json.loads((out / "start.json").read_text())
    runs_ = {m: {s: json.loads((out / m / f"seed{s}.json").read_text()) for s in seeds
                 if (out / m / f"seed{s}.json").is_file()} for m in methods}
    complete = [s for s in seeds if all(s in runs_[m] for m in methods)]
    keys = ("auroc", *SECONDARY)
    arms = {m: {k: float(np.mean([runs_[m][s][k] for s in complete])) if complete else math.nan for k in keys}
            for m in methods}
    paired = {}
    for m in methods[1:]:
        paired[m] = {}
        for k in ("auroc", "accuracy", "e_aurc", "ece", "auroc_question", "coverage@0.8"):
            diffs = [runs_[m][s][k] - runs_[ref][s][k] for s in complete]
            mean, low, high = paired_interval(diffs)
            paired[m][k] = {"mean": mean, "low": low, "high": high, "per_seed": diffs}
    pilot = verdict(start, {s: runs_[ref][s] for s in config["pilot_seeds"] if s in runs_[ref]})
    everyone = verdict(start, {s: runs_[ref][s] for s in complete})
    mask = {m: dict(sum((Counter(runs_[m][s]["mask"]) for s in complete), Counter())) for m in methods}
    return {"config": config, "complete_seeds": complete, "start": {k: start[k] for k in keys if k in start},
            "arms": arms, "paired_vs_" + ref: paired, "pilot": pilot, "reference_all_seeds": everyone, "mask": mask,
            "per_seed": {m: {s: {k: runs_[m][s][k] for k in keys} for s in runs_[m]} for m in methods}}


def render(summary: dict) -> str:
    """compare.md: the tables, from the summary only."""
    config, ref = summary["config"], summary["config"]["methods"][0]
    keys = ("auroc", *SECONDARY)
    lines = [f"Task `{config['task']}`, {config['steps']} steps, test split {config['test_problems']} problems x 8; "
             f"complete seeds: {', '.join(map(str, summary['complete_seeds'])) or 'none'}.", "",
             "| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|",
             "| start | " + " | ".join(f"{summary['start'].get(k, math.nan):.3f}" for k in keys) + " |"]
    for m, values in summary["arms"].items():
        lines.append(f"| {m} | " + " | ".join(f"{values[k]:.3f}" for k in keys) + " |")
    lines += ["", f"Paired difference from `{ref}` (same seed), mean [95% t interval]:", "",
              "| method | " + " | ".join(next(iter(summary[f"paired_vs_{ref}"].values()), {})) + " |"]
    paired = summary[f"paired_vs_{ref}"]
    if paired:
        lines.append("|---" * (len(next(iter(paired.values()))) + 1) + "|")
        for m, ds in paired.items():
            lines.append(f"| {m} | " + " | ".join(f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                                                  for d in ds.values()) + " |")
    lines += ["", "Per seed, pooled AUROC:", "", "| method | " + " | ".join(f"seed {s}" for s in config["seeds"]) + " |",
              "|---" * (len(config["seeds"]) + 1) + "|"]
    for m, per in summary["per_seed"].items():
        lines.append(f"| {m} | " + " | ".join(f"{per[s]['auroc']:.3f}" if s in per else "-" for s in config["seeds"])
                     + " |")
    pilot = summary["pilot"]
    finished = len(pilot["per_seed"]) == len(config["pilot_seeds"])
    said = ("yes" if pilot["test_bed"] else "no") if finished else "pending"
    lines += ["", f"Pilot criterion on `{ref}` seeds {', '.join(map(str, config['pilot_seeds']))}: test bed "
              f"**{said}** (required met on "
              f"{sum(v['required_met'] for v in pilot['per_seed'].values())} of {len(pilot['per_seed'])}); on all "
              f"complete seeds: {sum(v['required_met'] for v in summary['reference_all_seeds']['per_seed'].values())} of "
              f"{len(summary['reference_all_seeds']['per_seed'])}.", "",
              "Noise mask in training (completions, all complete seeds): correct = reward >= 0.5.", "",
              "| method | lucky guesses dropped | of correct guessable | derived answers dropped | of correct derivable "
              "| wrong dropped | of wrong | before thresholds |", "|---|---|---|---|---|---|---|---|"]
    for m, c in summary["mask"].items():
        if not any(k.endswith(("/kept", "/dropped")) for k in c):
            continue  # an arm without the mask
        def n(*parts):
            return sum(v for k, v in c.items() if all(p in k.split("/") for p in parts))
        lines.append(f"| {m} | {n('guessable', 'correct', 'dropped')} | {n('guessable', 'correct')} | "
                     f"{n('derivable', 'correct', 'dropped')} | {n('derivable', 'correct')} | {n('wrong', 'dropped')} | "
                     f"{n('wrong')} | {n('unmasked')} |")
    return "\n".join(lines) + "\n"


def report(out: Path) -> dict:
    summary = summarise(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "compare.md").write_text(render(summary))
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", allow_abbrev=False)
    p.add_argument("--task", required=True)
    p.add_argument("--methods", required=True, help="comma-separated presets; the first is the reference arm")
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--pilot_seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--val_every", type=int, default=100)
    p.add_argument("--test_problems", type=int, default=512)
    p.add_argument("--workers", type=int, default=1, help="runs at a time, each in its own process (0: here)")
    p.add_argument("--out", required=True)
    r = sub.add_parser("report", allow_abbrev=False)
    r.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run" and args.workers < 0:
        parser.error(f"--workers must be >= 0 (0 runs here), got {args.workers}.")
    out = Path(args.out)
    if args.command == "report":
        print((report(out) and (out / "compare.md").read_text()))
        return

    from ..data.tasks import get_task
    from .presets import Budget, check_methods, parse_methods

    task = get_task(args.task)
    methods = parse_methods(args.methods)
    check_methods(methods, Budget(steps=args.steps, model=task.model_path()))
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("command", "workers", "out")}
    config["methods"] = [label for label, _ in methods]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    run_start(args.task, args.test_problems, str(out))
    run_all(args, methods)


if __name__ == "__main__":  # through the module's own name, so worker processes can import train_record
    from capo_trl.harness.testbed import main as _main

    _main()
