"""Dr. GRPO (Liu et al. 2025): ``R - mean(R)``, no division by the reward std."""

from __future__ import annotations

from ..advantages import grpo_advantages
from .base import AdvantageInputs, Method


class DrGRPO(Method):
    """TRL's advantage with ``scale_rewards="none"``, whatever ``scale_rewards`` says (pair it with
    ``loss_type="dr_grpo"``, as the ``dr_grpo`` preset does)."""

    name = "dr_grpo"

    def advantages(self, batch: AdvantageInputs):
        return grpo_advantages(batch.rewards, batch.num_generations, "none"), {}
