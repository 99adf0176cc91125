"""Methods side by side on the embedded default: the `demo`, `compare` and `calibrate-mask` commands.

Every method is a named preset of `CAPOConfig` overrides (optionally amended on the command line,
``capo:tau=0.3:noise_mask=false``) trained on identical data, seeds and budget, validated during
training by :class:`~capo_trl.callbacks.CalibrationCallback` and evaluated on the same test split.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from .advantages import quartile_thresholds, within_group_std
from .calibration import auroc
from .data import arithmetic_dataset, embedded_model_path, with_grader_noise
from .errors import UsageError, check_model_path, check_output_dir

# The paper's CAPO, exactly (tau in nats, 1/tau scale, fixed mask thresholds).
PAPER = dict(advantage_estimator="capo", tau=0.6, tau_mode="absolute", advantage_scale="paper",
             noise_mask=True, ref_thresholds="fixed", ref_high=2.5, ref_low=1.05)
PRESETS: dict[str, dict] = {
    "grpo": dict(advantage_estimator="grpo"),
    "capo": dict(advantage_estimator="capo", tau=1.0, tau_mode="relative", advantage_scale="bounded",
                 noise_mask=False),
    "capo-mask": dict(advantage_estimator="capo", tau=1.0, tau_mode="relative", advantage_scale="bounded",
                      noise_mask=True, ref_thresholds="auto"),
    "capo-paper": PAPER,
    "grpo-mask": dict(advantage_estimator="grpo", noise_mask=True, ref_thresholds="auto"),
    # The methods CAPO is compared with (docs/baselines.md); compare() already sets beta=0.
    "gspo": dict(advantage_estimator="grpo", importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4,
                 epsilon_high=4e-4),
    "dr_grpo": dict(advantage_estimator="dr_grpo", loss_type="dr_grpo"),
    "codapo": dict(advantage_estimator="codapo", codapo_replay=True),
    "cde": dict(advantage_estimator="cde"),
    "c2gspg": dict(advantage_estimator="c2gspg"),
    "simko": dict(advantage_estimator="simko"),
    "rlcr": dict(advantage_estimator="rlcr"),
    "dcpo": dict(advantage_estimator="dcpo"),
}


@dataclass
class Budget:
    """Everything but the method: identical for every run of a comparison."""

    steps: int = 200
    prompts_per_step: int = 8
    num_generations: int = 8
    learning_rate: float = 2e-4
    warmup_steps: int = 20
    max_completion_length: int = 48
    train_problems: int = 4000
    val_every: int = 25
    val_problems: int = 64
    val_samples: int = 4
    test_problems: int = 256
    test_samples: int = 8
    grader_noise: float = 0.0
    model: str | None = None
    progress: bool = True


# ------------------------------------------------------------------------------------ validation
# Budget fields the command line sets, and how its flags spell them (the others: Budget.<field>).
BUDGET_FLAGS = {"steps": "--steps", "test_problems": "--test-problems", "test_samples": "--test-samples",
                "grader_noise": "--grader-noise", "model": "--model", "val_every": "--val-every",
                "val_problems": "--val-problems", "val_samples": "--val-samples", "learning_rate": "--learning-rate"}
# CAPOConfig fields the harness sets for every run: a method may not amend them.
HARNESS_FIELDS = {"output_dir": "--out", "seed": "--first-seed and --seeds", "max_steps": "--steps",
                  "num_generations": "Budget.num_generations",
                  "per_device_train_batch_size": "Budget.prompts_per_step x Budget.num_generations",
                  "max_completion_length": "Budget.max_completion_length"}


def _flag(name: str) -> str:
    return BUDGET_FLAGS.get(name, f"Budget.{name}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_budget(budget: Budget) -> None:
    """Refuse a budget that cannot train or evaluate, naming the flag (cheap: before any model loads)."""
    what = {"steps": "RL steps per run", "test_problems": "test-split problems", "test_samples": "samples per test "
            "problem", "val_every": "steps between validations", "val_problems": "validation problems",
            "val_samples": "samples per validation problem"}
    for name in ("steps", "prompts_per_step", "num_generations", "max_completion_length", "train_problems",
                 "val_every", "val_problems", "val_samples", "test_problems", "test_samples"):
        value = getattr(budget, name)
        if not _is_int(value) or value < 1:
            hint = f" ({what[name]})" if name in what else ""
            raise UsageError(f"{_flag(name)} must be an integer >= 1{hint}, got {value!r}.")
    if not _is_int(budget.warmup_steps) or budget.warmup_steps < 0:
        raise UsageError(f"Budget.warmup_steps must be an integer >= 0, got {budget.warmup_steps!r}.")
    if not _is_number(budget.learning_rate) or budget.learning_rate <= 0:
        raise UsageError(f"--learning-rate must be a number > 0, got {budget.learning_rate!r}.")
    if not _is_number(budget.grader_noise) or not 0 <= budget.grader_noise <= 1:
        raise UsageError(f"--grader-noise is the fraction of rewards flipped: a number in [0, 1], got "
                         f"{budget.grader_noise!r}.")
    if budget.model is not None:
        check_model_path(budget.model, "--model")


def parse_methods(text: str, flag: str = "--methods") -> list[tuple[str, dict]]:
    """``"grpo,capo:tau=0.3:noise_mask=false"`` -> [(label, CAPOConfig overrides), ...].

    Only the syntax and the preset names are checked here; :func:`check_methods` checks the fields.
    """
    methods = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        preset, *amendments = (part.strip() for part in item.split(":"))
        if preset not in PRESETS:
            close = difflib.get_close_matches(preset, PRESETS, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"{flag}: unknown method {preset!r}; {guess}presets are {', '.join(sorted(PRESETS))} "
                             "(amend one with preset:field=value, e.g. capo:tau=0.3).")
        overrides = dict(PRESETS[preset])
        for amendment in amendments:
            key, sep, value = (part.strip() for part in amendment.partition("="))
            if not sep or not key:
                raise UsageError(f"{flag}: expected field=value after ':' in {item!r}, got {amendment!r}.")
            try:
                overrides[key] = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise UsageError(f"{flag}: in {item!r}, the value of {key!r} ({value!r}) cannot be read "
                                 f"({type(err).__name__}); write numbers as 0.3, booleans as true/false.") from err
        if any(label == item for label, _ in methods):
            raise UsageError(f"{flag}: {item!r} is listed twice; each method runs once per seed.")
        methods.append((item, overrides))
    if not methods:
        raise UsageError(f"{flag} is empty; give e.g. grpo,capo.")
    return methods


def method_config(overrides: dict, seed: int, budget: Budget, out_dir, label: str | None = None,
                  flag: str = "--methods"):
    """The CAPOConfig of one run: the budget's settings plus the method's overrides.

    Used by :func:`train_method` and, before anything trains, by :func:`check_methods`: a bad field
    or value is a UsageError naming the method and the field (with a did-you-mean for typos).
    """
    import dataclasses

    from .config import CAPOConfig

    where = f"{flag}: method {label!r}" if label else f"{flag}: method"
    known = sorted(f.name for f in dataclasses.fields(CAPOConfig) if f.init)
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            guess = f"did you mean {close[0]!r}?" if close else "see docs/config.md for the fields."
            raise UsageError(f"{where}: unknown CAPOConfig field {key!r}; {guess}")
        if key in HARNESS_FIELDS:
            raise UsageError(f"{where}: {key!r} is set by the harness for every run (from {HARNESS_FIELDS[key]}); "
                             f"remove :{key}=... from the method.")
    settings = dict(
        output_dir=str(out_dir), seed=seed, max_steps=budget.steps, learning_rate=budget.learning_rate,
        warmup_steps=budget.warmup_steps, per_device_train_batch_size=budget.prompts_per_step * budget.num_generations,
        num_generations=budget.num_generations, max_completion_length=budget.max_completion_length,
        temperature=1.0, beta=0.0, bf16=False, use_cpu=not torch.cuda.is_available(),
        report_to="none", save_strategy="no", logging_steps=max(1, budget.val_every // 5),
        disable_tqdm=not budget.progress,
    )
    # transformers 5 renamed gradient_checkpointing (the old name warns): off, under whichever name exists
    settings["activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"] = False
    settings.update(overrides)
    try:
        return CAPOConfig(**settings)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: {err}") from err


def check_methods(methods: list[tuple[str, dict]], budget: Budget, flag: str = "--methods") -> None:
    """Build every method's CAPOConfig (cheap, nothing is written): a bad one fails before any training."""
    for label, overrides in methods:
        method_config(overrides, 0, budget, Path(tempfile.gettempdir()) / "capo-trl-check", label=label, flag=flag)


