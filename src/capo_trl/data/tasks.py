"""The embedded tasks a run can train and evaluate on, by name: what ``--task`` chooses.

Each task is a dataset function (its train, validation and test splits, disjoint by a hash of the
problem text) and the start model shipped for it. ``arithmetic`` is the control, where RL does not
cost calibration; the guessable-items tasks are where GRPO can turn an uncertain model into a
confident guesser (``docs/results/guess-half-comparison/``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from .arithmetic import EMBEDDED_MODEL_DIR, arithmetic_dataset
from ..errors import UsageError
from .guessing import GuessTask, guess_dataset

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@dataclass(frozen=True)
class Task:
    """A named embedded task: ``dataset(split, n, seed=0)``, the directory of its start model, and the name
    in :mod:`capo_trl.rewards` of its training reward when it is not ``math_accuracy_reward`` (``reward``;
    evaluation always grades the gold)."""

    name: str
    dataset: Callable
    model_dir: Path
    summary: str
    reward: str | None = None

    def model_path(self) -> str:
        """The start model's directory, checked (a missing asset names the command that builds it)."""
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
