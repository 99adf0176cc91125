"""Verbalised confidence (RLCR, DCPO): the two methods, parsing, token spans, reward functions, evaluation.

Pure string/list work and the methods' math; the TRL reward functions for these formats
(``AnswerTagReward``, ``RLCRReward``) are in :mod:`capo_trl.rewards`.
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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..advantages import correctness, group_nanmean, grpo_advantages
from .base import AdvantageInputs, Method, Verbalized, check_fields, help_text

DCPO_ERRORS = ("abs", "sq")

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


# --------------------------------------------------------------------------------------------
# the methods
# --------------------------------------------------------------------------------------------
def rlcr_rewards(correct: torch.Tensor, confidence: torch.Tensor, format_ok: torch.Tensor,
                 format_weight: float = 0.5, accuracy_weight: float = 0.5, brier_weight: float = 0.5) -> torch.Tensor:
    """RLCR's released reward ``w_f + w_a c + w_b (1 - (c - q)^2)``, all 0 if the format fails.

    Weights ``(0, 1, 1)`` give the paper's ``c - (q - c)^2`` up to a constant. NaN correctness stays NaN.
    """
    c = correct.float()
    ok = format_ok.to(c.device).bool() & torch.isfinite(confidence.to(c.device))
    q = torch.nan_to_num(confidence.to(c.device).float(), nan=0.0)
    reward = format_weight + accuracy_weight * c + brier_weight * (1.0 - (c - q) ** 2)
    return torch.where(ok, reward, torch.where(torch.isnan(c), c, torch.zeros_like(c)))


def dcpo_calibration_rewards(correct: torch.Tensor, confidence: torch.Tensor, num_generations: int,
                             lam: float = 0.5, error: str = "abs") -> torch.Tensor:
    """DCPO's confidence reward ``R_c = -err(conf, R_IG)``, ``R_IG = lam mean_group(R) + (1 - lam) R``.

    ``error="abs"`` is the paper's ``|conf - R_IG|``; ``"sq"`` the released code's squared error. A
    missing confidence is -1, as in the released code (so it is always far from any target).
    """
    if error not in DCPO_ERRORS:
        raise ValueError(f"error={error!r}; expected one of {DCPO_ERRORS}.")
    c = correct.float()
    target = lam * group_nanmean(c, num_generations) + (1.0 - lam) * c
    conf = torch.nan_to_num(confidence.to(c.device).float(), nan=-1.0)
    gap = conf - target
    return -(gap.abs() if error == "abs" else gap**2)


def dcpo_token_advantages(reasoning: torch.Tensor, confidence: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """``(N, T)``: the confidence advantage on the confidence block's tokens, the reasoning one elsewhere."""
    span = span.to(reasoning.device).bool()
    return torch.where(span, confidence.unsqueeze(1), reasoning.unsqueeze(1)).float()


def _verbal_metrics(prefix: str, confidence: torch.Tensor, format_ok: torch.Tensor) -> dict[str, float]:
    parsed = torch.isfinite(confidence)
    return {f"{prefix}/format_rate": format_ok.float().mean().item(),
            f"{prefix}/confidence_mean": confidence[parsed].mean().item() if parsed.any() else float("nan")}


@dataclass
class RLCRArgs:
    """RLCR's fields of :class:`~capo_trl.CAPOConfig`."""

    rlcr_format_weight: float = field(default=0.5, metadata=help_text("RLCR: weight of the format reward."))
    rlcr_accuracy_weight: float = field(default=0.5, metadata=help_text("RLCR: weight of the accuracy reward."))
    rlcr_brier_weight: float = field(default=0.5, metadata=help_text("RLCR: weight of 1 - (correct - q)^2."))


class RLCR(Method):
    """GRPO on RLCR's reward, built from correctness (the reward functions) and the stated confidence."""

    name = "rlcr"
    Args = RLCRArgs
    parse_confidence = staticmethod(parse_rlcr)

    @classmethod
    def validate(cls, args: RLCRArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, nonneg=("rlcr_format_weight", "rlcr_accuracy_weight", "rlcr_brier_weight"))

    def advantages(self, batch: AdvantageInputs):
        a = self.args
        reward = rlcr_rewards(correctness(batch.rewards, self.config.correct_threshold), batch.confidence,
                              batch.format_ok, a.rlcr_format_weight, a.rlcr_accuracy_weight, a.rlcr_brier_weight)
        adv = grpo_advantages(reward, batch.num_generations, batch.scale_rewards)
        return adv, {"rlcr/reward_mean": torch.nanmean(reward).item(),
                     **_verbal_metrics("rlcr", batch.confidence, batch.format_ok)}


@dataclass
class DCPOArgs:
    """DCPO's fields of :class:`~capo_trl.CAPOConfig`."""

    dcpo_lambda: float = field(default=0.5, metadata=help_text(
        "DCPO: R_IG = lambda * group accuracy + (1 - lambda) * own correctness."))
    dcpo_error: str = field(default="abs", metadata=help_text(
        "DCPO: confidence error, 'abs' (paper) or 'sq' (released code).", choices=list(DCPO_ERRORS)))


class DCPO(Method):
    """Reasoning tokens: GRPO advantage of correctness; confidence block: group-normalised ``R_c``."""

    name = "dcpo"
    Args = DCPOArgs
    parse_confidence = staticmethod(parse_dcpo_confidence)

    @classmethod
    def validate(cls, args: DCPOArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, unit=("dcpo_lambda",))
        if args.dcpo_error not in DCPO_ERRORS:
            raise ValueError(f"{prefix}dcpo_error={args.dcpo_error!r} is invalid; choose one of {DCPO_ERRORS} "
                             "('abs' = paper, 'sq' = released code).")

    def advantages(self, batch: AdvantageInputs):
        correct = correctness(batch.rewards, self.config.correct_threshold)
        scale = batch.scale_rewards
        reasoning = grpo_advantages(correct, batch.num_generations, scale)
        r_c = dcpo_calibration_rewards(correct, batch.confidence, batch.num_generations, self.args.dcpo_lambda,
                                       self.args.dcpo_error)
        confidence = grpo_advantages(r_c, batch.num_generations, scale)
        adv = dcpo_token_advantages(reasoning, confidence, batch.confidence_mask)
        return adv, {"dcpo/calibration_reward": torch.nanmean(r_c).item(),
                     **_verbal_metrics("dcpo", batch.confidence, batch.format_ok)}


# --------------------------------------------------------------------------------------------
# evaluation: calibration of the stated confidence
# --------------------------------------------------------------------------------------------
def verbalized_calibration(samples: list[dict], parse: Callable[[str], Verbalized] = parse_dcpo_confidence,
                           n_bins: int = 10) -> dict[str, float]:
    """ECE, Brier and AUROC of the *stated* confidence, from ``evaluate()``'s per-sample records.

    Only graded samples that state a confidence count; ``verbal_stated_frac`` says how many did, so
    a model that rarely states one cannot look calibrated by omission.
    """
    from ..evaluation import calibration as cal

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