# ------------------------------------------------------------------------------------ one run
def _reward(budget: Budget):
    from .rewards import math_accuracy_reward

    return with_grader_noise(math_accuracy_reward, budget.grader_noise) if budget.grader_noise else math_accuracy_reward


def _evaluate_test(model, tokenizer, budget: Budget, seed: int):
    from .evaluation import evaluate

    problems = arithmetic_dataset("test", budget.test_problems)
    return evaluate(model, tokenizer, problems, n=budget.test_samples, max_new_tokens=budget.max_completion_length,
                    temperature=1.0, seed=seed, progress=budget.progress)


def _evaluate_start(budget: Budget):
    """The start model (no RL) on the test split, loaded as training loads it (fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = budget.model or embedded_model_path()
    return _evaluate_test(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), budget,
                          seed=0)


def train_method(overrides: dict, seed: int, budget: Budget, out_dir: Path):
    """Train one method with one seed; returns (trainer, validation history, test EvalResult)."""
    from transformers import AutoTokenizer

    from .callbacks import CalibrationCallback
    from .trainer import CAPOTrainer

    model = budget.model or embedded_model_path()
    args = method_config(overrides, seed, budget, out_dir)
    train = arithmetic_dataset("train", budget.train_problems, seed=seed)
    trainer = CAPOTrainer(model=model, reward_funcs=_reward(budget), args=args, train_dataset=train)
    monitor = CalibrationCallback(arithmetic_dataset("validation", budget.val_problems), every_n_steps=budget.val_every,
                                  n=budget.val_samples, seed=seed)
    trainer.add_callback(monitor.bind(trainer))
    trainer.train()
    tokenizer = AutoTokenizer.from_pretrained(model)
    return trainer, monitor.history, _evaluate_test(trainer.model, tokenizer, budget, seed)


HEADLINE = ("accuracy", "auroc", "auroc_question", "ece")
START = "start (no RL)"


def _headline(metrics: dict, n: int) -> dict:
    return {"accuracy": metrics.get(f"mean@{n}"), "auroc": metrics.get("auroc"),
            "auroc_question": metrics.get("auroc_question"), "ece": metrics.get("ece")}


# ------------------------------------------------------------------------------------ saved state
# What compare writes in its output directory: a rerun of the same command resumes from it.
STATE_FILES = ("manifest.json", "start.json", "runs", "report.md", "metrics.csv", "final.csv", "summary.json",
               "val_curves.png", "precision_coverage.png")
PLOTS = ("val_curves.png", "precision_coverage.png")


def _plain(x):
    """JSON-ready (NaN becomes null) and normalised as a saved copy reads back."""
    from .evaluation import _json_safe

    return json.loads(json.dumps(_json_safe(x), default=str))


def _revive(record: dict) -> dict:
    """A saved record with its nulls back to NaN, as a fresh run has them."""
    def nan(v):
        return float("nan") if v is None else v

    record["headline"] = {k: nan(v) for k, v in record["headline"].items()}
    record["history"] = [{k: nan(v) for k, v in point.items()} for point in record.get("history", [])]
    return record


def _write_json(path: Path, data) -> None:
    """Written whole or not at all: an interrupted run never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _manifest(methods, budget: Budget) -> dict:
    return _plain({"format": 1, "methods": {label: overrides for label, overrides in methods},
                   "budget": {k: v for k, v in asdict(budget).items() if k != "progress"}})


