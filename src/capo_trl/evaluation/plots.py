"""Every PNG the library writes, drawn on :class:`matplotlib.figure.Figure` objects.

No pyplot: no global backend switch, no figure registry to leak into (a notebook's own pyplot
state is left alone), and each figure is freed with its last reference. Each function takes the
data and the path, writes the PNG and returns what its caller reports.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

DPI = 120


def new_figure(width: float = 5.0, height: float = 4.0):
    """A matplotlib Figure outside pyplot: no global backend switch, no figure left open."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


# ------------------------------------------------------------------------------------ one evaluation
def precision_coverage(result, path) -> Path:
    """CAPO's "Pareto" plot of an EvalResult: precision of the most confident fraction of answers."""
    curve = result.curves["precision_coverage"]
    fig = new_figure()
    ax = fig.add_subplot()
    ax.plot(curve["coverage"], curve["precision"], label="most confident first (s)")
    acc = result.metrics.get(f"mean@{result.config['n']}")
    if acc is not None and not math.isnan(acc):
        ax.axhline(acc, color="gray", linestyle="--", label=f"accuracy {acc:.3f}")
    ax.set(xlabel="coverage", ylabel="precision", xlim=(0, 1), ylim=(-0.02, 1.02),
           title=f"precision-coverage (AURC {result.metrics['aurc']:.3f})")
    ax.legend(loc="best")
    return _save(fig, path)


def _reliability_bars(ax, bins: dict, xlabel: str, title: str) -> None:
    """Per-bin accuracy against the diagonal, on ``ax``."""
    edges = np.asarray(bins["edges"])
    acc = np.asarray(bins["accuracy"], dtype=float)
    ax.bar(edges[:-1], np.nan_to_num(acc), width=np.diff(edges), align="edge", edgecolor="black", alpha=0.7,
           label="accuracy")
    ax.plot([0, 1], [0, 1], color="gray", linestyle="--", label="perfect calibration")
    ax.set(xlabel=xlabel, ylabel="accuracy", xlim=(0, 1), ylim=(0, 1), title=title)


def reliability(result, path) -> Path:
    """Reliability diagram of an EvalResult's exp(s): per-bin accuracy against the diagonal."""
    fig = new_figure()
    ax = fig.add_subplot()
    _reliability_bars(ax, result.curves["reliability"], "confidence exp(s)",
                      f"reliability (ECE {result.metrics['ece']:.3f})")
    ax.legend(loc="upper left")
    return _save(fig, path)


def reliability_before_after(result, path) -> Path:
    """Reliability of raw exp(s) and of the calibrated P(correct), side by side (``calibrate_on``)."""
    fig = new_figure(9.0, 3.8)
    raw, fitted = fig.subplots(1, 2)
    _reliability_bars(raw, result.curves["reliability"], "raw confidence exp(s)", f"ECE {result.metrics['ece']:.3f}")
    _reliability_bars(fitted, result.curves["reliability_calibrated"],
                      f"calibrated ({result.config['calibrator']['method']})",
                      f"ECE {result.metrics['ece_calibrated']:.3f}")
    return _save(fig, path)


# The demo's panels: each a test endpoint, higher is better in each.
DEMO_PANELS = (("auroc", "pooled AUROC"), ("auroc_question", "per-question AUROC"), ("accuracy", "accuracy"))


def demo_figure(before: dict, records: list[dict], path, title: str, study: dict | None = None,
                run_label: str = "this run") -> Path:
    """``capo-trl demo``'s picture (:func:`draw_demo`), written to ``path``."""
    return _save(draw_demo(before, records, title, study, run_label), path)


