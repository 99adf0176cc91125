"""Combinations of `CAPOConfig`'s fields that contradict each other (refused) or do nothing (warned once).

Why: a value that cannot take effect trains something other than what its user believes, silently. A
combination that can never work (a mask that keeps no correct answer) is a ValueError at construction,
naming the fields and the fix. A field that has no effect where it is set (a CAPO setting under
``advantage_estimator="grpo"``, a mask threshold with the mask off) may be meant (a recipe kept identical to
its twin but for the method, thresholds written for later), so it is a warning, once per process (Python's
default filter shows a given message once), naming the fields and what would make them count.

"Set" means different from the field's dataclass default: a field left at (or set to) its default is never
reported. ``docs/config.md`` ("Combinations refused or warned") lists every rule.
"""

from __future__ import annotations

import warnings
from dataclasses import MISSING, fields

from ..methods import BUILTIN
from ..methods.capo import CAPOArgs

# The noise mask's own fields: none has an effect with the mask off.
MASK_FIELDS = ("ref_high", "ref_low", "noise_mask_side", "ref_thresholds", "noise_mask_normalizer",
               "ref_calibration_steps", "ref_cache_size", "ref_scoring", "noise_mask_guard")
# TRL fields read only under a condition (docs/training.md, "TRL's GRPOConfig fields under CAPOTrainer").
_SAPO = (lambda c: c.loss_type == "sapo", "loss_type='sapo'")
_VESPO = (lambda c: c.loss_type == "vespo", "loss_type='vespo'")
_SYNC = (lambda c: bool(c.sync_ref_model), "sync_ref_model=True")
_IS = (lambda c: bool(c.use_vllm and c.vllm_importance_sampling_correction),
       "use_vllm=True with vllm_importance_sampling_correction=True")
TRL_CONDITIONAL = {"sapo_temperature_neg": _SAPO, "sapo_temperature_pos": _SAPO, "vespo_k_pos": _VESPO,
                   "vespo_lambda_pos": _VESPO, "vespo_k_neg": _VESPO, "vespo_lambda_neg": _VESPO,
                   "ref_model_mixup_alpha": _SYNC, "ref_model_sync_steps": _SYNC,
                   "vllm_importance_sampling_mode": _IS, "vllm_importance_sampling_clip_max": _IS,
                   "vllm_importance_sampling_clip_min": _IS}


def set_fields(config, names) -> list[str]:
    """The fields of ``names`` whose value differs from their dataclass default (in ``names``' order)."""
    declared = {f.name: f for f in fields(config)}
    out = []
    for name in names:
        f = declared.get(name)
        if f is None:
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)
        if default is MISSING or getattr(config, name) != default:
            out.append(name)
    return out


def _listed(config, names: list[str]) -> str:
    return ", ".join(f"{name}={getattr(config, name)!r}" for name in names)


def _inert(config, names: list[str], why: str, fix: str) -> str:
    one = len(names) == 1
    return (f"CAPOConfig.{_listed(config, names)} {'has' if one else 'have'} no effect {why}; "
            f"{fix.format(it='it' if one else 'them')}.")


def overlap_warning(ref_high: float, ref_low: float, source: str) -> str:
    """Why thresholds with ``ref_low > ref_high`` deserve a look before training with them."""
    return (f"noise mask thresholds from {source} overlap: ref_low={ref_low:.4g} > ref_high={ref_high:.4g}. Every kept "
            "correct answer then has a lower reference perplexity than every kept wrong one, so the mask keeps only "
            "what the reference already ranks perfectly (a well calibrated reference gives this under the quartile "
            "rule). Check the thresholds (`capo-trl calibrate-mask` on more prompts), mask one side only "
            "(noise_mask_side), or set noise_mask=False.")


# ------------------------------------------------------------------------------------ refused
def refuse_contradictions(config, mask_on: bool) -> None:
    """ValueError for a combination that can never do what it says (the method's own: its ``check``)."""
    correct_side = config.noise_mask_side in ("both", "correct")
    if mask_on and config.ref_thresholds == "fixed" and correct_side and config.ref_high <= 1.0:
        raise ValueError(
            f"CAPOConfig.ref_high={config.ref_high} keeps no correct completion: the mask keeps one only if its "
            "reference perplexity is <= ref_high, and a perplexity is 1 only for a completion the reference predicts "
            "with certainty. Give ref_high > 1 (the paper's 2.5; `capo-trl calibrate-mask` measures yours), "
            "ref_thresholds='auto', noise_mask_side='wrong', or noise_mask=False.")


