"""GRPO: TRL's own advantages, untouched (``advantage_estimator="grpo"`` trains exactly like GRPOTrainer)."""

from __future__ import annotations

from .base import AdvantageInputs, Method


class GRPO(Method):
    """GRPOTrainer's advantages as they are; capo-trl only adds the ``capo/*`` calibration metrics."""

    name = "grpo"
    honours_aggregation = True  # its advantages are (built on) TRL\'s

    def advantages(self, batch: AdvantageInputs):
        return batch.trl_advantages, {}