def _manifest_change(saved: dict, asked: dict) -> str | None:
    """What differs between a saved comparison and the one asked for (None: the same)."""
    if saved.get("format") != asked["format"]:
        return f"format ({saved.get('format')!r})"
    old, new = saved.get("budget") or {}, asked["budget"]
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed:
        return "budget (" + ", ".join(f"{_flag(k)} {old.get(k)!r} -> {new.get(k)!r}" for k in changed) + ")"
    if saved.get("methods") != asked["methods"]:
        return (f"set of methods (saved: {', '.join(saved.get('methods') or {})}; asked: "
                f"{', '.join(asked['methods'])})")
    return None


def _open_out(out: Path, methods, budget: Budget, overwrite: bool) -> dict:
    """Refuse a directory this comparison cannot use; returns the manifest (written to ``out``)."""
    manifest = _manifest(methods, budget)
    saved_path = out / "manifest.json"
    if out.is_dir() and saved_path.is_file() and not overwrite:
        saved = _read_json(saved_path)
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
    _write_json(saved_path, manifest)
    return manifest


def _run_dir(out: Path, label: str, seed: int) -> Path:
    return out / "runs" / (label.replace("/", "_").replace("\\", "_") + f"-seed{seed}")


def _start_record(out: Path, budget: Budget) -> dict:
    """The start model's test evaluation, saved to ``start.json`` and reused by a resumed comparison."""
    path = out / "start.json"
    record = _read_json(path)
    if not isinstance(record, dict) or "headline" not in record:
        t0 = time.time()
        result = _evaluate_start(budget)
        record = _plain({"method": START, "headline": _headline(result.metrics, budget.test_samples),
                         "precision_coverage": result.curves.get("precision_coverage"), "seconds": time.time() - t0})
        _write_json(path, record)
    else:
        print(f"[{START}] reused {path}")
    return _revive(record)


