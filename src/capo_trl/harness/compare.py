"""`capo-trl compare`: methods side by side on identical data, seeds and budget, saved per run and resumable.

Every method (:mod:`~capo_trl.harness.presets`) is trained by :func:`capo_trl.harness.runs.train_method`,
validated during training by :class:`~capo_trl.evaluation.callbacks.CalibrationCallback` and evaluated on the
same test split; the start model is evaluated once. Each finished run is saved at once, so an
interrupted comparison is readable and the same command resumes it.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np

from ..evaluation import plots
from ..errors import UsageError, check_output_dir
from . import runs
from . import driver
from .driver import plan, read_json, write_json
from .presets import Budget, budget_flag, check_budget, check_methods, is_int
from .runs import HEADLINE, START, headline

# ------------------------------------------------------------------------------------ saved state
# What compare writes in its output directory: a rerun of the same command resumes from it.
STATE_FILES = ("manifest.json", "start.json", "runs", "report.md", "metrics.csv", "final.csv", "summary.json",
               "val_curves.png", "precision_coverage.png")
PLOTS = ("val_curves.png", "precision_coverage.png")


def _plain(x):
    """JSON-ready (NaN becomes null) and normalised as a saved copy reads back."""
    from ..evaluation.evaluate import _json_safe

    return json.loads(json.dumps(_json_safe(x), default=str))


def _revive(record: dict) -> dict:
    """A saved record with its nulls back to NaN, as a fresh run has them."""
    def nan(v):
        return float("nan") if v is None else v

    record["headline"] = {k: nan(v) for k, v in record["headline"].items()}
    record["history"] = [{k: nan(v) for k, v in point.items()} for point in record.get("history", [])]
    return record


def _manifest(methods, budget: Budget) -> dict:
    return _plain({"format": 1, "methods": {label: overrides for label, overrides in methods},
                   "budget": {k: v for k, v in asdict(budget).items() if k != "progress"}})


def _manifest_change(saved: dict, asked: dict) -> str | None:
    """What differs between a saved comparison and the one asked for (None: the same)."""
    if saved.get("format") != asked["format"]:
        return f"format ({saved.get('format')!r})"
    old, new = {"task": "arithmetic", **(saved.get("budget") or {})}, asked["budget"]  # before --task: arithmetic
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed:
        return "budget (" + ", ".join(f"{budget_flag(k)} {old.get(k)!r} -> {new.get(k)!r}" for k in changed) + ")"
    if saved.get("methods") != asked["methods"]:
        return (f"set of methods (saved: {', '.join(saved.get('methods') or {})}; asked: "
                f"{', '.join(asked['methods'])})")
    return None


def _open_out(out: Path, methods, budget: Budget, overwrite: bool) -> dict:
    """Refuse a directory this comparison cannot use; returns the manifest (written to ``out``)."""
    manifest = _manifest(methods, budget)
    saved_path = out / "manifest.json"
    if out.is_dir() and saved_path.is_file() and not overwrite:
        saved = read_json(saved_path)
        change = _manifest_change(saved, manifest) if isinstance(saved, dict) else "manifest (unreadable)"
        if change:
            raise UsageError(f"--out {out} holds a comparison with another {change}; rerun with the same --methods "
                             "and budget flags to resume it, choose a new --out, or pass --overwrite to start again.")
        check_output_dir(out, False, ignore=STATE_FILES)  # its own state is resumed; anything else is refused
    else:
        check_output_dir(out, overwrite)
        if overwrite and out.is_dir():  # start again: forget the saved runs (other files are left alone)
            for name in STATE_FILES:
                if name != "runs":
                    (out / name).unlink(missing_ok=True)
            for saved_run in (out / "runs").glob("*/result.json"):
                saved_run.unlink()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    write_json(saved_path, manifest)
    return manifest


def _run_dir(out: Path, label: str, seed: int) -> Path:
    return out / "runs" / (label.replace("/", "_").replace("\\", "_") + f"-seed{seed}")


def _start_record(out: Path, budget: Budget) -> dict:
    """The start model's test evaluation, saved to ``start.json`` and reused by a resumed comparison."""
    path = out / "start.json"
    record = read_json(path)
    if not isinstance(record, dict) or "headline" not in record:
        t0 = time.time()
        result = runs.evaluate_start(budget)
        record = _plain({"method": START, "headline": headline(result.metrics, budget.test_samples),
                         "precision_coverage": result.curves.get("precision_coverage"), "seconds": time.time() - t0})
        write_json(path, record)
    else:
        print(f"[{START}] reused {path}")
    return _revive(record)


