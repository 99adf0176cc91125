"""Verbalised confidence (RLCR, DCPO): parsing, token spans, reward functions, evaluation.

Pure string/list work plus two TRL reward functions built on :class:`~capo_trl.rewards.MathReward`.
Formats (``docs/baselines.md``):

* RLCR: ``<think>..</think><answer>..</answer><analysis>..</analysis><confidence>q</confidence>``,
  ``q`` in [0, 1], the last ``<confidence>`` tag wins; any deviation is a format failure.
* DCPO (released code): a line ``CONFIDENCE: <float>``; we take the last one, and only values in
  [0, 1] count (the released regex also accepted e.g. ``85``). Missing -> confidence -1 and, as in
  the released code, the completion's last token plays the confidence block.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

DCPO_INSTRUCTION = ("Solve the problem, put the final answer in \\boxed{}, then on a last line state how likely "
                    "your answer is correct as 'CONFIDENCE: <number between 0 and 1>'.")
RLCR_INSTRUCTION = ("Think inside <think></think>, give the final answer inside <answer></answer>, analyse how "
                    "reliable it is inside <analysis></analysis>, and give the probability that it is correct "
                    "(a number between 0 and 1) inside <confidence></confidence>.")

_DCPO = re.compile(r"CONFIDENCE:\s*([0-9]*\.?[0-9]+)")
_RLCR_FORMAT = re.compile(
    r"<think>.*?</think>\s*<answer>.*?</answer>\s*<analysis>.*?</analysis>\s*<confidence>.*?</confidence>", re.S)
_CONFIDENCE_TAG = re.compile(r"<confidence>(.*?)</confidence>", re.S)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


@dataclass(frozen=True)
class Verbalized:
    """What a completion states: ``confidence`` in [0, 1] or None, where the confidence block starts
    (a character offset, None when absent) and whether the whole output format holds."""

    confidence: float | None
    start: int | None
    format_ok: bool


def _unit_float(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def parse_dcpo_confidence(text: str) -> Verbalized:
    """The last ``CONFIDENCE: x`` of a completion; the block runs from that line to the end."""
    match = None
    for match in _DCPO.finditer(text):
        pass
    value = _unit_float(match.group(1)) if match else None
    if value is None:
        return Verbalized(None, None, False)
    return Verbalized(value, match.start(), True)


def parse_rlcr(text: str) -> Verbalized:
    """RLCR's four-tag format; the confidence block is the last ``<confidence>`` tag."""
    tags = list(_CONFIDENCE_TAG.finditer(text))
    value = _unit_float(tags[-1].group(1)) if tags else None
    ok = value is not None and _RLCR_FORMAT.search(text) is not None
    return Verbalized(value, tags[-1].start() if tags and value is not None else None, ok)


def answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>`` tag, else None."""
    tags = _ANSWER_TAG.findall(text)
    return tags[-1].strip() if tags else None


def token_start(ids: Sequence[int], char_start: int, decode: Callable[[list[int]], str]) -> int | None:
    """Index of the first token whose decoded text reaches character ``char_start`` (binary search
    over prefix decodes, so multi-character and byte-level tokens map correctly)."""
    ids = list(ids)
    lo, hi = 1, len(ids)
    if not ids or len(decode(ids)) <= char_start:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) > char_start:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def verbalized_inputs(parse: Callable[[str], Verbalized], completion_ids: torch.Tensor, mask: torch.Tensor,
                      decode: Callable[[list[int]], str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per completion (right-padded rows): stated confidence (NaN if none), format flag, and a
    ``(B, T)`` mask of the confidence block's tokens (last token when there is no block)."""
    n_rows, width = completion_ids.shape
    confidence = torch.full((n_rows,), float("nan"))
    format_ok = torch.zeros(n_rows, dtype=torch.bool)
    span = torch.zeros(n_rows, width, dtype=torch.bool)
    lengths = mask.sum(dim=1).tolist()
    for i, n in enumerate(int(v) for v in lengths):
        ids = completion_ids[i, :n].tolist()
        stated = parse(decode(ids)) if n else Verbalized(None, None, False)
        format_ok[i] = stated.format_ok
        start = None
        if stated.confidence is not None:
            confidence[i] = stated.confidence
            start = token_start(ids, stated.start, decode)
        if start is not None:
            span[i, start:n] = True
        elif n:
            span[i, n - 1] = True
    device = completion_ids.device
    return confidence.to(device), format_ok.to(device), span.to(device)