def _saved_run(path: Path, label: str, overrides: dict, seed: int, manifest: dict) -> dict | None:
    record = _read_json(path)
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
    if not _is_int(seeds) or seeds < 1:
        raise UsageError(f"--seeds must be an integer >= 1 (runs per method), got {seeds!r}.")
    if not _is_int(first_seed) or first_seed < 0:
        raise UsageError(f"--first-seed must be an integer >= 0, got {first_seed!r}.")
    if not methods:
        raise UsageError("--methods is empty; give e.g. grpo,capo.")
    labels = [label for label, _ in methods]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--methods: a method is listed twice ({', '.join(labels)}); each runs once per seed.")
    check_budget(budget)
    check_methods(methods, budget)
    out = Path(out)
    manifest = _open_out(out, methods, budget, overwrite)

    plan = [(label, overrides, seed) for seed in range(first_seed, first_seed + seeds) for label, overrides in methods]
    start = _start_record(out, budget)
    runs = {}
    for label, overrides, seed in plan:
        path = _run_dir(out, label, seed) / "result.json"
        record = _saved_run(path, label, overrides, seed, manifest)
        if record is not None:
            runs[(label, seed)] = record
            print(f"[{label} seed {seed}] reused {path}")
    summary = _write_outputs(out, methods, plan, budget, start, runs)
    for label, overrides, seed in plan:
        if (label, seed) in runs:
            continue
        t0 = time.time()
        run_dir = _run_dir(out, label, seed)
        _, history, result = train_method(overrides, seed, budget, run_dir)
        record = _plain({"method": label, "seed": seed, "overrides": overrides, "budget": manifest["budget"],
                         "seconds": time.time() - t0, "headline": _headline(result.metrics, budget.test_samples),
                         "history": history, "precision_coverage": result.curves.get("precision_coverage"),
                         "metrics": result.metrics})
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "result.json", record)
        runs[(label, seed)] = _revive(record)
        print(f"[{label} seed {seed}] {record['seconds']:.0f}s  "
              + "  ".join(f"{k}={v:.4f}" for k, v in runs[(label, seed)]["headline"].items()))
        summary = _write_outputs(out, methods, plan, budget, start, runs)
    return summary


