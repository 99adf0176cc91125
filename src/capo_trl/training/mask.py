"""The reference-perplexity noise mask as the trainer runs it: thresholds (fixed or measured), verdicts, warnings.

The formula is :func:`capo_trl.advantages.noise_mask`; this holds what it needs across steps (the
samples and thresholds of ``ref_thresholds="auto"``, which warnings were given), so that a
checkpoint can carry it.
"""

from __future__ import annotations

import math

import torch
from accelerate import PartialState
from accelerate.logging import get_logger

from ..advantages import noise_mask, quartile_thresholds
from .consistency import overlap_warning

# accelerate's logger: a warning is written by the main process only, not once per process
logger = get_logger(__name__)


class NoiseMask:
    """Per-run state of the mask; :meth:`__call__` gives the batch's keep mask, or None while measuring."""

    def __init__(self, config):
        self.config = config
        self.samples: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rewards, ref_ppl) of measurement batches
        self.measured: tuple[float, float] | None = None
        self.warned: set[str] = set()

    def thresholds(self, rewards: torch.Tensor, ref_ppl: torch.Tensor, training: bool) -> tuple[float, float] | None:
        """(ref_high, ref_low): as configured, or measured by the quartile rule on the first training batches."""
        cfg = self.config
        if cfg.ref_thresholds == "fixed":
            return cfg.ref_high, cfg.ref_low
        if self.measured is None and training:
            self.samples.append((rewards.cpu(), ref_ppl.cpu()))
            if len(self.samples) >= cfg.ref_calibration_steps:
                r, p = (torch.cat(t) for t in zip(*self.samples))
                high, low = quartile_thresholds(r, p, cfg.correct_threshold)
                if math.isfinite(high) and math.isfinite(low):
                    self.measured = (high, low)
                    self.samples.clear()
                    if low > high and cfg.noise_mask_side == "both":
                        self._warn_once("overlap", overlap_warning(high, low, "ref_thresholds='auto'"))
        if self.measured is None and len(self.samples) >= cfg.ref_calibration_steps:
            self._warn_once("unmeasured", (
                f"ref_thresholds='auto' measured no mask thresholds after {len(self.samples)} generation batch(es): "
                "the rollouts so far lack correct or wrong completions (their rewards never crossed "
                f"correct_threshold={cfg.correct_threshold}). The noise mask stays off until both appear; set "
                "ref_high/ref_low with ref_thresholds='fixed' to mask from the start."))
        return self.measured  # None: still measuring (or a class never appeared yet), no mask

    def __call__(self, rewards: torch.Tensor, ref_ppl: torch.Tensor,
                 training: bool) -> tuple[torch.Tensor | None, float]:
        """(keep mask of a global batch, True = stays in the loss; fraction of the batch the guard kept).
        The mask is None when there are no thresholds yet.

        With ``noise_mask_guard`` (the default), a class (correct or wrong answers) the thresholds would
        drop entirely is kept in this batch instead: a whole class vanishing is a threshold that does not
        fit the model, not label noise, and dropping it silently stops learning (every completion of a
        run with real-valued rewards >= ``correct_threshold`` counts as correct, for instance).
        """
        thresholds = self.thresholds(rewards, ref_ppl, training)
        if thresholds is None:
            return None, 0.0
        keep = noise_mask(rewards, ref_ppl, *thresholds, self.config.correct_threshold, self.config.noise_mask_side)
        correct = rewards >= self.config.correct_threshold
        wrong = rewards < self.config.correct_threshold
        guarded = 0.0
        for name, members, bound in self._sides(correct, wrong):
            if members.any() and not (keep & members).any():
                guard = self.config.noise_mask_guard
                if guard:
                    keep = keep | members
                    guarded += members.float().mean().item()
                ppl = ref_ppl[members & torch.isfinite(ref_ppl)]
                span = f"{ppl.min().item():.3g}..{ppl.max().item():.3g}" if ppl.numel() else "n/a"
                outcome = ("kept them in this batch (noise_mask_guard; counted in capo/mask_guard_kept)" if guard
                           else f"CAPO is now training without {name} answers")
                self._warn_once(name, (
                    f"CAPO noise mask would drop every {name} completion of this batch ({int(members.sum())} of "
                    f"them; their reference perplexity spans {span}, ref_high={thresholds[0]:.4g}, "
                    f"ref_low={thresholds[1]:.4g}): the thresholds do not fit this model, so the mask {outcome}. "
                    f"Measure thresholds for your model (`capo-trl calibrate-mask`, or ref_thresholds='auto'), set "
                    f"{bound} accordingly, or disable the mask with noise_mask=False."))
        return keep, guarded

    def unresolved(self, rewards: torch.Tensor, ref_ppl: torch.Tensor) -> torch.Tensor:
        """Rows without a reference score (NaN) on which the guard's decision depends.

        The guard fires when a class would be dropped entirely; if every *scored* member of a class
        is dropped, its unscored members decide that, so they must be scored. Otherwise none.
        """
        out = torch.zeros_like(rewards, dtype=torch.bool)
        thresholds = (self.config.ref_high, self.config.ref_low) if self.config.ref_thresholds == "fixed" else self.measured
        if not self.config.noise_mask_guard or thresholds is None:
            return out
        unscored = torch.isnan(ref_ppl)
        keep = noise_mask(rewards, ref_ppl, *thresholds, self.config.correct_threshold,
                          self.config.noise_mask_side) & ~unscored
        for _, members, _ in self._sides(rewards >= self.config.correct_threshold,
                                         rewards < self.config.correct_threshold):
            if (members & unscored).any() and not (keep & members).any():
                out |= members & unscored
        return out

    def _sides(self, correct: torch.Tensor, wrong: torch.Tensor) -> list[tuple[str, torch.Tensor, str]]:
        """(class, members, its threshold) of each class the mask may drop (``noise_mask_side``)."""
        side = self.config.noise_mask_side
        return [(name, members, bound) for name, members, bound in
                (("correct", correct, "ref_high"), ("wrong", wrong, "ref_low")) if side in ("both", name)]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            PartialState()  # the trainer's state (a bare NoiseMask gets a single-process one): needed to log
            logger.warning(message, main_process_only=True)

    def state_dict(self) -> dict:
        return {"measured_thresholds": self.measured, "threshold_samples": list(self.samples),
                "warned": sorted(self.warned)}

    def load_state_dict(self, state: dict) -> None:
        measured = state["measured_thresholds"]
        self.measured = tuple(measured) if measured is not None else None
        self.samples = [tuple(pair) for pair in state["threshold_samples"]]
        self.warned = set(state["warned"])
