"""capo-trl: Calibration-Aware Policy Optimization for TRL."""

from .advantages import capo_advantages, grpo_advantages, noise_mask
from .evaluation.callbacks import CalibrationCallback
from .training.config import CAPOConfig
from .methods import Method, register_method
from .training.trainer import CAPOTrainer

__version__ = "0.1.0.dev0"

__all__ = ["CAPOConfig", "CAPOTrainer", "CalibrationCallback", "Method", "register_method", "capo_advantages",
           "grpo_advantages", "noise_mask", "__version__"]