def _write_outputs(out: Path, methods, plan, budget: Budget, start: dict, runs: dict) -> dict:
    """metrics.csv, final.csv, summary.json and report.md from the finished runs; plots once all are done."""
    first_seed = plan[0][2]
    rows, finals, curves = [], {START: [start["headline"]]}, {START: [start["precision_coverage"]]}
    final_rows = [{"method": START, "seed": first_seed, **start["headline"]}]  # the start model: once
    missing, seconds = [], start.get("seconds") or 0.0
    for label, _, seed in plan:
        record = runs.get((label, seed))
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
    seeds = len({seed for _, _, seed in plan})
    _write_report(out, methods, seeds, budget, summary, seconds, done=len(plan) - len(missing), missing=missing)
    drawn = None
    if missing:  # plots of an earlier, smaller comparison would mislead
        for name in PLOTS:
            (out / name).unlink(missing_ok=True)
    else:
        drawn = _plot_curves(out, rows, budget)
        _plot_precision_coverage(out, curves)
    (out / "summary.json").write_text(json.dumps(_plain({
        "budget": asdict(budget), "summary": summary, "plotted_points": drawn, "complete": not missing,
        "runs": {"finished": len(plan) - len(missing), "planned": len(plan), "missing": missing}}), indent=2))
    return summary


def _mean_std(values) -> tuple[float, float]:
    vals = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if vals.size == 0:
        return float("nan"), float("nan")
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0


