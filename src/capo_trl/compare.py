"""Methods side by side on the embedded default: the `demo`, `compare` and `calibrate-mask` commands.

Every method is a named preset of `CAPOConfig` overrides (optionally amended on the command line,
``capo:tau=0.3:noise_mask=false``) trained on identical data, seeds and budget, validated during
training by :class:`~capo_trl.callbacks.CalibrationCallback` and evaluated on the same test split.
"""

from __future__ import annotations

import csv
import json
import math
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


def parse_methods(text: str) -> list[tuple[str, dict]]:
    """``"grpo,capo:tau=0.3:noise_mask=false"`` -> [(label, CAPOConfig overrides), ...]."""
    methods = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        preset, *amendments = item.split(":")
        if preset not in PRESETS:
            raise ValueError(f"unknown method {preset!r} in --methods; presets are {sorted(PRESETS)} "
                             "(amend one with preset:field=value, e.g. capo:tau=0.3).")
        overrides = dict(PRESETS[preset])
        for amendment in amendments:
            key, sep, value = amendment.partition("=")
            if not sep:
                raise ValueError(f"--methods: expected field=value after ':' in {item!r}, got {amendment!r}.")
            overrides[key] = yaml.safe_load(value)
        methods.append((item, overrides))
    if not methods:
        raise ValueError("--methods is empty; give e.g. grpo,capo.")
    return methods


def _reward(budget: Budget):
    from .rewards import math_accuracy_reward

    return with_grader_noise(math_accuracy_reward, budget.grader_noise) if budget.grader_noise else math_accuracy_reward


def _evaluate_test(model, tokenizer, budget: Budget, seed: int):
    from .evaluation import evaluate

    problems = arithmetic_dataset("test", budget.test_problems)
    return evaluate(model, tokenizer, problems, n=budget.test_samples, max_new_tokens=budget.max_completion_length,
                    temperature=1.0, seed=seed, progress=budget.progress)


