"""Two-digit addition for a real chat model, with and without hidden operands: the real model's tasks.

Why these: a 135M instruct model adds two-digit numbers right some of the time when shown how to
answer (so groups are mixed at the start, the only ones that carry signal), the answer is short,
and the math reward grades it exactly. ``hidden_fraction`` of the items hide a third operand
(``Compute 37+45+?.``, the hidden value 0-4 a hash of the text), as the tiny model's ``guess-half``
does: no policy beats 1 in 5 there on unseen problems, so RL can only teach confident guessing.

The prompt is a chat (:func:`addition_prompt`): a one-line system message in place of the chat
template's default one, and worked examples as earlier turns, each ending in ``The answer is
\\boxed{N}.`` (the math reward needs the box or that anchor).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `capo-trl --help` must not load datasets (seconds)
    from datasets import Dataset

from .arithmetic import SPLITS, ArithmeticTask
from .guessing import hidden_value

SYSTEM = "You are a careful calculator."
# Worked examples shown before every problem; never drawn as a problem of any split.
SHOTS = ((23, 45), (67, 18))


_SHOT_PROBLEMS = {f"Compute {a}+{b}." for a, b in SHOTS}


def _answer(a: int, b: int) -> str:
    return f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."


def addition_prompt(problem: str) -> list[dict]:
    """The chat every addition problem is asked in: a short system line, the worked examples, the problem."""
    messages = [{"role": "system", "content": SYSTEM}]
    for a, b in SHOTS:
        messages += [{"role": "user", "content": f"Compute {a}+{b}."}, {"role": "assistant", "content": _answer(a, b)}]
    return [*messages, {"role": "user", "content": problem}]


@dataclass(frozen=True)
class AdditionTask:
    """Seeded two-operand addition, ``low..high`` each, with a share of items hiding a third operand.

    Args:
        low / high: operand range (two digits by default).
        hidden_fraction: share of each split whose problem hides a third operand (exact: ``round(fraction * n)``).
        hidden_max: the hidden operand is in ``0..hidden_max`` (a guess is right with probability
            ``1 / (hidden_max + 1)``).
    """

    low: int = 10
    high: int = 99
    hidden_fraction: float = 0.0
    hidden_max: int = 4

    def __post_init__(self):
        if not 0 <= self.low < self.high:
            raise ValueError(f"AdditionTask needs 0 <= low < high, got {self.low}, {self.high}.")
        if not 0 <= self.hidden_fraction <= 1:
            raise ValueError(f"AdditionTask.hidden_fraction must be in [0, 1], got {self.hidden_fraction}.")
        if not 1 <= self.hidden_max <= 9:
            raise ValueError(f"AdditionTask.hidden_max must be in 1..9, got {self.hidden_max}.")

    def hidden_value(self, problem: str) -> int:
        """The hidden operand of a problem: fixed by its text (as on ``guess-half``)."""
        return hidden_value(problem, self.hidden_max)

    def sample(self, rng: random.Random, hidden: bool) -> dict:
        a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        if not hidden:
            return {"problem": f"Compute {a}+{b}.", "answer": str(a + b), "solution": _answer(a, b),
                    "guessable": False}
        problem = f"Compute {a}+{b}+?."
        total = a + b + self.hidden_value(problem)
        return {"problem": problem, "answer": str(total), "solution": f"The answer is \\boxed{{{total}}}.",
                "guessable": True}


def addition_dataset(split: str = "train", n: int = 1000, seed: int = 0, task: AdditionTask | None = None,
                     max_tries_factor: int = 200) -> Dataset:
    """``n`` distinct problems of one split (disjoint across splits by a hash of the text), as a dataset.

    Columns: ``prompt`` (the problem text; :func:`addition_prompt` makes the chat), ``answer``, ``solution``,
    ``guessable``. Exactly ``round(hidden_fraction * n)`` rows hide an operand, shuffled in.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {SPLITS}.")
    task = task or AdditionTask()
    rng = random.Random(f"addition-{seed}-{split}")
    n_hidden = round(task.hidden_fraction * n)
    kinds = [True] * n_hidden + [False] * (n - n_hidden)
    rng.shuffle(kinds)
    splitter = ArithmeticTask()
    rows, seen = [], set()
    for hidden in kinds:
        for _ in range(max_tries_factor):
            row = task.sample(rng, hidden)
            if row["problem"] not in seen and row["problem"] not in _SHOT_PROBLEMS and \
                    splitter.split_of(row["problem"]) == split:
                break
        else:
            raise ValueError(f"Could only generate {len(rows)} distinct {split} problems of {n} asked for with {task}; "
                             "ask for fewer or widen the operand range.")
        seen.add(row["problem"])
        rows.append({"prompt": row["problem"], **{k: v for k, v in row.items() if k != "problem"}})
    from datasets import Dataset

    return Dataset.from_list(rows)


__all__ = ["AdditionTask", "SHOTS", "SYSTEM", "addition_dataset", "addition_prompt"]