# ------------------------------------------------------------------------------------ warned
def ineffective(config, method, mask_on: bool) -> list[str]:
    """One message per group of set fields that have no effect in this configuration (empty: none)."""
    out = []
    if method in BUILTIN:  # a method of your own may read any field: nothing is known to be unused
        reads = {f.name for f in fields(method.Args)} if method.Args is not None else set()
        for other in BUILTIN:
            if other.Args is None or other is method:
                continue
            unused = set_fields(config, [f.name for f in fields(other.Args) if f.name not in reads])
            if unused:
                out.append(_inert(config, unused, f"under advantage_estimator={config.advantage_estimator!r} "
                                  f"({other.name}'s setting{'' if len(unused) == 1 else 's'})",
                                  f"remove {{it}}, or choose advantage_estimator={other.name!r}"))
    if isinstance(method.Args, type) and issubclass(method.Args, CAPOArgs):
        out += _capo_ineffective(config)
    out += _mask_ineffective(config, mask_on)
    for name in set_fields(config, [n for n in TRL_CONDITIONAL if hasattr(config, n)]):
        reads, needs = TRL_CONDITIONAL[name]
        if not reads(config):
            out.append(_inert(config, [name], f"without {needs} (TRL reads it only then)", "remove {it}"))
    if config.share_prompt_prefill and config.use_vllm:
        out.append(_inert(config, ["share_prompt_prefill"], "with use_vllm=True (it shares transformers' "
                          "generation cache; vLLM has its own prefix caching)", "remove {it}"))
    return out


def _capo_ineffective(config) -> list[str]:
    out = []
    if config.surrogate == "linear":  # phi(t) = -t: every pair weighs its reward gap, whatever the scores
        unused = set_fields(config, ["tau", "tau_mode", "truncated_pairs", "score_span"])
        if unused:
            out.append(_inert(config, unused, "with surrogate='linear' (its pairs weigh the reward gap alone: no "
                              "temperature, no score)", "remove {it}, or use surrogate='logistic'"))
    if config.advantage_scale == "matched" and set_fields(config, ["advantage_normalization"]):
        out.append(_inert(config, ["advantage_normalization"], "with advantage_scale='matched' (each group is "
                          "rescaled to GRPO's total |advantage|, which undoes any per-group normalisation)",
                          "remove {it}, or use advantage_scale='paper' or 'bounded'"))
    return out


def _mask_ineffective(config, mask_on: bool) -> list[str]:
    if not mask_on:
        unused = set_fields(config, MASK_FIELDS)
        return [_inert(config, unused, f"with the noise mask off (noise_mask=False; advantage_estimator="
                       f"{config.advantage_estimator!r})", "set noise_mask=True to use {it}, or remove {it}")] \
            if unused else []
    out = []
    unused = set_fields(config, ["ref_high", "ref_low"] if config.ref_thresholds == "auto" else
                        ["ref_calibration_steps"])
    unused = [n for n in unused if (n != "ref_high" or config.noise_mask_side != "wrong")
              and (n != "ref_low" or config.noise_mask_side != "correct")]  # reported below, once
    if unused and config.ref_thresholds == "auto":
        out.append(_inert(config, unused, "with ref_thresholds='auto' (the thresholds are measured on the first "
                          "ref_calibration_steps batches)", "remove {it}, or use ref_thresholds='fixed'"))
    elif unused:
        out.append(_inert(config, unused, "with ref_thresholds='fixed' (nothing is measured)",
                          "remove {it}, or use ref_thresholds='auto'"))
    for side, threshold in (("wrong", "ref_high"), ("correct", "ref_low")):
        if config.noise_mask_side == side and set_fields(config, [threshold]):
            out.append(_inert(config, [threshold], f"with noise_mask_side={side!r} (the mask tests only {side} "
                              "answers)",
                              "remove {it}, or use noise_mask_side='both'"))
    if config.beta != 0.0:  # the mask reads TRL's reference log-probs: no forward of its own to choose or cache
        unused = set_fields(config, ["ref_scoring", "ref_cache_size"])
        if unused:
            out.append(_inert(config, unused, f"with beta={config.beta} (the mask reads the reference log-probs "
                              "TRL computes for its KL term)", "remove {it}, or use beta=0"))
    if (config.ref_thresholds == "fixed" and config.noise_mask_side == "both"
            and config.ref_low > config.ref_high):
        out.append(overlap_warning(config.ref_high, config.ref_low, "ref_high/ref_low as given"))
    return out


def warn_ineffective(config, method, mask_on: bool) -> None:
    """Each message of :func:`ineffective` as a UserWarning (shown once per process by Python's default filter)."""
    for message in ineffective(config, method, mask_on):
        warnings.warn(message, UserWarning, stacklevel=2)


__all__ = ["MASK_FIELDS", "TRL_CONDITIONAL", "ineffective", "overlap_warning", "refuse_contradictions", "set_fields",
           "warn_ineffective"]
