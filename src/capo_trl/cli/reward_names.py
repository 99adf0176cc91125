"""Reward functions by name for ``capo-trl train`` (ours, then TRL's, then a dotted path), and the
dataset columns each one needs, checked before the model loads."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable

from ..data import benchmarks as data
from ..errors import UsageError, did_you_mean

# Reward functions known by short name (they win over TRL's); then trl.rewards' own names; else a dotted path.
REWARDS = {
    "math_accuracy": "capo_trl.rewards:math_accuracy_reward",
    "boxed_format": "capo_trl.rewards:boxed_format_reward",
    "guess_redraw": "capo_trl.rewards:redraw_reward",  # the guess-redraw task's training reward
}
# Reward functions that read the gold answer from the column `answer`, else `solution` (no required parameter).
_GOLD_READERS = ("math_accuracy_reward", "math_accuracy")


def trl_reward_names() -> list[str]:
    """What ``trl.rewards`` exports (functions and ``get_*`` factories), by short name."""
    import trl.rewards

    structure = getattr(trl.rewards, "_import_structure", None)
    if isinstance(structure, dict):
        return sorted(n for names in structure.values() for n in names)
    return sorted(n for n in getattr(trl.rewards, "__all__", []) if not n.endswith("_rewards"))


def resolve_reward(spec: str) -> Callable:
    """A reward function from a short name (ours in :data:`REWARDS` first, then ``trl.rewards``'), or a
    dotted path ('pkg.mod:func' or 'pkg.mod.func')."""
    target = REWARDS.get(spec) or REWARDS.get(spec.removesuffix("_reward")) or spec
    if ":" not in target and "." not in target:
        trl_names = trl_reward_names()
        if target in trl_names and target.startswith("get_"):
            raise ValueError(f"reward function {spec!r} is a TRL reward factory: it needs arguments, which "
                             "reward_funcs cannot pass; write my_rewards.py holding e.g. "
                             f"`reward = trl.rewards.{target}(...)` next to the recipe and give reward_funcs "
                             "my_rewards.reward (a dotted path to your own function).")
        if target in trl_names:
            target = f"trl.rewards:{target}"
    if ":" in target:
        module_name, attr = target.split(":", 1)
    elif "." in target:
        module_name, attr = target.rsplit(".", 1)
    else:
        usable = sorted(REWARDS) + [n for n in trl_reward_names() if not n.startswith("get_")]
        guess = did_you_mean(target, usable)
        raise ValueError(f"Unknown reward function {spec!r}{f' ({guess})' if guess else ''}: use one of {usable} "
                         "or a dotted path such as 'my_package.rewards:my_reward'.")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # so a reward module next to the recipe imports without installing it
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"Cannot load reward function {spec!r}: {type(err).__name__}: {err}") from err
    if not callable(func):
        raise ValueError(f"Reward function {spec!r} resolves to a {type(func).__name__}, which is not callable.")
    return func


def _required_columns(func) -> list[tuple[str, ...]]:
    """The dataset columns a reward function needs, each as the alternatives that satisfy it.

    Its named parameters without a default beyond the ones GRPOTrainer always passes; and for
    ``math_accuracy`` (whose parameters all have defaults) ``answer`` or ``solution``.
    """
    name = getattr(func, "__name__", type(func).__name__)
    if name in _GOLD_READERS:
        return [("answer", "solution")]
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    given = {"completions", "prompts", "completion_ids", "trainer_state", "log_metric", "log_extra"}
    return [(p.name,) for p in params if p.default is p.empty and p.name not in given
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _completions_annotation(func):
    try:
        param = inspect.signature(func).parameters.get("completions")
    except (TypeError, ValueError):
        return None
    return None if param is None or param.annotation is param.empty else param.annotation


def check_reward_columns(dataset, script_args, funcs) -> None:
    """Every column the reward functions need is in the dataset (TRL would fail at the first step), and a
    reward function written for chat completions (TRL's own) is not given text prompts."""
    columns = set(dataset.column_names)
    text_prompts = "prompt" in columns and len(dataset) > 0 and isinstance(dataset[0]["prompt"], str)
    for spec, func in zip(script_args.reward_funcs, funcs):
        trl_own = str(getattr(func, "__module__", "")).startswith("trl.")
        if text_prompts and trl_own and "dict" in str(_completions_annotation(func)):
            raise UsageError(f"reward function {spec!r} reads chat completions (lists of {{'role', 'content'}} "
                             f"messages), but the prompts of dataset {script_args.dataset_name} are text, so its "
                             "completions are text: give the prompts as message lists (TRL's conversational format), "
                             "or grade with math_accuracy (text or chat).")
        for needed in _required_columns(func):
            if columns.isdisjoint(needed):
                wanted = " or ".join(repr(c) for c in needed)
                role = needed[0]
                fix = (f"--dataset_columns {role}=NAME (YAML: dataset_columns: {{{role}: NAME}}) to name the column "
                       "that holds it" if role in data.TRAIN_ROLES else f"add a column {role!r} to the dataset")
                raise UsageError(f"reward function {spec!r} needs the dataset column {wanted}, which dataset "
                                 f"{script_args.dataset_name or 'arithmetic'} lacks (columns: "
                                 f"{', '.join(sorted(columns))}); {fix}.")
