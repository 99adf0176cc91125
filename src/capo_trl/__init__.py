"""capo-trl: Calibration-Aware Policy Optimization for TRL."""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0.dev0"

# Public names are imported on first use (PEP 562): `capo-trl --help` and a one-line usage error must
# not load torch, transformers and TRL (seconds) just because the package was imported.
_LAZY = {
    "capo_advantages": ".advantages", "grpo_advantages": ".advantages", "noise_mask": ".advantages",
    "CalibrationCallback": ".evaluation.callbacks", "CAPOConfig": ".training.config", "Method": ".methods",
    "register_method": ".methods", "CAPOTrainer": ".training.trainer",
}

if TYPE_CHECKING:
    from .advantages import capo_advantages, grpo_advantages, noise_mask
    from .evaluation.callbacks import CalibrationCallback
    from .methods import Method, register_method
    from .training.config import CAPOConfig
    from .training.trainer import CAPOTrainer


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'capo_trl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["CAPOConfig", "CAPOTrainer", "CalibrationCallback", "Method", "register_method", "capo_advantages",
           "grpo_advantages", "noise_mask", "__version__"]
