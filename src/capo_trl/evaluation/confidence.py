"""Confidence a user can act on: the score ``s`` (mean token log-prob) mapped to P(correct), and abstention.

CAPO trains ``s`` to *rank* right answers above wrong ones; a ranking is not a probability (raw
``exp(s)`` is far too confident). :class:`Calibrator` fits a monotone map ``s -> P(correct)`` on a
held-out calibration split (temperature scaling, Platt/logistic, or isotonic regression from
scikit-learn), saves it as a small JSON file next to the model, and applies it to new samples
without scikit-learn objects. :meth:`Calibrator.fit_threshold` then picks the lowest score at
which answering still meets a target precision with a stated confidence (:mod:`capo_trl.evaluation.selective`:
fixed-sequence tests from the most confident down, at the question level when ``groups`` says which
question each sample answers, so the chance of ending below the target is at most
``1 - confidence``).
:func:`answer_or_abstain` is the inference-time rule: a question in, the answer or None out, with
the probability.

Calibration and evaluation samples must not share questions (the samples of one question are
correlated): :func:`question_split` splits one pool by question, :func:`check_disjoint` refuses
overlapping splits.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .selective import (
    INDEPENDENT,
    ONE_EACH,
    QUESTIONS,
    Selective,
    clopper_pearson,
    select_threshold,
    selective_report,
)

METHODS = ("temperature", "platt", "isotonic")
_EPS = 1e-6


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _arrays(scores, correct=None, lengths=None):
    s = np.asarray(scores, dtype=float).ravel()
    if not np.all(np.isfinite(s)):
        raise UsageError(f"scores must be finite numbers; {int((~np.isfinite(s)).sum())} of {s.size} are not.")
    y = None
    if correct is not None:
        y = np.asarray(correct, dtype=float).ravel()
        if y.shape != s.shape:
            raise UsageError(f"got {s.size} scores but {y.size} correctness labels.")
        if not np.all((y == 0) | (y == 1)):
            raise UsageError("correct must be 0/1 (or booleans); ungraded samples must be left out first.")
    x = None
    if lengths is not None:
        x = np.asarray(lengths, dtype=float).ravel()
        if x.shape != s.shape or not np.all(np.isfinite(x)):
            raise UsageError("lengths must be one finite number per score.")
    return s, y, x


@dataclass
class Calibrator:
    """A fitted map ``s`` (and optionally completion length) -> P(correct); see the module docstring."""

    method: str
    params: dict = field(default_factory=dict)
    uses_length: bool = False
    n: int = 0  # calibration samples
    selective: Selective | None = None

    @classmethod
    def fit(cls, scores, correct, method: str = "platt", lengths=None) -> Calibrator:
        """Fit on a calibration split: ``scores`` s, ``correct`` 0/1, ``lengths`` (Platt only) tokens."""
        if method not in METHODS:
            raise UsageError(f"calibration method must be one of {', '.join(METHODS)}, got {method!r}.")
        s, y, x = _arrays(scores, correct, lengths)
        if y is None or y.min() == y.max():
            raise UsageError(f"calibration needs correct and wrong samples; got {int(np.sum(y))} correct of {s.size}.")
        if x is not None and method != "platt":
            raise UsageError(f"lengths are used by method='platt' only, not {method!r}.")
        if method == "temperature":  # p = sigmoid(logit(exp(s)) / T): one parameter, order and 0.5 kept
            from scipy.optimize import minimize_scalar

            z = _logit(np.exp(s))

            def nll(log_t):
                p = np.clip(_sigmoid(z / math.exp(log_t)), _EPS, 1 - _EPS)
                return -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))

            params = {"temperature": math.exp(minimize_scalar(nll, bounds=(-7.0, 7.0), method="bounded").x)}
        elif method == "platt":  # p = sigmoid(a s (+ c length) + b)
            from sklearn.linear_model import LogisticRegression

            features = np.column_stack([s] if x is None else [s, x])
            fit = LogisticRegression(C=1e6, max_iter=1000).fit(features, y)
            params = {"coef": [float(c) for c in fit.coef_[0]], "intercept": float(fit.intercept_[0])}
        else:  # isotonic: a monotone step function, linear between its knots (as sklearn predicts)
            from sklearn.isotonic import IsotonicRegression

            fit = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(s, y)
            params = {"x": [float(v) for v in fit.X_thresholds_], "y": [float(v) for v in fit.y_thresholds_]}
        return cls(method=method, params=params, uses_length=x is not None, n=int(s.size))

    def predict(self, scores, lengths=None) -> np.ndarray:
        """P(correct) per sample."""
        s, _, x = _arrays(scores, None, lengths)
        if self.uses_length and x is None:
            raise UsageError("this calibrator was fitted with completion lengths: pass lengths=.")
        if self.method == "temperature":
            return _sigmoid(_logit(np.exp(s)) / self.params["temperature"])
        if self.method == "platt":
            coef = self.params["coef"]
            return _sigmoid(coef[0] * s + (coef[1] * x if self.uses_length else 0.0) + self.params["intercept"])
        return np.interp(s, self.params["x"], self.params["y"])

    def fit_threshold(self, scores, correct, target_precision: float, confidence: float = 0.95,
                      lengths=None, groups=None) -> Selective:
        """Choose the abstention threshold on a calibration split (stored in ``self.selective``).

        ``groups``: the question of each sample (bound by question; without it the samples are
        taken as independent). The cut is on the raw score s, not on this map's output: the map
        was fitted on the same labels, and isotonic's flat blocks sit where this sample's
        precision happens to be high, so cuts on them would pass the test more often than they
        should. s has the same order as any increasing map of it.
        """
        s, y, x = _arrays(scores, correct, lengths)
        sel = select_threshold(s, y, target_precision, confidence, groups=groups)
        sel.on = "score"
        if math.isfinite(sel.threshold):
            sel.probability = float(self.predict(s, x)[s >= sel.threshold].min())
        self.selective = sel
        return sel

    def decide(self, score: float, length: float | None = None) -> tuple[bool, float]:
        """(answer?, P(correct)) for one sample; answers always when no threshold was fitted."""
        p = float(self.predict([score], None if length is None else [length])[0])
        if self.selective is None:
            return True, p
        return (score if self.selective.on == "score" else p) >= self.selective.threshold, p

    # ---- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = asdict(self)
        if out["selective"] is not None:  # JSON has no inf/NaN: None (threshold None = never answer)
            out["selective"] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                                for k, v in out["selective"].items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Calibrator:
        data = dict(data)
        if data.get("method") not in METHODS:
            raise UsageError(f"not a capo-trl calibrator (method {data.get('method')!r}).")
        sel = data.pop("selective", None)
        if sel is not None:
            sel = Selective(**{k: (math.inf if k == "threshold" else math.nan) if v is None else v for k, v in sel.items()})
        return cls(**data, selective=sel)

    def save(self, path) -> Path:
        """Write JSON (e.g. ``<model_dir>/confidence.json``); returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path) -> Calibrator:
        return cls.from_dict(json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------------------------- splits
def question_split(groups, calibration_fraction: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, evaluation) boolean masks over samples; every question lies in exactly one."""
    from sklearn.model_selection import GroupShuffleSplit

    g = np.asarray(groups)
    if not 0 < calibration_fraction < 1:
        raise UsageError(f"calibration_fraction must be in (0, 1), got {calibration_fraction!r}.")
    if np.unique(g).size < 2:
        raise UsageError("question_split needs at least two questions.")
    split = GroupShuffleSplit(n_splits=1, train_size=calibration_fraction, random_state=seed)
    cal, _ = next(split.split(np.zeros(g.size), groups=g))
    mask = np.zeros(g.size, dtype=bool)
    mask[cal] = True
    return mask, ~mask


def check_disjoint(calibration_questions, evaluation_questions, what: str = "calibration and evaluation") -> None:
    """UsageError when the two sets share a question (the fit would leak into the evaluation)."""
    shared = set(calibration_questions) & set(evaluation_questions)
    if shared:
        example = next(iter(shared))
        raise UsageError(f"{what} share {len(shared)} question(s), e.g. {str(example)[:80]!r}: calibrate on another "
                         "split (or use question_split on one pool).")


def cross_fitted(scores, correct, groups, method: str = "platt", seed: int = 0) -> np.ndarray:
    """Calibrated probabilities of every sample from a map fitted on the *other* half of the questions."""
    s, y, _ = _arrays(scores, correct)
    a, b = question_split(groups, 0.5, seed)
    out = np.full(s.size, np.nan)
    for fit_on, apply_to in ((a, b), (b, a)):
        out[apply_to] = Calibrator.fit(s[fit_on], y[fit_on], method).predict(s[apply_to])
    return out


# ---------------------------------------------------------------------------------------- inference
@dataclass
class Decision:
    answer: str | None  # the extracted final answer, or None: abstain
    probability: float  # calibrated P(correct)
    completion: str
    score: float  # s


def answer_or_abstain(model, tokenizer, prompt, calibrator: Calibrator, *, max_new_tokens: int = 1024,
                      temperature: float = 1.0, grader=None, seed: int | None = 0) -> Decision:
    """Sample one answer to ``prompt`` (text or chat messages) and keep it only if the calibrator says so."""
    import torch

    from .sampling import (
        _load_model,
        _load_tokenizer,
        _prompt_ids,
        _sample_transformers,
        _seeded,
    )

    path = str(model) if isinstance(model, (str, Path)) else None
    tokenizer = _load_tokenizer(tokenizer, path)
    model = _load_model(model, None, None)
    with _seeded(seed, next(model.parameters()).device), torch.no_grad():
        ids, logps = _sample_transformers(model, tokenizer, _prompt_ids(tokenizer, [prompt]), 1, temperature, 1.0, 0,
                                          max_new_tokens, 1, False)[0]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    score = float(np.mean(logps)) if len(logps) else float("-inf")
    if grader is None:
        from ..grader import default_grader

        grader = default_grader()
    answer = grader.extract([text])[0]
    keep, p = calibrator.decide(score, len(ids) if calibrator.uses_length else None) if math.isfinite(score) else (
        False, 0.0)
    return Decision(answer if keep else None, p, text, score)


__all__ = ["INDEPENDENT", "METHODS", "ONE_EACH", "QUESTIONS", "Calibrator", "Selective", "Decision", "answer_or_abstain",
           "check_disjoint", "clopper_pearson", "cross_fitted", "question_split", "select_threshold",
           "selective_report"]