# --------------------------------------------------------------------------------------------
# reward functions (TRL signature)
# --------------------------------------------------------------------------------------------
def _boxed(answer: str | None) -> str:
    """MathReward reads anchored answers only: box a bare tag content so ``42`` is graded."""
    if answer is None:
        return ""
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


class AnswerTagReward:
    """Accuracy of the last ``<answer>`` tag (0 when absent), graded by a MathReward.

    The correctness reward for ``advantage_estimator="rlcr"``: the estimator adds format and Brier terms.
    """

    def __init__(self, math_reward=None):
        from ..rewards import MathReward

        self.math = math_reward or MathReward()
        self.__name__ = "answer_tag_accuracy"

    def __call__(self, completions, answer=None, solution=None, **kwargs):
        from ..rewards import _as_text

        answers = [_boxed(answer_tag(_as_text(c))) for c in completions]
        return self.math(answers, answer=answer, solution=solution)


class RLCRReward(AnswerTagReward):
    """RLCR's whole released reward as one TRL reward function: ``0.5 format + 0.5 accuracy +
    0.5 (1 - (correct - q)^2)``, 0 when the format fails.

    For GRPOTrainer or ``advantage_estimator="grpo"``. Inside capo-trl prefer ``"rlcr"`` with
    :class:`AnswerTagReward`: the ``capo/*`` metrics then see correctness, not this total.
    """

    def __init__(self, math_reward=None, format_weight: float = 0.5, accuracy_weight: float = 0.5,
                 brier_weight: float = 0.5):
        super().__init__(math_reward)
        self.weights = (format_weight, accuracy_weight, brier_weight)
        self.__name__ = "rlcr"

    def __call__(self, completions, answer=None, solution=None, **kwargs):
        from ..baselines import rlcr_rewards
        from ..rewards import _as_text

        grades = super().__call__(completions, answer=answer, solution=solution)
        stated = [parse_rlcr(_as_text(c)) for c in completions]
        correct = torch.tensor([float("nan") if g is None else g for g in grades])
        conf = torch.tensor([float("nan") if s.confidence is None else s.confidence for s in stated])
        ok = torch.tensor([s.format_ok for s in stated])
        return [None if math.isnan(v) else v for v in rlcr_rewards(correct, conf, ok, *self.weights).tolist()]


# --------------------------------------------------------------------------------------------
# evaluation: calibration of the stated confidence
# --------------------------------------------------------------------------------------------
def verbalized_calibration(samples: list[dict], parse: Callable[[str], Verbalized] = parse_dcpo_confidence,
                           n_bins: int = 10) -> dict[str, float]:
    """ECE, Brier and AUROC of the *stated* confidence, from ``evaluate()``'s per-sample records.

    Only graded samples that state a confidence count; ``verbal_stated_frac`` says how many did, so
    a model that rarely states one cannot look calibrated by omission.
    """
    from .. import calibration as cal

    graded = [r for r in samples if r.get("grade") is not None]
    stated = [(parse(r["completion"]).confidence, r["grade"]) for r in graded]
    pairs = [(c, g) for c, g in stated if c is not None]
    out = {"verbal_n": len(pairs), "verbal_stated_frac": len(pairs) / len(graded) if graded else float("nan")}
    if not pairs:
        return {**out, "verbal_auroc": float("nan"), "verbal_ece": float("nan"), "verbal_brier": float("nan"),
                "verbal_mean_confidence": float("nan")}
    conf = np.array([c for c, _ in pairs], dtype=float)
    correct = np.array([g for _, g in pairs], dtype=float)
    return {**out, "verbal_auroc": cal.auroc(conf, correct), "verbal_ece": cal.ece(conf, correct, n_bins=n_bins),
            "verbal_brier": cal.brier(conf, correct), "verbal_mean_confidence": float(conf.mean())}