def _saved_run(path: Path, label: str, overrides: dict, seed: int, manifest: dict) -> dict | None:
    record = read_json(path)
    if not isinstance(record, dict):
        return None
    same = (record.get("method"), record.get("seed"), record.get("overrides"), record.get("budget")) == (
        label, seed, manifest["methods"][label], manifest["budget"])
    return _revive(record) if same and "headline" in record else None


# ------------------------------------------------------------------------------------ compare
def compare(methods: list[tuple[str, dict]], seeds: int, out: Path, budget: Budget, first_seed: int = 0,
            overwrite: bool = False) -> dict:
    """Train every method with seeds ``first_seed ...`` (alternating), write metrics.csv, report.md and plots.

    Everything is checked before anything trains (the budget, the model path, every method's
    CAPOConfig, the output directory). Each finished run is saved at once to
    ``out/runs/<label>-seed<k>/result.json`` and the report, CSVs and summary are rewritten, so an
    interrupted comparison is readable; rerunning the same command on the same ``out`` reuses the
    saved runs (and the start-model evaluation) and trains only the missing ones. A directory that
    holds another comparison (other methods or budget) or other files is refused unless
    ``overwrite``, which starts again.
    """
    if not is_int(seeds) or seeds < 1:
        raise UsageError(f"--seeds must be an integer >= 1 (runs per method), got {seeds!r}.")
    if not is_int(first_seed) or first_seed < 0:
        raise UsageError(f"--first_seed must be an integer >= 0, got {first_seed!r}.")
    if not methods:
        raise UsageError("--methods is empty; give e.g. grpo,capo.")
    labels = [label for label, _ in methods]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--methods: a method is listed twice ({', '.join(labels)}); each runs once per seed.")
    check_budget(budget)
    check_methods(methods, budget)
    out = Path(out)
    manifest = _open_out(out, methods, budget, overwrite)

    seeds_ = list(range(first_seed, first_seed + seeds))
    start = _start_record(out, budget)
    planned, summaries = plan(methods, seeds_), []
    study = driver.Study(methods, seeds_, path=lambda label, seed: _run_dir(out, label, seed) / "result.json",
                         run=partial(_train, out, budget, manifest["budget"]),
                         reuse=partial(_saved_run, manifest=manifest), describe=_describe,
                         after=lambda finished: summaries.append(_write_outputs(out, methods, planned, budget, start,
                                                                                finished)))
    driver.run_study(study)
    return summaries[-1]


def _train(out: Path, budget: Budget, saved_budget: dict, label: str, overrides: dict, seed: int) -> dict:
    """One run of the comparison: its record (``runs/<label>-seed<k>/result.json``)."""
    t0 = time.time()
    _, history, result = runs.train_method(overrides, seed, budget, _run_dir(out, label, seed))
    return _plain({"method": label, "seed": seed, "overrides": overrides, "budget": saved_budget,
                   "seconds": time.time() - t0, "headline": headline(result.metrics, budget.test_samples),
                   "history": history, "precision_coverage": result.curves.get("precision_coverage"),
                   "metrics": result.metrics})


def _describe(record: dict) -> str:
    return f"{record['seconds']:.0f}s  " + "  ".join(f"{k}={v:.4f}" for k, v in record["headline"].items())


