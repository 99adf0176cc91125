"""CAPO (Wang et al., ACL 2026): the pairwise, perplexity-aware advantage of ``advantages.capo_advantages``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..advantages import (
    NORMALIZATIONS,
    SCALES,
    SURROGATES,
    capo_advantages,
    match_group_l1,
    reward_scale,
    within_group_std,
)
from .base import AdvantageInputs, Method, check_fields, help_text

TAU_MODES = ("absolute", "relative")
TRUNCATED_PAIRS = ("ranked", "tied")
SCORE_SPANS = ("completion", "answer")


@dataclass
class CAPOArgs:
    """CAPO's fields of :class:`~capo_trl.CAPOConfig` (documented there)."""

    tau: float = field(default=0.6, metadata=help_text(
        "Temperature of the logistic AUC surrogate (> 0), in nats of mean token log-prob. Should match the "
        "within-group spread of the scores; paper: 0.6 (1.5B), 0.5 (7B)."))
    advantage_normalization: str = field(default="group", metadata=help_text(
        "Divide CAPO advantages by the group size ('group'), the number of pairs ('pairs') or nothing ('none').",
        choices=list(NORMALIZATIONS)))
    surrogate: str = field(default="logistic", metadata=help_text(
        "Pairwise surrogate: 'logistic' (CAPO) or 'linear' (equals Dr. GRPO; ablation).", choices=list(SURROGATES)))
    tau_mode: str = field(default="absolute", metadata=help_text(
        "'absolute' (tau in nats, the paper) or 'relative' (tau times the within-group std of the scores over "
        "mixed groups of the batch).", choices=list(TAU_MODES)))
    advantage_scale: str = field(default="paper", metadata=help_text(
        "'paper' (keeps the 1/tau factor) or 'bounded' (times 2*tau, divided by the scale_rewards std: pair "
        "weights in (0, 2), GRPO's advantage as tau grows) or 'matched' (each group rescaled to GRPO's total "
        "|advantage|).", choices=list(SCALES)))
    truncated_pairs: str = field(default="ranked", metadata=help_text(
        "How a completion cut at max_completion_length (no EOS) enters CAPO's pairs: 'ranked' (by its score, like "
        "any other: an unconfident truncated wrong answer gets almost no advantage) or 'tied' (its pairs weigh as "
        "if the two scores were equal: credited by its reward alone, as GRPO credits it).",
        choices=list(TRUNCATED_PAIRS)))
    score_span: str = field(default="completion", metadata=help_text(
        "Which tokens the score s averages: 'completion' (every generated token: the paper's) or 'answer' (only "
        "the final answer's own tokens, where the reward function reads it: its answer_spans; a completion with "
        "no answer is credited by its reward alone, as with truncated_pairs='tied').", choices=list(SCORE_SPANS)))


class CAPO(Method):
    """CAPO with the config's tau mode and scale; logs the temperature actually used."""

    name = "capo"
    Args = CAPOArgs
    default_noise_mask = True

    @classmethod
    def validate(cls, args: CAPOArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, positive=("tau",), choices={
            "advantage_normalization": NORMALIZATIONS, "surrogate": SURROGATES, "tau_mode": TAU_MODES,
            "advantage_scale": SCALES, "truncated_pairs": TRUNCATED_PAIRS, "score_span": SCORE_SPANS})

    def wants_answer_scores(self) -> bool:
        return self.args.score_span == "answer"

    def check(self, config) -> None:
        if self.args.tau_mode == "relative" and self.args.advantage_scale == "paper":
            raise ValueError(
                "CAPOConfig.tau_mode='relative' with advantage_scale='paper': the paper's 1/tau factor would divide by "
                "tau x the batch's score spread, so the step size would change with every batch and grow without "
                "bound as the spread shrinks; use advantage_scale='matched' (GRPO's step size per group; the "
                "embedded preset's) or 'bounded', or tau_mode='absolute' (the paper's tau in nats).")
        scale = getattr(config, "scale_rewards", "group")
        if self.args.advantage_scale == "paper" and scale != "group":
            raise ValueError(
                f"CAPOConfig.scale_rewards={scale!r} has no effect under advantage_scale='paper' (the paper's "
                "advantage divides by no reward std; TRL's default 'group' is accepted there and means nothing); use "
                "advantage_scale='bounded' (divides by the scale_rewards std) or 'matched' (GRPO's advantages, "
                "scale_rewards applied), or leave scale_rewards at 'group'.")

    def advantages(self, batch: AdvantageInputs):
        a = self.args
        scores, tied = self._ranked_scores(batch)
        tau = a.tau
        if a.tau_mode == "relative":
            spread = within_group_std(batch.rewards, scores, batch.num_generations).item()
            if math.isfinite(spread) and spread > 0:  # no mixed group means no pair: any tau gives zero
                tau = a.tau * spread
        adv = capo_advantages(batch.rewards, scores, batch.num_generations, tau, a.advantage_normalization,
                              a.surrogate, a.advantage_scale, tied)
        if a.advantage_scale == "bounded":  # on TRL's scale: equals GRPO's advantage as tau grows
            adv = adv / reward_scale(batch.rewards, batch.num_generations, batch.scale_rewards)
        elif a.advantage_scale == "matched":
            adv = match_group_l1(adv, batch.trl_advantages, batch.num_generations)
        return adv, {"capo/tau": tau}

    def _ranked_scores(self, batch: AdvantageInputs):
        """The scores CAPO ranks (``score_span``) and the rows whose pairs count as tied (a truncated completion
        under ``truncated_pairs='tied'``; a completion without an answer under ``score_span='answer'``)."""
        a = self.args
        tied = None
        if a.truncated_pairs == "tied":
            if batch.truncated is None:
                raise ValueError("CAPOConfig.truncated_pairs='tied' needs AdvantageInputs.truncated (which completions "
                                 "were cut at max_completion_length); the trainer fills it.")
            tied = batch.truncated
        if a.score_span == "completion":
            return batch.scores, tied
        if batch.answer_scores is None:
            raise ValueError("CAPOConfig.score_span='answer' needs AdvantageInputs.answer_scores (the mean token "
                             "log-prob of each answer's own tokens); the trainer fills it.")
        found = torch.isfinite(batch.answer_scores)
        tied = ~found if tied is None else tied | ~found
        return torch.where(found, batch.answer_scores, batch.scores), tied
