"""capo-trl: Calibration-Aware Policy Optimization for TRL."""

from . import baselines  # noqa: F401  (registers the comparison methods' estimators)
from .advantages import capo_advantages, grpo_advantages, noise_mask
from .config import CAPOConfig
from .trainer import CAPOTrainer

__version__ = "0.1.0.dev0"

__all__ = ["CAPOConfig", "CAPOTrainer", "capo_advantages", "grpo_advantages", "noise_mask", "__version__"]