def _write_outputs(out: Path, methods, planned, budget: Budget, start: dict, finished: dict) -> dict:
    """metrics.csv, final.csv, summary.json and report.md from the finished runs; plots once all are done."""
    first_seed = planned[0][2]
    rows, finals, curves = [], {START: [start["headline"]]}, {START: [start["precision_coverage"]]}
    final_rows = [{"method": START, "seed": first_seed, **start["headline"]}]  # the start model: once
    missing, seconds = [], start.get("seconds") or 0.0
    for label, _, seed in planned:
        record = finished.get((label, seed))
        if record is None:
            missing.append(f"{label} seed {seed}")
            continue
        seconds += record.get("seconds") or 0.0
        for point in record["history"]:
            for name, value in point.items():
                if name != "step":
                    rows.append({"method": label, "seed": seed, "step": point["step"], "metric": name, "value": value})
        finals.setdefault(label, []).append(record["headline"])
        curves.setdefault(label, []).append(record.get("precision_coverage"))
        final_rows.append({"method": label, "seed": seed, **record["headline"]})
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "seed", "step", "metric", "value"])
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "final.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "seed", *HEADLINE])
        writer.writeheader()
        writer.writerows(final_rows)
    summary = {label: {k: _mean_std([v[k] for v in per_seed]) for k in HEADLINE} for label, per_seed in finals.items()}
    seeds = len({seed for _, _, seed in planned})
    counts = {label: len(per_seed) for label, per_seed in finals.items()}
    _write_report(out, methods, seeds, budget, summary, seconds, done=len(planned) - len(missing), missing=missing,
                  counts=counts)
    drawn = None
    if missing:  # plots of an earlier, smaller comparison would mislead
        for name in PLOTS:
            (out / name).unlink(missing_ok=True)
    else:
        drawn = plots.validation_curves(rows, out / "val_curves.png", budget.val_samples)
        plots.precision_coverage_by_method(curves, out / "precision_coverage.png")
    (out / "summary.json").write_text(json.dumps(_plain({
        "budget": asdict(budget), "summary": summary, "plotted_points": drawn, "complete": not missing,
        "runs": {"finished": len(planned) - len(missing), "planned": len(planned), "missing": missing}}), indent=2))
    return summary


def _mean_std(values) -> tuple[float, float]:
    vals = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if vals.size == 0:
        return float("nan"), float("nan")
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0


def _write_report(out, methods, seeds, budget, summary, seconds, done: int | None = None,
                  missing: tuple = (), counts: dict | None = None) -> None:
    lines = ["# capo-trl compare", ""]
    if missing:
        lines += [f"**Partial comparison: {done} of {done + len(missing)} runs finished** (missing: "
                  f"{', '.join(missing)}). Rerun the same command to train the missing runs; the plots are drawn "
                  "when every run has finished.", ""]
    lines += [
        f"Task {budget.task}; {seeds} seed{'s' * (seeds != 1)} per method; {budget.steps} RL steps of {budget.prompts_per_step} prompts x "
        f"{budget.num_generations} samples; test: {budget.test_problems} problems x {budget.test_samples} samples "
        f"(temperature 1); grader noise {budget.grader_noise}; {seconds / 60:.1f} min of training and "
        "evaluation in all.", "",
        "| method | accuracy (mean@k) | pooled AUROC | per-question AUROC | ECE |", "|---|---|---|---|---|",
    ]
    for label, stats in summary.items():
        single = (counts or {}).get(label, seeds) == 1  # one value: no spread to show
        cells = [f"{m:.3f}" if single else f"{m:.3f} ± {s:.3f}" for m, s in (stats[k] for k in HEADLINE)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    spread = "± is the standard deviation over seeds (a row without ± has one value). " if seeds > 1 else ""
    lines += ["", f"{spread}Methods and their CAPOConfig overrides:", ""]
    lines += [f"- `{label}`: `{json.dumps(overrides)}`" for label, overrides in methods]
    lines += ["", "Plots: `val_curves.png` (validation accuracy and AUROC vs step, mean and min-max over seeds), "
              "`precision_coverage.png` (test split, first seed)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def replot(out: Path, val_samples: int = 4) -> int:
    """Redraw ``val_curves.png`` from a comparison's ``metrics.csv``."""
    with open(Path(out) / "metrics.csv") as f:
        rows = [{**r, "step": int(r["step"]), "value": float(r["value"]) if r["value"] not in ("", "None") else None}
                for r in csv.DictReader(f)]
    return plots.validation_curves(rows, Path(out) / "val_curves.png", val_samples)


__all__ = ["STATE_FILES", "compare", "replot"]
