"""Methods: one module each, registered here explicitly (importing a module registers nothing).

``CAPOConfig.advantage_estimator`` names a method of :data:`METHODS`, one added with
:func:`register_method`, or one defined anywhere as ``"package.module:ClassName"``.
"""

from __future__ import annotations

import importlib
import os
import sys

from ..errors import did_you_mean
from .base import AdvantageInputs, Method, MethodState, Rollout
from .c2gspg import C2GSPG
from .capo import CAPO
from .cde import CDE
from .codapo import CoDaPO
from .dr_grpo import DrGRPO
from .grpo import GRPO
from .scapo import SCAPO
from .simko import SimKO
from .verbalized import DCPO, RLCR

BUILTIN: tuple[type[Method], ...] = (GRPO, CAPO, DrGRPO, CoDaPO, CDE, C2GSPG, SimKO, RLCR, DCPO, SCAPO)
METHODS: dict[str, type[Method]] = {m.name: m for m in BUILTIN}


def register_method(method: type[Method], name: str | None = None) -> type[Method]:
    """Make ``method`` selectable by ``name`` (default: its ``name``); refuses to replace one."""
    if not (isinstance(method, type) and issubclass(method, Method)):
        raise TypeError(f"register_method expects a Method subclass, got {method!r}.")
    key = name or method.name
    if not key:
        raise ValueError(f"{method.__name__} has no name: set the class attribute `name`.")
    if key in METHODS and METHODS[key] is not method:
        raise ValueError(f"a method named {key!r} is already registered ({METHODS[key].__qualname__}).")
    METHODS[key] = method
    return method


def resolve_method(spec: str) -> type[Method]:
    """The Method class for a registered name or a ``package.module:ClassName`` path."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"CAPOConfig.advantage_estimator={spec!r} is invalid; give a method name.")
    if spec in METHODS:
        return METHODS[spec]
    if ":" not in spec:
        guess = did_you_mean(spec, sorted(METHODS))
        raise ValueError(f"CAPOConfig.advantage_estimator={spec!r} is invalid; {guess + ' ' if guess else ''}choose "
                         f"one of {sorted(METHODS)}, or give your own Method subclass as 'package.module:ClassName'.")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a module next to the recipe imports without installing it
    try:
        method = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"CAPOConfig.advantage_estimator={spec!r}: cannot load it ({type(err).__name__}: {err}).") \
            from err
    if not (isinstance(method, type) and issubclass(method, Method)):
        raise ValueError(f"CAPOConfig.advantage_estimator={spec!r} is a {type(method).__name__}, not a subclass of "
                         "capo_trl.methods.Method.")
    return method


__all__ = ["AdvantageInputs", "Method", "MethodState", "Rollout", "METHODS", "BUILTIN", "register_method", "resolve_method",
           "GRPO", "CAPO", "DrGRPO", "CoDaPO", "CDE", "C2GSPG", "SimKO", "RLCR", "DCPO", "SCAPO"]
