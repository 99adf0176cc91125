"""Methods as named presets of CAPOConfig overrides, the budget every run shares, and their checks.

A method is a preset, optionally amended on the command line (``capo:tau=0.3:noise_mask=false``).
Everything here is checked before anything trains, so a typo fails at once with a UsageError
naming the flag (and a did-you-mean).
"""

from __future__ import annotations

import difflib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..training.defaults import EMBEDDED_METHOD, RECOMMENDED, TrainingBudget, training_config
from ..data.models import resolve_model
from ..errors import UsageError, check_model_path
from ..data.tasks import get_task

# The paper's advantage settings (tau 0.6 in nats, the 1/tau scale, the literal mask at 2.5 / 1.05), not its whole
# training: the group-size division is ours where the paper is silent, and the harness's budget, not the paper's
# learning rate, batch or steps, is what the preset trains with (measured by us: docs/results/).
PAPER = dict(advantage_estimator="capo", tau=0.6, tau_mode="absolute", advantage_scale="paper",
             noise_mask=True, ref_thresholds="fixed", ref_high=2.5, ref_low=1.05, noise_mask_guard=False)
# The embedded default before the confirmatory study: the mask on, thresholds measured on the first batch.
MASKED = {**EMBEDDED_METHOD, "noise_mask": True, "ref_thresholds": "auto"}
PRESETS: dict[str, dict] = {
    "grpo": dict(advantage_estimator="grpo"),
    "capo": dict(EMBEDDED_METHOD),  # what `capo-trl train` trains the embedded model with (no mask)
    "capo-nomask": dict(EMBEDDED_METHOD),  # = capo; the confirmatory study's name for it
    "capo-mask": dict(MASKED),
    # One side of the mask each (thresholds measured as `capo-mask` does; amend ref_thresholds=fixed:...).
    "capo-mask-correct": {**MASKED, "noise_mask_side": "correct"},
    "capo-mask-wrong": {**MASKED, "noise_mask_side": "wrong"},
    "capo-paper": PAPER,
    "capo-recommended": dict(RECOMMENDED),  # for a real model: the paper's settings with the guard on
    "grpo-mask": dict(advantage_estimator="grpo", noise_mask=True, ref_thresholds="auto"),
    # The methods CAPO is compared with (docs/baselines.md); method_config() already sets beta=0.
    "gspo": dict(advantage_estimator="grpo", importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4,
                 epsilon_high=4e-4),
    "dr_grpo": dict(advantage_estimator="dr_grpo", loss_type="dr_grpo"),
    "codapo": dict(advantage_estimator="codapo", codapo_replay=True),
    "cde": dict(advantage_estimator="cde"),
    "c2gspg": dict(advantage_estimator="c2gspg"),
    "simko": dict(advantage_estimator="simko"),
    "rlcr": dict(advantage_estimator="rlcr"),
    "dcpo": dict(advantage_estimator="dcpo"),
    "scapo": dict(advantage_estimator="scapo"),
}


@dataclass
class Budget(TrainingBudget):
    """Everything but the method: identical for every run of a comparison.

    The training fields (steps, batch, learning rate, completion length, training problems) and
    their defaults are :class:`capo_trl.training.defaults.TrainingBudget`'s; these add validation, test,
    grader noise, the task and model, and progress bars.
    """

    val_every: int = 25
    val_problems: int = 64
    val_samples: int = 4
    test_problems: int = 256
    test_samples: int = 8
    grader_noise: float = 0.0
    task: str = "arithmetic"  # a capo_trl.data.tasks name: the data, and the start model when `model` is None
    model: str | None = None
    progress: bool = True


# ------------------------------------------------------------------------------------ validation
# Budget fields the command line sets, and how its flags spell them (the others: Budget.<field>).
BUDGET_FLAGS = {"steps": "--steps", "test_problems": "--test_problems", "test_samples": "--test_samples",
                "grader_noise": "--grader_noise", "task": "--task", "model": "--model", "val_every": "--val_every",
                "val_problems": "--val_problems", "val_samples": "--val_samples", "learning_rate": "--learning_rate"}
# CAPOConfig fields the harness sets for every run: a method may not amend them.
HARNESS_FIELDS = {"output_dir": "--out", "seed": "--first_seed and --seeds", "max_steps": "--steps",
                  "num_generations": "Budget.num_generations",
                  "per_device_train_batch_size": "Budget.prompts_per_step x Budget.num_generations",
                  "max_completion_length": "Budget.max_completion_length"}


