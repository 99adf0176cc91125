"""`CAPOConfig`: GRPOConfig plus the fields of Calibration-Aware Policy Optimization."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .advantages import ESTIMATORS, NORMALIZATIONS, SCALES, SURROGATES
from .baselines import BaselineConfig  # GRPOConfig + the comparison methods' fields; registers their estimators

TAU_MODES = ("absolute", "relative")
THRESHOLD_MODES = ("fixed", "auto")


@dataclass
class CAPOConfig(BaselineConfig):
    r"""Configuration for [`CAPOTrainer`]: every [`trl.GRPOConfig`] field plus the CAPO fields below.

    Migration from TRL is `s/GRPOConfig/CAPOConfig/`. With `advantage_estimator="grpo"` (and the
    default `noise_mask=None`) training is exactly GRPOTrainer's, with calibration metrics logged.

    Parameters:
        advantage_estimator (`str`, defaults to `"capo"`):
            `"capo"`: the pairwise, perplexity-aware advantage. `"grpo"`: TRL's own advantages, untouched.
            The methods CAPO is compared with (`"dr_grpo"`, `"codapo"`, `"cde"`, `"c2gspg"`, `"simko"`,
            `"rlcr"`, `"dcpo"`) and their fields are in `capo_trl.baselines` (docs/baselines.md).
        tau (`float`, defaults to `0.6`):
            Temperature of the logistic AUC surrogate, in nats of mean token log-prob. The paper uses
            0.6 (1.5B) / 0.5 (7B). It must match the spread of the scores within a group: much larger
            than that spread and CAPO degenerates into a rescaled Dr. GRPO.
        advantage_normalization (`str`, defaults to `"group"`):
            Divide each group's CAPO advantages by the group size (`"group"`), by the number of
            (better, worse) pairs (`"pairs"`), or not at all (`"none"`).
        surrogate (`str`, defaults to `"logistic"`):
            `"logistic"` (CAPO) or `"linear"` (`phi(t) = -t`: reproduces Dr. GRPO's `R - mean(R)`, an ablation).
        noise_mask (`bool` or `None`, defaults to `None`):
            Drop correct completions the reference model finds implausible and wrong ones it finds
            near-certain. `None` means on for `"capo"` and off for `"grpo"` (so `"grpo"` stays a
            drop-in); `True` with `"grpo"` is the paper's "GRPO + mask" ablation.
        ref_high (`float`, defaults to `2.5`):
            A correct completion is kept only if its reference perplexity is <= `ref_high`.
        ref_low (`float`, defaults to `1.05`):
            A wrong completion is kept only if its reference perplexity is >= `ref_low`.
        correct_threshold (`float`, defaults to `0.5`):
            A completion counts as correct (for the mask and the calibration metrics) when its total
            reward is >= this value.
        tau_mode (`str`, defaults to `"absolute"`):
            `"absolute"`: `tau` is in nats (the paper). `"relative"`: the effective temperature is
            `tau` times the pooled within-group standard deviation of the scores over the mixed
            groups of the batch, so one value fits models whose score spreads differ by 10x.
        advantage_scale (`str`, defaults to `"paper"`):
            `"paper"` keeps the `1/tau` factor of the derivative (advantages grow as `tau` shrinks);
            `"bounded"` multiplies by `2 tau` and divides by the reward std TRL's `scale_rewards` uses,
            so each pair weighs `2 sigma(.)` in (0, 2) and, as `tau` grows, the advantage becomes
            exactly GRPOTrainer's (`scale_rewards="group"`) or Dr. GRPO's (`"none"`). `"matched"`
            rescales each group to GRPO's total |advantage|: CAPO then only redistributes GRPO's
            credit towards mis-ranked pairs, at GRPO's step size, whatever `tau`.
        ref_thresholds (`str`, defaults to `"fixed"`):
            `"fixed"`: use `ref_high` / `ref_low`. `"auto"`: measure them with the paper's quartile rule
            (upper quartile of the reference PPL on correct answers, lower quartile on wrong ones) on
            the first `ref_calibration_steps` generation batches, which the initial policy (= the
            reference) sampled; the mask is off while measuring.
        ref_calibration_steps (`int`, defaults to `1`):
            Generation batches used by `ref_thresholds="auto"`.
        ref_cache_size (`int`, defaults to `65536`):
            Number of reference scores kept in an LRU cache keyed on prompt+completion token ids, so a
            completion seen again costs no reference forward. `0` disables the cache.
    """

    advantage_estimator: str = field(
        default="capo",
        metadata={"help": "Advantage estimator: 'capo' (pairwise perplexity-aware) or 'grpo' (TRL's, untouched).",
                  "choices": sorted(ESTIMATORS)},
    )
    tau: float = field(
        default=0.6,
        metadata={"help": "Temperature of the logistic AUC surrogate (> 0), in nats of mean token log-prob. "
                  "Should match the within-group spread of the scores; paper: 0.6 (1.5B), 0.5 (7B)."},
    )
    advantage_normalization: str = field(
        default="group",
        metadata={"help": "Divide CAPO advantages by the group size ('group'), the number of pairs ('pairs') or "
                  "nothing ('none').", "choices": list(NORMALIZATIONS)},
    )
    surrogate: str = field(
        default="logistic",
        metadata={"help": "Pairwise surrogate: 'logistic' (CAPO) or 'linear' (equals Dr. GRPO; ablation).",
                  "choices": list(SURROGATES)},
    )
    noise_mask: bool | None = field(
        default=None,
        metadata={"help": "Reference-perplexity noise mask. Default (None): on for 'capo', off for 'grpo'."},
    )
    ref_high: float = field(
        default=2.5,
        metadata={"help": "Keep a correct completion only if its reference perplexity is <= ref_high."},
    )
    ref_low: float = field(
        default=1.05,
        metadata={"help": "Keep a wrong completion only if its reference perplexity is >= ref_low."},
    )
    correct_threshold: float = field(
        default=0.5,
        metadata={"help": "A completion is correct when its total reward is >= this value."},
    )
    tau_mode: str = field(
        default="absolute",
        metadata={"help": "'absolute' (tau in nats, the paper) or 'relative' (tau times the within-group std "
                  "of the scores over mixed groups of the batch).", "choices": list(TAU_MODES)},
    )
    advantage_scale: str = field(
        default="paper",
        metadata={"help": "'paper' (keeps the 1/tau factor) or 'bounded' (times 2*tau, divided by the "
                  "scale_rewards std: pair weights in (0, 2), GRPO's advantage as tau grows) or 'matched' (each group "
                  "rescaled to GRPO's total |advantage|).", "choices": list(SCALES)},
    )
    ref_thresholds: str = field(
        default="fixed",
        metadata={"help": "'fixed' (ref_high/ref_low as given) or 'auto' (quartile rule measured on the first "
                  "ref_calibration_steps generation batches).", "choices": list(THRESHOLD_MODES)},
    )
    ref_calibration_steps: int = field(
        default=1,
        metadata={"help": "Generation batches used to measure the mask thresholds when ref_thresholds='auto'."},
    )
    ref_cache_size: int = field(
        default=65536,
        metadata={"help": "Entries of the LRU cache of reference scores (0 disables it)."},
    )

    def __post_init__(self):
        self._validate_capo_fields()
        if self.noise_mask is None:
            self.noise_mask = self.advantage_estimator == "capo"
        super().__post_init__()

    def _validate_capo_fields(self) -> None:
        def bad(name, allowed):
            return ValueError(f"CAPOConfig.{name}={getattr(self, name)!r} is invalid; {allowed}.")

        if self.advantage_estimator not in ESTIMATORS:
            raise bad("advantage_estimator", f"choose one of {sorted(ESTIMATORS)}")
        if self.advantage_normalization not in NORMALIZATIONS:
            raise bad("advantage_normalization", f"choose one of {NORMALIZATIONS}")
        if self.surrogate not in SURROGATES:
            raise bad("surrogate", f"choose one of {SURROGATES}")
        if self.tau_mode not in TAU_MODES:
            raise bad("tau_mode", f"choose one of {TAU_MODES}")
        if self.advantage_scale not in SCALES:
            raise bad("advantage_scale", f"choose one of {SCALES}")
        if self.ref_thresholds not in THRESHOLD_MODES:
            raise bad("ref_thresholds", f"choose one of {THRESHOLD_MODES}")
        steps = self.ref_calibration_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise bad("ref_calibration_steps", "it must be an integer >= 1")
        for name in ("tau", "ref_high", "ref_low"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise bad(name, "it must be a finite number > 0")
        if self.ref_low < 1.0 or self.ref_high < 1.0:
            raise ValueError(
                f"CAPOConfig.ref_high={self.ref_high} / ref_low={self.ref_low} are perplexities, which are >= 1; "
                "values below 1 would drop every wrong completion or keep no correct one."
            )
        if not isinstance(self.correct_threshold, (int, float)) or not math.isfinite(self.correct_threshold):
            raise bad("correct_threshold", "it must be a finite number")
        if self.noise_mask not in (None, True, False):
            raise bad("noise_mask", "use true, false, or leave it unset")
        mask_on = self.noise_mask if self.noise_mask is not None else self.advantage_estimator == "capo"
        if mask_on and getattr(self, "sync_ref_model", False):
            raise ValueError(
                "CAPOConfig.sync_ref_model=True moves the reference model during training, but the noise mask "
                "judges completions against the *initial* policy. Set sync_ref_model=False, or noise_mask=False."
            )
        if self.max_steps == 0 or (self.max_steps < 0 and self.num_train_epochs <= 0):
            raise ValueError(
                f"CAPOConfig.max_steps={self.max_steps} with num_train_epochs={self.num_train_epochs} trains nothing; "
                "give max_steps > 0, or max_steps=-1 with num_train_epochs > 0."
            )
        if not isinstance(self.ref_cache_size, int) or isinstance(self.ref_cache_size, bool) or self.ref_cache_size < 0:
            raise bad("ref_cache_size", "it must be an integer >= 0 (0 disables the cache)")
