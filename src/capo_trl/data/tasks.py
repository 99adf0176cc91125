"""The embedded tasks a run can train and evaluate on, by name: what ``--task`` chooses.

Each task is a dataset function (its train, validation and test splits, disjoint by a hash of the
problem text) and the start model shipped for it. ``arithmetic`` is the control, where RL does not
cost calibration; the guessable-items tasks are where GRPO can turn an uncertain model into a
confident guesser (the test-bed studies of ``docs/results/``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from .addition import AdditionTask, addition_dataset
from .arithmetic import EMBEDDED_MODEL_DIR, arithmetic_dataset
from ..errors import UsageError
from .guessing import GuessTask, guess_dataset
from .models import resolve_model

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@dataclass(frozen=True)
class Task:
    """A named embedded task: ``dataset(split, n, seed=0)``, its start model (a shipped directory, or the short
    name of a real model that ``capo-trl fetch-model`` fetches), the name in :mod:`capo_trl.rewards` of its
    training reward when it is not ``math_accuracy_reward`` (``reward``; evaluation always grades the gold),
    and the :data:`capo_trl.data.benchmarks.PROMPT_TEMPLATES` name that makes its prompts."""

    name: str
    dataset: Callable
    model_dir: Path | str
    summary: str
    reward: str | None = None
    template: str = "raw"

    def model_path(self) -> str:
        """The start model's directory, checked (a missing asset names the command that builds or fetches it)."""
        if isinstance(self.model_dir, str):
            return resolve_model(self.model_dir, f"task {self.name}'s start model")
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"The start model of task {self.name!r} is missing from {self.model_dir}; build it "
                                    "with scripts/pretrain_tiny.py (its PROVENANCE.json holds the command).")
        return str(self.model_dir)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("arithmetic", arithmetic_dataset, EMBEDDED_MODEL_DIR,
             "2-3 operand integer arithmetic; every answer can be derived (the control)"),
        Task("guess", guess_dataset, ASSETS / "guess-tiny",
             "arithmetic, a quarter of the items guessable (last operand hidden, 0-4)"),
        Task("guess-half", partial(guess_dataset, task=GuessTask(guess_fraction=0.5)), ASSETS / "guess-tiny",
             "arithmetic, half the items guessable (last operand hidden, 0-4)"),
        Task("guess-redraw", partial(guess_dataset, task=GuessTask(guess_fraction=0.5)), ASSETS / "guess-tiny",
             "guess-half's items, the hidden operand redrawn for every training sample (no answer beats 1 in 5)",
             reward="redraw_reward"),
        # the real model's tasks: chat prompts with worked examples (capo_trl.data.addition)
        Task("addition", addition_dataset, "smollm2-135m-instruct",
             "two-digit addition in a chat with worked examples, for SmolLM2-135M-Instruct (a real model)",
             template="addition_chat"),
        Task("addition-guess-half", partial(addition_dataset, task=AdditionTask(hidden_fraction=0.5)),
             "smollm2-135m-instruct", "addition, half the items hiding a third operand (0-4), for SmolLM2-135M-Instruct",
             template="addition_chat"),
    )
}
DEFAULT_TASK = "arithmetic"


def get_task(name: str, flag: str = "--task") -> Task:
    """The task called ``name``; a UsageError naming ``flag`` (with a did-you-mean) otherwise."""
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(str(name), TASKS, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(f"{flag}: unknown task {name!r}; {guess}tasks are {', '.join(TASKS)}.")


__all__ = ["DEFAULT_TASK", "TASKS", "Task", "get_task"]
