"""Evaluate a model the way CAPO reports it: N sampled answers per problem, accuracy, calibration.

The confidence of a completion is its mean token log-prob ``s`` under the sampling temperature,
recorded while ``generate`` samples by the same :class:`~capo_trl.evaluation.recorder.RolloutLogprobRecorder`
the trainer uses, so a score here means exactly what it means in training. AUROC and AURC rank
``s`` directly; ECE and Brier use ``exp(s)`` (docs/evaluation.md).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import calibration as cal
from ..errors import UsageError
from .sampling import (
    _eos_ids,
    _load_model,
    _load_tokenizer,
    _prompt_ids,
    _sample_transformers,
    _sample_vllm,
    _seeded,
)
from .metrics import reliability_curve, compute_metrics

__all__ = ["EvalResult", "evaluate", "check_settings", "default_ks", "compute_metrics"]

_GRADE_CHUNK = 256  # completions per grader call: keeps the progress bar moving
PLOT_FILES = ("precision_coverage.png", "reliability.png", "reliability_calibrated.png")


def default_ks(n: int) -> list[int]:
    """Powers of two up to n, and n itself: the k of pass@k and maj@k."""
    ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    return ks + ([n] if ks[-1] != n else [])


@dataclass
class EvalResult:
    """Everything one evaluation produced.

    ``metrics``: flat name -> number (NaN where undefined, e.g. AUROC with one class);
    ``samples``: one dict per completion (``id``, ``draw``, ``completion``, ``extracted``,
    ``grade``, ``score`` = s, ``num_tokens``, ``finished`` = ended with EOS); ``per_problem``:
    one dict per problem; ``curves``: precision-coverage and reliability bins; ``config``: settings.
    """

    metrics: dict[str, float]
    samples: list[dict]
    per_problem: list[dict] = field(default_factory=list)
    curves: dict[str, dict] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready report (NaN becomes null: JSON has no NaN); samples are left to the CSV."""
        return _json_safe({"metrics": self.metrics, "config": self.config, "curves": self.curves,
                           "per_problem": self.per_problem})

    def table(self, full: bool = False) -> str:
        """The headline numbers (every metric with ``full``), one ``name  value`` per line."""
        n = self.config.get("n")
        headline = [f"mean@{n}", *[f"pass@{k}" for k in self.config.get("ks", [])], f"maj@{n}", f"pc@{n}",
                    "auroc", "auroc_question", "auroc_draw", "ece", "brier", "aurc", "e_aurc"]
        keys = list(self.metrics) if full else [k for k in headline if k in self.metrics]
        width = max(len(k) for k in keys)
        lines = []
        for key in keys:
            value = self.metrics[key]
            text = f"{value:.4f}" if isinstance(value, float) else f"{value}"
            if key == f"mean@{n}" and f"{key}_ci_low" in self.metrics:
                text += f"  [{self.metrics[key + '_ci_low']:.4f}, {self.metrics[key + '_ci_high']:.4f}]"
            if key in ("auroc_question", "auroc_draw"):
                text += f"  ({self.metrics[key + '_n']} usable)"
            lines.append(f"{key:<{width}}  {text}")
        return "\n".join(lines)

    def save(self, out_dir, plots: bool = False) -> dict[str, Path]:
        """Write ``report.json`` and ``samples.csv`` (and PNG plots when asked); returns the paths.

        Files of an earlier report in ``out_dir`` are replaced as a set: without ``plots``, its
        PNGs are removed. Other files are left alone (the CLI refuses a non-empty directory
        unless ``--overwrite``)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"report": out / "report.json", "samples": out / "samples.csv"}
        paths["report"].write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
        columns = ["id", "draw", "grade", "score", "confidence", "num_tokens", "finished", "extracted", "completion"]
        if "calibrator" in self.config:  # the fitted map, loadable with Calibrator.load, and its output
            from .confidence import Calibrator

            paths["calibrator"] = Calibrator.from_dict(self.config["calibrator"]).save(out / "calibrator.json")
            columns.insert(5, "probability")
        with paths["samples"].open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for s in self.samples:
                writer.writerow({**{k: s.get(k) for k in columns}, "confidence": math.exp(s["score"])})
        if plots:
            from . import plots as draw

            paths["precision_coverage"] = draw.precision_coverage(self, out / "precision_coverage.png")
            paths["reliability"] = draw.reliability(self, out / "reliability.png")
            if "reliability_calibrated" in self.curves:
                paths["reliability_calibrated"] = draw.reliability_before_after(self, out / "reliability_calibrated.png")
        if not plots or "reliability_calibrated" not in self.curves:  # files of an earlier report saved here
            for name in PLOT_FILES if not plots else ("reliability_calibrated.png",):
                (out / name).unlink(missing_ok=True)
        if "calibrator" not in self.config:
            (out / "calibrator.json").unlink(missing_ok=True)
        return paths


def _json_safe(x):
    if isinstance(x, (np.floating, np.integer)):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_json_safe(v) for v in x]
    return x


# ------------------------------------------------------------------------------------ inputs
def check_settings(n: int, ks: list[int] | None = None, temperature: float = 1.0, top_p: float = 1.0,
                   top_k: int = 0, max_new_tokens: int = 1024, batch_size: int = 64, backend: str = "transformers",
                   sampler: str = "multinomial",
                   names: dict[str, str] | None = None) -> list[int]:
    """Check the sampling settings of :func:`evaluate` (cheap: call it before loading any model).

    Returns the sorted ks (the default ones when ``ks`` is None). Raises a
    :class:`~capo_trl.errors.UsageError` naming the setting as ``names`` spells it (the CLI
    passes its flags, e.g. ``{"n": "--n"}``; default: ``evaluate(n=...)``).
    """
    def name(key: str) -> str:
        return (names or {}).get(key) or f"evaluate({key}=...)"

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for key, value in (("n", n), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name(key)} must be an integer >= 1, got {value!r}.")
    if not number(temperature) or temperature < 0:
        raise UsageError(f"{name('temperature')} must be >= 0 (0 is greedy decoding), got {temperature!r}.")
    if not number(top_p) or not 0 < top_p <= 1:
        raise UsageError(f"{name('top_p')} must be in (0, 1] (1 disables nucleus sampling), got {top_p!r}.")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise UsageError(f"{name('top_k')} must be an integer >= 0 (0 disables top-k), got {top_k!r}.")
    if backend not in ("transformers", "vllm"):
        raise UsageError(f"{name('backend')}={backend!r}; expected 'transformers' or 'vllm'.")
    if sampler not in ("multinomial", "inverse_cdf"):
        raise UsageError(f"{name('sampler')}={sampler!r}; expected 'multinomial' or 'inverse_cdf'.")
    if sampler != "multinomial" and backend == "vllm":
        raise UsageError(f"{name('sampler')}={sampler!r} draws transformers' tokens; vLLM samples by itself: leave it "
                         "at 'multinomial' with the vllm backend.")
    ks = sorted(set(ks or default_ks(n)))
    if ks[0] < 1 or ks[-1] > n:
        raise UsageError(f"{name('ks')}: every k must be in [1, {name('n')} = {n}], got {ks}; lower the k values "
                         f"or raise {name('n')}.")
    return ks


def _as_problems(problems) -> list[dict]:
    """Dataset or list of dicts -> ``[{"prompt", "answer", "id"}]`` with unique string ids."""
    rows = [dict(r) for r in problems]
    if not rows:
        raise UsageError("evaluate: no problems given.")
    missing = [k for k in ("prompt", "answer") if k not in rows[0]]
    if missing:
        raise UsageError(f"evaluate: problems need 'prompt' and 'answer' fields, missing {missing} "
                         "(capo_trl.data.benchmarks.load_benchmark returns them).")
    out = [{"prompt": r["prompt"], "answer": r["answer"], "id": str(r.get("id", i))} for i, r in enumerate(rows)]
    seen, repeated = set(), []
    for r in out:
        if r["id"] in seen and r["id"] not in repeated:
            repeated.append(r["id"])
        seen.add(r["id"])
    if repeated:
        shown = ", ".join(repr(i) for i in repeated[:5]) + (", ..." if len(repeated) > 5 else "")
        raise UsageError(f"evaluate: problem ids must be unique (per-question metrics group by id); repeated: {shown}. "
                         "Fix the id column, or map another column to the id role.")
    return out


def evaluate(model, tokenizer, problems, n: int = 16, *, ks: list[int] | None = None,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, max_new_tokens: int = 1024,
             batch_size: int = 64, backend: str = "transformers", sampler: str = "multinomial", grader=None,
             seed: int | None = 0,
             n_bins: int = 10, bootstrap: int = 1000, progress: bool = True, device=None,
             dtype=None, calibrate_on=None, calibration: str = "platt", target_precision: float | None = None,
             selective_confidence: float = 0.95) -> EvalResult:
    """Sample ``n`` completions per problem, grade them, and compute every CAPO metric.

    ``model``/``tokenizer``: objects or paths (tokenizer None: the model path's). ``problems``: a
    dataset or list of dicts with ``prompt`` (text or chat messages), ``answer`` (gold, or list of
    acceptable golds), optional ``id``. ``batch_size``: sequences per ``generate`` call.
    ``grader``: anything with ``grade(texts, golds)``, ``extract(texts)`` and
    ``equivalent(a, b)``, by default a :class:`~capo_trl.rewards.MathReward`. ``temperature=0``
    is greedy (log-probs at T = 1). ``seed`` seeds sampling in a forked RNG, so the caller's
    random stream (a training run's) is left untouched. ``backend="vllm"`` needs vLLM and a path. ``sampler``:
    how transformers draws each token (:mod:`~capo_trl.evaluation.sampler`; ``"inverse_cdf"`` is cheaper on a CPU,
    from the same distribution, with other draws than the default's).
    Bad settings or problems raise a :class:`~capo_trl.errors.UsageError` (a ValueError) before
    any model is loaded (:func:`check_settings`).

    ``calibrate_on``: problems of another split (no question in common with ``problems``), sampled
    the same way; a :class:`~capo_trl.evaluation.confidence.Calibrator` (``calibration``: temperature, platt or
    isotonic) is fitted there and its P(correct) reported on ``problems`` (``ece_calibrated``,
    ``brier_calibrated``, per-sample ``probability``, ``config["calibrator"]``). With
    ``target_precision`` the abstention threshold on ``s`` is chosen on the calibration split too,
    with precision bounded by question, and its coverage and precision (with a question-level
    interval) measured here (``selective/*``; ``config["selective_bound"]`` says what the bound
    assumes).
    """
    ks, rows, cal_rows = _checked_inputs(problems, calibrate_on, calibration, target_precision, n=n, ks=ks,
                                         temperature=temperature, top_p=top_p, top_k=top_k,
                                         max_new_tokens=max_new_tokens, batch_size=batch_size, backend=backend,
                                         sampler=sampler)
    settings = dict(n=n, ks=ks, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                    backend=backend, sampler=sampler, seed=seed,
                    confidence="s = mean token log-prob (incl. EOS) of log_softmax(logits / T); ECE/Brier use exp(s)")
    path = str(model) if isinstance(model, (str, Path)) else None
    model, tokenizer, grader = _loaded(model, tokenizer, path, backend, device, dtype, grader)
    if backend != "vllm":  # the weights' dtype changes the samples: the report says which ran
        settings["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")

    def draw(part, part_seed):
        return _draw(model, tokenizer, path, part, part_seed, grader, n=n, temperature=temperature, top_p=top_p,
                     top_k=top_k, max_new_tokens=max_new_tokens, batch_size=batch_size, backend=backend,
                     sampler=sampler, progress=progress)

    samples = draw(rows, seed)
    metrics, per_problem, curves = compute_metrics(samples, n, ks, grader.equivalent, n_bins=n_bins,
                                                   bootstrap=bootstrap, seed=seed or 0, progress=progress)
    result = EvalResult(metrics, samples, per_problem, curves, settings)
    if cal_rows is not None:
        recalibrate(result, draw(cal_rows, None if seed is None else seed + 1), calibration, target_precision,
                    selective_confidence, n_bins)
    return result


def _checked_inputs(problems, calibrate_on, calibration: str, target_precision, **settings):
    """Every check of :func:`evaluate`'s inputs, before any model loads: (ks, problems, calibration problems)."""
    from . import confidence as conf

    _check_calibration(calibration, target_precision, calibrate_on)
    ks = check_settings(**settings)
    rows = _as_problems(problems)
    cal_rows = _as_problems(calibrate_on) if calibrate_on is not None else None
    if cal_rows is not None:
        conf.check_disjoint([_prompt_key(r) for r in cal_rows], [_prompt_key(r) for r in rows],
                            "calibrate_on and the evaluated problems")
    return ks, rows, cal_rows


def _loaded(model, tokenizer, path: str | None, backend: str, device, dtype, grader):
    """The model (vLLM loads its own from ``path``), the tokenizer and the grader (default: the shared one)."""
    tokenizer = _load_tokenizer(tokenizer, path)
    if backend != "vllm":
        model = _load_model(model, device, dtype)
    if grader is None:
        from ..grader import default_grader

        grader = default_grader()
    return model, tokenizer, grader


def _check_calibration(calibration: str, target_precision: float | None, calibrate_on) -> None:
    from . import confidence as conf

    if calibration not in conf.METHODS:
        raise UsageError(f"calibration must be one of {', '.join(conf.METHODS)}, got {calibration!r}.")
    if target_precision is not None and (calibrate_on is None or not 0 < target_precision < 1):
        raise UsageError("target_precision needs calibrate_on (the threshold is chosen there) and a value in (0, 1); "
                         f"got {target_precision!r}.")


def _draw(model, tokenizer, path, part, part_seed, grader, *, n, temperature, top_p, top_k, max_new_tokens,
          batch_size, backend, progress, sampler="multinomial") -> list[dict]:
    """``n`` graded samples per problem of ``part`` (seeded by ``part_seed``), by vLLM or transformers."""
    if backend == "vllm":
        drawn = _sample_vllm(path, _prompt_ids(tokenizer, [r["prompt"] for r in part]), n, temperature, top_p,
                             top_k, max_new_tokens, part_seed)
    else:
        prompt_ids = _prompt_ids(tokenizer, [r["prompt"] for r in part])
        was_training = model.training
        model.eval()
        try:
            with _seeded(part_seed, next(model.parameters()).device), torch.no_grad():
                drawn = _sample_transformers(model, tokenizer, prompt_ids, n, temperature, top_p, top_k,
                                             max_new_tokens, batch_size, progress, sampler)
        finally:
            model.train(was_training)
    texts = tokenizer.batch_decode([ids for ids, _ in drawn], skip_special_tokens=True)
    return _grade(drawn, texts, part, n, set(_eos_ids(model, tokenizer)), grader, progress)


def _prompt_key(row: dict) -> str:
    return row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"], sort_keys=True)


def recalibrate(result: EvalResult, calibration_samples: list[dict], method: str = "platt",
                target_precision: float | None = None, confidence: float = 0.95, n_bins: int = 10):
    """Fit a :class:`~capo_trl.evaluation.confidence.Calibrator` on ``calibration_samples`` and report it on ``result``.

    Adds ``ece_calibrated``, ``brier_calibrated``, the calibrated reliability bins, a per-sample
    ``probability`` and ``config["calibrator"]``; with ``target_precision`` the threshold on ``s`` chosen
    on the calibration samples (bounded by question, ``id``) and its ``selective/*`` coverage and
    precision here. Returns the calibrator.
    """
    from . import confidence as conf

    graded = [r for r in calibration_samples if r["grade"] is not None]
    calibrator = conf.Calibrator.fit([r["score"] for r in graded], [r["grade"] for r in graded], method)
    if target_precision is not None:  # bound by question: a question's n samples are correlated
        calibrator.fit_threshold([r["score"] for r in graded], [r["grade"] for r in graded], target_precision,
                                 confidence, groups=[r["id"] for r in graded])
    usable = [r for r in result.samples if r["grade"] is not None]
    probability = calibrator.predict([r["score"] for r in result.samples])
    for r, p_cal in zip(result.samples, probability):
        r["probability"] = float(p_cal)
    p = np.array([r["probability"] for r in usable])
    y = np.array([r["grade"] for r in usable], dtype=float)
    m = result.metrics
    m["ece_calibrated"], m["brier_calibrated"] = cal.ece(p, y, n_bins=n_bins), cal.brier(p, y)
    m["mean_probability"] = float(p.mean()) if p.size else float("nan")
    result.curves["reliability_calibrated"] = reliability_curve(p, y, n_bins)
    if calibrator.selective is not None:
        sel = calibrator.selective
        report = conf.selective_report(sel.threshold, [r["score"] for r in usable], y, confidence,
                                       groups=[r["id"] for r in usable])
        result.config["selective_bound"] = report.pop("bound")
        m.update({"selective/target_precision": target_precision, "selective/threshold": sel.threshold,
                  "selective/probability": sel.probability, "selective/calibration_coverage": sel.coverage,
                  "selective/calibration_questions": sel.n_questions, **{f"selective/{k}": v for k, v in report.items()}})
    result.config["calibrator"] = calibrator.to_dict()
    result.config["calibration_samples"] = len(graded)
    return calibrator


def _grade(drawn, texts, rows, n, eos, grader, progress) -> list[dict]:
    """Per-sample records: grade and extracted answer from the grader, score s = mean log-prob."""
    golds = [r["answer"] for r in rows for _ in range(n)]
    grades, extracted = [], []
    for start in tqdm(range(0, len(texts), _GRADE_CHUNK), desc="grading", disable=not progress):
        chunk = slice(start, start + _GRADE_CHUNK)
        grades += grader.grade(texts[chunk], golds[chunk])
        extracted += grader.extract(texts[chunk])
    return [
        {"id": rows[i // n]["id"], "draw": i % n, "completion": texts[i], "extracted": extracted[i],
         "grade": grades[i], "score": float(np.mean(lp)), "num_tokens": len(ids),
         "finished": bool(ids) and ids[-1] in eos}
        for i, (ids, lp) in enumerate(drawn)
    ]


# ------------------------------------------------------------------------------------ metrics