def draw_demo(before: dict, records: list[dict], title: str, study: dict | None = None, run_label: str = "this run"):
    """One panel per :data:`DEMO_PANELS` endpoint on the test split, each marked "higher is better": the start
    model and each arm of this run (stars, with their values) beside the committed study's seeds (dots), their
    mean and 95% t interval (bars), so one seed's noise reads as such.

    ``before``: the start model's headline metrics; ``records``: one per arm, with ``method`` and ``after``;
    ``study``: ``label``, ``start`` (metric -> value: one evaluation) and ``arms`` (method -> metric -> ``values``
    per seed, ``mean``, ``low``, ``high``), or None (no committed study to draw: said on the picture).
    """
    fig = new_figure(3 * 4.2, 4.6)
    axes = fig.subplots(1, len(DEMO_PANELS))
    names = ["start"] + [r["method"] for r in records]
    ours = [before] + [r["after"] for r in records]
    theirs = [study["start"] if study else None] + [(study or {}).get("arms", {}).get(r["method"]) for r in records]
    colors = ["0.45"] + [f"C{i}" for i in range(len(records))]
    for ax, (key, name) in zip(axes, DEMO_PANELS):
        for x, (mine, committed, color) in enumerate(zip(ours, theirs, colors)):
            if committed is not None and isinstance(committed.get(key), dict):  # an arm: its seeds
                c = committed[key]
                ax.scatter(x - 0.18 + np.linspace(-0.07, 0.07, len(c["values"])), c["values"], s=14, color="0.6",
                           label="study: one dot per seed")
                ax.errorbar(x - 0.18, c["mean"], yerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="o",
                            color="black", capsize=5, markersize=5, label="study: mean, 95% t interval")
            elif committed is not None:  # the start model: one evaluation, no seeds
                ax.scatter(x - 0.18, committed[key], marker="D", s=30, color="black", label="study: start model")
            value = mine.get(key)
            if value is not None and not math.isnan(value):
                ax.scatter(x + 0.18, value, marker="*", s=220, color=color, edgecolor="black", linewidth=0.6,
                           zorder=3, label=run_label)
                ax.annotate(f"{value:.3f}", (x + 0.18, value), xytext=(7, -3), textcoords="offset points",
                            fontsize="x-small")
        ax.set_xticks(range(len(names)), names, fontsize="small")
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set(ylabel=f"{name}  (\u2191 higher is better)", title=f"test split: {name}")
        ax.grid(alpha=0.3, axis="y")
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    order = sorted(handles, key=lambda label: (label != run_label, label))  # this run first, then the study's marks
    fig.legend([handles[k] for k in order], order, loc="outside lower center", ncol=len(order), fontsize="small")
    fig.suptitle(title + "\n" + (f"against the {study['label']}" if study else
                                 "no committed study of this task and start model to draw it against"),
                 fontsize="medium")
    return fig


# ------------------------------------------------------------------------------------ during training
def calibration_history(history: list[dict], path, prefix: str = "val/", n: int = 8) -> Path:
    """CalibrationCallback's history: AUROC (pooled, per question, per draw) and accuracy against step."""
    steps = [h["step"] for h in history]
    fig = new_figure(9.0, 3.6)
    left, right = fig.subplots(1, 2)
    for key, label in (("auroc", "AUROC (pooled)"), ("auroc_question", "AUROC (per question)"),
                       ("auroc_draw", "AUROC (per draw)")):
        left.plot(steps, [h.get(prefix + key, math.nan) for h in history], marker="o", label=label)
    left.set(xlabel="step", ylabel="AUROC", title="calibration")
    left.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    for key in (f"mean@{n}", f"pc@{n}", f"maj@{n}"):
        right.plot(steps, [h.get(prefix + key, math.nan) for h in history], marker="o", label=key)
    right.set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=(-0.02, 1.02))
    left.legend(fontsize="small")
    right.legend(fontsize="small")
    return _save(fig, path)


# ------------------------------------------------------------------------------------ a comparison
def validation_curves(rows: list[dict], path, val_samples: int) -> int:
    """Validation metrics vs step per method, mean and min-max over seeds; returns how many points were drawn.

    ``rows``: ``{"method", "seed", "step", "metric", "value"}`` (a comparison's metrics.csv).
    """
    panels = [(f"val/mean@{val_samples}", "accuracy"), ("val/auroc", "pooled AUROC"),
              ("val/auroc_question", "per-question AUROC")]
    drawn = 0
    fig = new_figure(5.0 * len(panels), 4.0)
    axes = fig.subplots(1, len(panels))
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
    _save(fig, path)
    return drawn


def precision_coverage_by_method(curves: dict, path) -> Path:
    """One precision-coverage curve per method (its first seed's); ``curves``: method -> per-seed curves."""
    fig = new_figure()
    ax = fig.add_subplot()
    for method, per_seed in curves.items():
        curve = per_seed[0]
        if curve:
            ax.plot(curve["coverage"], curve["precision"], label=method)
    ax.set(xlabel="coverage", ylabel="precision", title="precision-coverage (test)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


__all__ = ["DEMO_PANELS", "calibration_history", "demo_figure", "draw_demo", "new_figure", "precision_coverage", "precision_coverage_by_method", "reliability",
           "reliability_before_after",
           "validation_curves"]
