"""Helpers of the comparison methods in ``capo_trl.baselines`` (kept apart to stay under ~400 lines)."""

from .verbalized import (
    DCPO_INSTRUCTION,
    RLCR_INSTRUCTION,
    AnswerTagReward,
    RLCRReward,
    Verbalized,
    parse_dcpo_confidence,
    parse_rlcr,
    verbalized_calibration,
    verbalized_inputs,
)

__all__ = ["DCPO_INSTRUCTION", "RLCR_INSTRUCTION", "AnswerTagReward", "RLCRReward", "Verbalized",
           "parse_dcpo_confidence", "parse_rlcr", "verbalized_calibration", "verbalized_inputs"]