def budget_flag(name: str) -> str:
    """How the command line spells a Budget field (``Budget.<field>`` for those it does not set)."""
    return BUDGET_FLAGS.get(name, f"Budget.{name}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_budget(budget: Budget, start_model: bool = True) -> None:
    """Refuse a budget that cannot train or evaluate, naming the flag (cheap: before any model loads); with
    ``start_model``, also a task's start model that is not there yet (a real one not fetched)."""
    what = {"steps": "RL steps per run", "test_problems": "test-split problems", "test_samples": "samples per test "
            "problem", "val_every": "steps between validations", "val_problems": "validation problems",
            "val_samples": "samples per validation problem"}
    for name in ("steps", "prompts_per_step", "num_generations", "max_completion_length", "train_problems",
                 "val_every", "val_problems", "val_samples", "test_problems", "test_samples"):
        value = getattr(budget, name)
        if not is_int(value) or value < 1:
            hint = f" ({what[name]})" if name in what else ""
            raise UsageError(f"{budget_flag(name)} must be an integer >= 1{hint}, got {value!r}.")
    if not is_int(budget.warmup_steps) or budget.warmup_steps < 0:
        raise UsageError(f"Budget.warmup_steps must be an integer >= 0, got {budget.warmup_steps!r}.")
    if not is_number(budget.learning_rate) or budget.learning_rate <= 0:
        raise UsageError(f"--learning_rate must be a number > 0, got {budget.learning_rate!r}.")
    if not is_number(budget.grader_noise) or not 0 <= budget.grader_noise <= 1:
        raise UsageError(f"--grader_noise is the fraction of rewards flipped: a number in [0, 1], got "
                         f"{budget.grader_noise!r}.")
    task = get_task(budget.task)  # an unknown name: a UsageError naming --task
    if budget.model is not None:
        check_model_path(resolve_model(budget.model, "--model"), "--model")
    elif start_model:  # the task's start model: a real one not fetched yet is refused here, not in each worker
        task.model_path()


def parse_methods(text: str, flag: str = "--methods") -> list[tuple[str, dict]]:
    """``"grpo,capo:tau=0.3:noise_mask=false"`` -> [(label, CAPOConfig overrides), ...].

    Only the syntax and the preset names are checked here; :func:`check_methods` checks the fields.
    """
    methods = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        preset, *amendments = (part.strip() for part in item.split(":"))
        if preset not in PRESETS:
            close = difflib.get_close_matches(preset, PRESETS, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"{flag}: unknown method {preset!r}; {guess}presets are {', '.join(sorted(PRESETS))} "
                             "(amend one with preset:field=value, e.g. capo:tau=0.3).")
        overrides = dict(PRESETS[preset])
        for amendment in amendments:
            key, sep, value = (part.strip() for part in amendment.partition("="))
            if not sep or not key:
                raise UsageError(f"{flag}: expected field=value after ':' in {item!r}, got {amendment!r}.")
            try:
                overrides[key] = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise UsageError(f"{flag}: in {item!r}, the value of {key!r} ({value!r}) cannot be read "
                                 f"({type(err).__name__}); write numbers as 0.3, booleans as true/false.") from err
        if any(label == item for label, _ in methods):
            raise UsageError(f"{flag}: {item!r} is listed twice; each method runs once per seed.")
        methods.append((item, overrides))
    if not methods:
        raise UsageError(f"{flag} is empty; give e.g. grpo,capo.")
    return methods


def method_config(overrides: dict, seed: int, budget: Budget, out_dir, label: str | None = None,
                  flag: str = "--methods"):
    """The CAPOConfig of one run: the budget's settings plus the method's overrides.

    Used by :func:`capo_trl.harness.runs.train_method` and, before anything trains, by
    :func:`check_methods`: a bad field or value is a UsageError naming the method and the field
    (with a did-you-mean for typos).
    """
    import dataclasses

    import torch

    from ..training.config import CAPOConfig

    where = f"{flag}: method {label!r}" if label else f"{flag}: method"
    known = sorted(f.name for f in dataclasses.fields(CAPOConfig) if f.init)
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            guess = f"did you mean {close[0]!r}?" if close else "see docs/config.md for the fields."
            raise UsageError(f"{where}: unknown CAPOConfig field {key!r}; {guess}")
        if key in HARNESS_FIELDS:
            raise UsageError(f"{where}: {key!r} is set by the harness for every run (from {HARNESS_FIELDS[key]}); "
                             f"remove :{key}=... from the method.")
    settings = dict(
        **training_config(budget), output_dir=str(out_dir), seed=seed, beta=0.0, bf16=False,
        use_cpu=not torch.cuda.is_available(), save_strategy="no", logging_steps=max(1, budget.val_every // 5),
        disable_tqdm=not budget.progress,
    )
    # transformers 5 renamed gradient_checkpointing (the old name warns): off, under whichever name exists
    settings["activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"] = False
    settings.update(overrides)
    try:
        return CAPOConfig(**settings)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: {err}") from err


def check_methods(methods: list[tuple[str, dict]], budget: Budget, flag: str = "--methods") -> None:
    """Build every method's CAPOConfig (cheap, nothing is written): a bad one fails before any training."""
    for label, overrides in methods:
        method_config(overrides, 0, budget, Path(tempfile.gettempdir()) / "capo-trl-check", label=label, flag=flag)


__all__ = ["BUDGET_FLAGS", "HARNESS_FIELDS", "PAPER", "PRESETS", "Budget", "budget_flag", "check_budget",
           "check_methods", "method_config", "parse_methods"]