def train_method(overrides: dict, seed: int, budget: Budget, out_dir: Path):
    """Train one method with one seed; returns (trainer, validation history, test EvalResult)."""
    from transformers import AutoTokenizer

    from .callbacks import CalibrationCallback
    from .config import CAPOConfig
    from .trainer import CAPOTrainer

    model = budget.model or embedded_model_path()
    args = CAPOConfig(
        output_dir=str(out_dir), seed=seed, max_steps=budget.steps, learning_rate=budget.learning_rate,
        warmup_steps=budget.warmup_steps, per_device_train_batch_size=budget.prompts_per_step * budget.num_generations,
        num_generations=budget.num_generations, max_completion_length=budget.max_completion_length,
        temperature=1.0, beta=0.0, bf16=False, use_cpu=not torch.cuda.is_available(), gradient_checkpointing=False,
        report_to="none", save_strategy="no", logging_steps=max(1, budget.val_every // 5),
        disable_tqdm=not budget.progress, **overrides,
    )
    train = arithmetic_dataset("train", budget.train_problems, seed=seed)
    trainer = CAPOTrainer(model=model, reward_funcs=_reward(budget), args=args, train_dataset=train)
    monitor = CalibrationCallback(arithmetic_dataset("validation", budget.val_problems), every_n_steps=budget.val_every,
                                  n=budget.val_samples, seed=seed)
    trainer.add_callback(monitor.bind(trainer))
    trainer.train()
    tokenizer = AutoTokenizer.from_pretrained(model)
    return trainer, monitor.history, _evaluate_test(trainer.model, tokenizer, budget, seed)


HEADLINE = ("accuracy", "auroc", "auroc_question", "ece")


def _headline(metrics: dict, n: int) -> dict:
    return {"accuracy": metrics.get(f"mean@{n}"), "auroc": metrics.get("auroc"),
            "auroc_question": metrics.get("auroc_question"), "ece": metrics.get("ece")}


def compare(methods: list[tuple[str, dict]], seeds: int, out: Path, budget: Budget, first_seed: int = 0) -> dict:
    """Train every method with seeds ``first_seed ...`` (alternating), write metrics.csv, report.md and plots."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, finals, curves = [], {}, {}
    started = time.time()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start_path = budget.model or embedded_model_path()
    start = _evaluate_test(AutoModelForCausalLM.from_pretrained(start_path), AutoTokenizer.from_pretrained(start_path),
                           budget, seed=0)
    finals["start (no RL)"] = [_headline(start.metrics, budget.test_samples)]
    curves["start (no RL)"] = [start.curves.get("precision_coverage")]
    for seed in range(first_seed, first_seed + seeds):
        for label, overrides in methods:
            t0 = time.time()
            _, history, result = train_method(overrides, seed, budget, out / "runs" / f"{label}-seed{seed}")
            for point in history:
                for name, value in point.items():
                    if name != "step":
                        rows.append({"method": label, "seed": seed, "step": point["step"], "metric": name,
                                     "value": value})
            finals.setdefault(label, []).append(_headline(result.metrics, budget.test_samples))
            curves.setdefault(label, []).append(result.curves.get("precision_coverage"))
            print(f"[{label} seed {seed}] {time.time() - t0:.0f}s  "
                  + "  ".join(f"{k}={v:.4f}" for k, v in finals[label][-1].items() if v is not None))
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "seed", "step", "metric", "value"])
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "final.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "seed", *HEADLINE])
        writer.writeheader()
        for label, per_seed in finals.items():
            for seed, values in enumerate(per_seed, start=first_seed):  # the start model: once
                writer.writerow({"method": label, "seed": seed, **values})
    summary = {label: {k: _mean_std([v[k] for v in per_seed]) for k in HEADLINE} for label, per_seed in finals.items()}
    _write_report(out, methods, seeds, budget, summary, time.time() - started)
    drawn = _plot_curves(out, rows, budget)
    _plot_precision_coverage(out, curves)
    (out / "summary.json").write_text(json.dumps({"budget": asdict(budget), "summary": summary,
                                                  "plotted_points": drawn}, indent=2))
    return summary


def _mean_std(values) -> tuple[float, float]:
    vals = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if vals.size == 0:
        return float("nan"), float("nan")
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0


def _write_report(out, methods, seeds, budget, summary, seconds) -> None:
    lines = [
        "# capo-trl compare", "",
        f"{seeds} seed(s) per method; {budget.steps} RL steps of {budget.prompts_per_step} prompts x "
        f"{budget.num_generations} samples; test: {budget.test_problems} problems x {budget.test_samples} samples "
        f"(temperature 1); grader noise {budget.grader_noise}; {seconds / 60:.1f} min in all.", "",
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
    """Before/after accuracy and calibration of one method on the embedded default (CPU, minutes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    budget = budget or Budget(steps=200, val_every=100, val_problems=32, test_problems=256, test_samples=8)
    model_path = budget.model or embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    before = _evaluate_test(AutoModelForCausalLM.from_pretrained(model_path), tokenizer, budget, seed=0)
    (label, overrides), = parse_methods(method)
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
    return {
        "ref_high": ref_high, "ref_low": ref_low, "tau": spread, "score_spread": spread,
        "reference_auroc": auroc(scores.numpy(), correct), "reference_accuracy": float(np.nanmean(grades.numpy())),
        "ppl_correct_quartiles": _quartiles(ppl[grades >= correct_threshold]),
        "ppl_wrong_quartiles": _quartiles(ppl[grades < correct_threshold]),
        "n_problems": len(problems), "n_samples": len(samples),
    }


def _quartiles(x: torch.Tensor) -> list[float] | None:
    if x.numel() == 0:
        return None
    return [torch.quantile(x.double(), q).item() for q in (0.25, 0.5, 0.75)]


__all__ = ["PRESETS", "Budget", "parse_methods", "train_method", "compare", "replot", "demo", "calibrate_mask"]
