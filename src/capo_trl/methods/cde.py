"""CDE (curiosity-driven exploration): a perplexity bonus on +-1 rewards, annealed by a staircase."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..advantages import correctness, grpo_advantages
from .base import AdvantageInputs, Method, check_fields, help_text


def cde_omega(step: int, omega: float, stair_steps: int, stairs: int) -> float:
    """Staircase annealing: ``omega`` drops by ``omega / stairs`` every ``stair_steps`` and is 0 after
    ``stairs * stair_steps`` steps (CDE: strong exploration early, none late)."""
    return omega * max(0.0, 1.0 - math.floor(step / stair_steps) / stairs)


def cde_rewards(correct: torch.Tensor, scores: torch.Tensor, omega_t: float, kappa: float,
                alpha: float) -> torch.Tensor:
    """``r~ = r + omega_t * min(|r| / kappa, alpha * B)`` with ``r = +-1`` and ``B = -s`` (log PPL).

    The cap ``|r| / kappa`` keeps the bonus from outweighing correctness; NaN rewards stay NaN, a
    completion without a score gets no bonus.
    """
    r = 2.0 * correct.float() - 1.0
    bonus = torch.minimum(r.abs() / kappa, alpha * -scores.to(r.device).float())
    return r + omega_t * torch.nan_to_num(bonus, nan=0.0, posinf=0.0, neginf=0.0)


@dataclass
class CDEArgs:
    """CDE's fields of :class:`~capo_trl.CAPOConfig`; defaults marked *ours* were not recoverable."""

    cde_omega: float = field(default=0.5, metadata=help_text("CDE: initial bonus coefficient omega (ours)."))
    cde_kappa: float = field(default=4.0, metadata=help_text("CDE: bonus cap |r|/kappa (ours; 4 keeps it < 1/4)."))
    cde_alpha: float = field(default=0.5, metadata=help_text("CDE: bonus slope alpha on log PPL (ours)."))
    cde_stair_steps: int = field(default=50, metadata=help_text(
        "CDE: optimizer steps per stair of the schedule (ours)."))
    cde_stairs: int = field(default=4, metadata=help_text("CDE: stairs until omega reaches 0 (ours)."))


class CDE(Method):
    """GRPO on ``+-1`` rewards plus the annealed perplexity bonus (the schedule reads the step: no state)."""

    name = "cde"
    Args = CDEArgs

    @classmethod
    def validate(cls, args: CDEArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, nonneg=("cde_omega",), positive=("cde_kappa", "cde_alpha"),
                     count=("cde_stair_steps", "cde_stairs"))

    def advantages(self, batch: AdvantageInputs):
        a = self.args
        correct = correctness(batch.rewards, self.config.correct_threshold)
        omega_t = cde_omega(batch.step, a.cde_omega, a.cde_stair_steps, a.cde_stairs)
        shaped = cde_rewards(correct, batch.scores, omega_t, a.cde_kappa, a.cde_alpha)
        adv = grpo_advantages(shaped, batch.num_generations, batch.scale_rewards)
        bonus = shaped - (2.0 * correct - 1.0)
        return adv, {"cde/omega": omega_t, "cde/bonus_mean": torch.nanmean(bonus).item() if bonus.numel() else 0.0}