def _write_report(out, methods, seeds, budget, summary, seconds, done: int | None = None,
                  missing: tuple = ()) -> None:
    lines = ["# capo-trl compare", ""]
    if missing:
        lines += [f"**Partial comparison: {done} of {done + len(missing)} runs finished** (missing: "
                  f"{', '.join(missing)}). Rerun the same command to train the missing runs; the plots are drawn "
                  "when every run has finished.", ""]
    lines += [
        f"{seeds} seed(s) per method; {budget.steps} RL steps of {budget.prompts_per_step} prompts x "
        f"{budget.num_generations} samples; test: {budget.test_problems} problems x {budget.test_samples} samples "
        f"(temperature 1); grader noise {budget.grader_noise}; {seconds / 60:.1f} min of training and "
        "evaluation in all.", "",
        "| method | accuracy (mean@k) | pooled AUROC | per-question AUROC | ECE |", "|---|---|---|---|---|",
    ]
    for label, stats in summary.items():
        cells = [f"{m:.3f} ± {s:.3f}" for m, s in (stats[k] for k in HEADLINE)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "± is the standard deviation over seeds. Methods and their CAPOConfig overrides:", ""]
    lines += [f"- `{label}`: `{json.dumps(overrides)}`" for label, overrides in methods]
    lines += ["", "Plots: `val_curves.png` (validation accuracy and AUROC vs step, mean and min-max over seeds), "
              "`precision_coverage.png` (test split, first seed)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _plot_curves(out: Path, rows: list[dict], budget: Budget) -> int:
    """Validation metrics vs step, mean and min-max over seeds; returns how many points were drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"val/mean@{budget.val_samples}", "accuracy"), ("val/auroc", "pooled AUROC"),
              ("val/auroc_question", "per-question AUROC")]
    drawn = 0
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (metric, title) in zip(axes, panels):
        for method in dict.fromkeys(r["method"] for r in rows):
            pts = [r for r in rows if r["method"] == method and r["metric"] == metric and r["value"] is not None]
            steps = sorted({r["step"] for r in pts})
            by_step = [[r["value"] for r in pts if r["step"] == s] for s in steps]
            mean = [np.nanmean(v) for v in by_step]
            drawn += len(steps)
            ax.plot(steps, mean, marker="o", label=method)
            ax.fill_between(steps, [np.nanmin(v) for v in by_step], [np.nanmax(v) for v in by_step], alpha=0.2)
        ax.set_title(f"validation {title}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "val_curves.png", dpi=120)
    plt.close(fig)
    return drawn


def replot(out: Path, val_samples: int = 4) -> int:
    """Redraw ``val_curves.png`` from a comparison's ``metrics.csv``."""
    with open(Path(out) / "metrics.csv") as f:
        rows = [{**r, "step": int(r["step"]), "value": float(r["value"]) if r["value"] not in ("", "None") else None}
                for r in csv.DictReader(f)]
    return _plot_curves(Path(out), rows, Budget(val_samples=val_samples))


def _plot_precision_coverage(out: Path, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for method, per_seed in curves.items():
        curve = per_seed[0]
        if curve:
            ax.plot(curve["coverage"], curve["precision"], label=method)
    ax.set_xlabel("coverage")
    ax.set_ylabel("precision")
    ax.set_title("precision-coverage (test)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "precision_coverage.png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------ demo
def demo(budget: Budget | None = None, method: str = "capo") -> dict:
    """Before/after accuracy and calibration of one method on the embedded default (CPU, minutes).

    The method and the budget are checked first (a UsageError naming ``--method`` or the budget
    flag), so a typo fails at once, not after the first evaluation.
    """
    budget = budget or Budget(steps=200, val_every=100, val_problems=32, test_problems=256, test_samples=8)
    methods = parse_methods(method, flag="--method")
    if len(methods) != 1:
        raise UsageError(f"--method takes one method, got {len(methods)} ({method!r}); to train several side by "
                         "side, use the compare command.")
    check_budget(budget)
    check_methods(methods, budget, flag="--method")
    (label, overrides), = methods
    before = _evaluate_start(budget)
    with tempfile.TemporaryDirectory() as tmp:  # nothing is saved: the demo only reports
        _, _, after = train_method(overrides, 0, budget, Path(tmp))
    report = {"before": _headline(before.metrics, budget.test_samples),
              "after": _headline(after.metrics, budget.test_samples)}
    print(f"\n{label} on the embedded arithmetic task: {budget.steps} RL steps; test split "
          f"{budget.test_problems} problems x {budget.test_samples} samples")
    print(f"{'':>8} " + " ".join(f"{k:>15}" for k in HEADLINE))
    for when, values in report.items():
        print(f"{when:>8} " + " ".join(f"{values[k]:>15.4f}" for k in HEADLINE))
    return report


# ------------------------------------------------------------------------------------ calibrate-mask
def calibrate_mask(model, tokenizer, problems, n: int = 8, max_new_tokens: int = 1024,
                   correct_threshold: float = 0.5, **evaluate_kwargs) -> dict:
    """Measure CAPO's settings for a reference model on its own samples of training prompts.

    The reference samples at temperature 1, so ``exp(-s)`` of each sample *is* its reference
    perplexity: ``ref_high`` / ``ref_low`` follow the paper's quartile rule; ``tau`` is the pooled
    within-group spread of ``s`` (the natural unit of the surrogate); the reference's own AUROC
    says whether it is calibrated enough for the mask to mean anything.
    """
    from .evaluation import evaluate

    result = evaluate(model, tokenizer, problems, n=n, max_new_tokens=max_new_tokens, temperature=1.0,
                      **evaluate_kwargs)
    samples = sorted(result.samples, key=lambda r: (str(r["id"]), r["draw"]))
    grades = torch.tensor([np.nan if r["grade"] is None else r["grade"] for r in samples], dtype=torch.float32)
    scores = torch.tensor([r["score"] for r in samples], dtype=torch.float32)
    ppl = torch.exp(-scores)
    ref_high, ref_low = quartile_thresholds(grades, ppl, correct_threshold)
    spread = within_group_std(grades, scores, n).item()
    correct = (grades >= correct_threshold).numpy()
    groups = grades.reshape(-1, n)
    mixed = int(((groups >= correct_threshold).any(1) & (groups < correct_threshold).any(1)).sum())
    return {
        "ref_high": ref_high, "ref_low": ref_low, "tau": spread, "score_spread": spread,
        "reference_auroc": auroc(scores.numpy(), correct), "reference_accuracy": float(np.nanmean(grades.numpy())),
        "ppl_correct_quartiles": _quartiles(ppl[grades >= correct_threshold]),
        "ppl_wrong_quartiles": _quartiles(ppl[grades < correct_threshold]),
        "n_problems": len(problems), "n_samples": len(samples), "mixed_groups": mixed,
    }


def unmeasured(report: dict) -> list[str]:
    """Why :func:`calibrate_mask`'s ``tau``, ``ref_high`` or ``ref_low`` cannot be used (empty: all can).

    A value that is NaN (a class absent from the sample, no mixed group) or zero spread must never
    reach a config: CAPOConfig refuses it, or worse, it silently disables the mask.
    """
    reasons = []
    accuracy = report.get("reference_accuracy")
    acc = f" (reference accuracy {accuracy:.3f})" if _is_number(accuracy) else ""
    if not _is_number(report.get("ref_high")):
        reasons.append(f"ref_high not measured: no correct answers in the sample{acc}; raise --limit or --n, or check "
                       "that the --benchmark answers are graded right.")
    if not _is_number(report.get("ref_low")):
        reasons.append(f"ref_low not measured: no wrong answers in the sample{acc}; raise --limit or --n, or use "
                       "harder prompts.")
    tau = report.get("tau")
    if not _is_number(tau):
        reasons.append(f"tau not measured: no group has both right and wrong answers ({report.get('mixed_groups', 0)} "
                       f"of {report.get('n_problems', '?')} prompts); raise --limit or --n.")
    elif tau <= 0:
        reasons.append("tau not measured: the scores do not vary within groups (spread 0); raise --limit or --n, or "
                       "check that the model samples (temperature 1).")
    return reasons


def read_recipe(path, flag: str = "--write-config") -> str:
    """The text of a YAML recipe that :func:`update_recipe` can edit ('' for a new file); else a UsageError."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a YAML file.")
    if not path.exists():
        if not path.parent.is_dir():
            raise UsageError(f"{flag} {path}: the directory {path.parent} does not exist; create it or give another "
                             "path.")
        return ""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot read it ({err.strerror}).") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"{flag} {path} is not UTF-8 text ({err.reason}); give a YAML recipe.") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{flag} {path} is not valid YAML{where} ({getattr(err, 'problem', None) or err}); fix "
                         "it or give another file.") from err
    if data is not None and not isinstance(data, dict):
        raise UsageError(f"{flag} {path} holds a YAML {type(data).__name__}, not a mapping of config fields "
                         "(key: value lines); give a recipe such as examples/recipes/capo-arith-tiny-cpu.yaml.")
    return text


_TOP_LEVEL_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.-]*)(?P<sep>[ \t]*:(?:[ \t]+|$))(?P<value>.*?)"
                            r"(?P<comment>[ \t]+#.*)?$")


def _yaml_scalar(value) -> str:
    return yaml.safe_dump(value).splitlines()[0]  # 1e-07 -> 1.0e-07: PyYAML reads a float only with a dot


def update_recipe(text: str, values: dict, path="recipe") -> str:
    """``text`` with each ``key: value`` line of ``values`` rewritten in place, missing keys appended.

    Only top-level ``key: value`` lines change; comments (trailing ones included), order and
    layout stay. The result is parsed again: if it is not a mapping holding exactly the new
    values (a key written as a block, a flow mapping, several documents), a UsageError says so
    and nothing is to be written.
    """
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    found = set()
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        match = _TOP_LEVEL_KEY.match(body)
        if match and match["key"] in values:
            sep = match["sep"] if match["sep"][-1:] in (" ", "\t") else match["sep"] + " "
            lines[i] = f"{match['key']}{sep}{_yaml_scalar(values[match['key']])}{match['comment'] or ''}" \
                       f"{line[len(body):]}"
            found.add(match["key"])
    missing = [key for key in values if key not in found]
    if missing:
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += newline
        lines.append(f"# measured by capo-trl calibrate-mask{newline}")
        lines += [f"{key}: {_yaml_scalar(values[key])}{newline}" for key in missing]
    result = "".join(lines)
    try:
        parsed = yaml.safe_load(result)
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict) or any(parsed.get(k) != v for k, v in values.items()):
        wanted = ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in values.items())
        raise UsageError(f"{path}: could not set {', '.join(values)} line by line (the file writes one of them in a "
                         f"form this edit does not handle); nothing written. Set them by hand: {wanted}.")
    return result


def _quartiles(x: torch.Tensor) -> list[float] | None:
    if x.numel() == 0:
        return None
    return [torch.quantile(x.double(), q).item() for q in (0.25, 0.5, 0.75)]


__all__ = ["PRESETS", "Budget", "check_budget", "parse_methods", "method_config", "check_methods", "train_method",
           "compare", "replot", "demo", "calibrate_mask", "unmeasured", "read_recipe", "update_recipe"]
