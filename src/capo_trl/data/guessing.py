"""Guessable items mixed into the arithmetic task: a task where a right answer can be a lucky guess.

A guessable item is an arithmetic problem with its last operand hidden, ``Compute 37+5-?.``. The
hidden operand is in ``0..hidden_max`` and is a fixed function of the problem text (a hash), so the
item has one gold answer, but the prompt carries no information about it: on problems never
trained on, no policy beats ``1 / (hidden_max + 1)`` in expectation. Binary rewards still pay the
lucky guesses, which is how RL can turn a model that was uncertain on such items into a confident
guesser. The rest of each split is the arithmetic task unchanged, so derivable items stay the
ones where confidence can track correctness.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `capo-trl --help` must not load datasets (seconds)
    from datasets import Dataset

from .arithmetic import ARITHMETIC_CHARS, SPLITS, ArithmeticTask, arithmetic_dataset

GUESS_CHARS = ARITHMETIC_CHARS + "?"  # the character tokenizer of a model trained on this task


def hidden_value(problem: str, hidden_max: int) -> int:
    """A hidden operand in ``0..hidden_max``, fixed by the problem's text and unrelated to anything in it."""
    digest = hashlib.sha256(f"hidden:{problem}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (hidden_max + 1)


@dataclass(frozen=True)
class GuessTask:
    """The arithmetic task with a share of guessable items.

    Args:
        arithmetic: the derivable items' task, and the operand ranges of the guessable ones.
        guess_fraction: share of each split that is guessable (exact: ``round(fraction * n)`` items).
        hidden_max: the hidden operand is in ``0..hidden_max`` (a guess is right with probability
            ``1 / (hidden_max + 1)``).
    """

    arithmetic: ArithmeticTask = field(default_factory=ArithmeticTask)
    guess_fraction: float = 0.25
    hidden_max: int = 4

    def __post_init__(self):
        if not 0 <= self.guess_fraction <= 1:
            raise ValueError(f"GuessTask.guess_fraction must be in [0, 1], got {self.guess_fraction}.")
        if not 1 <= self.hidden_max <= 9:
            raise ValueError(f"GuessTask.hidden_max must be in 1..9 (one hidden digit), got {self.hidden_max}.")

    def hidden_value(self, problem: str) -> int:
        """The hidden operand of a guessable problem: fixed by its text, unrelated to anything in it."""
        return hidden_value(problem, self.hidden_max)

    def sample_guess(self, rng: random.Random) -> dict:
        """One guessable problem: ``{"problem", "answer", "solution", "solutions", "num_operands"}``.

        ``solutions`` holds the worked solution for every possible hidden value (index = value),
        ``solution`` / ``answer`` those of the item's own hidden value.
        """
        task = self.arithmetic
        while True:
            n = rng.randint(task.min_operands, task.max_operands)
            values = [rng.randint(0, task.max_value) for _ in range(n - 1)]
            ops = [rng.choice(task.ops) for _ in range(n - 1)]
            steps, total, expr, negative = [], values[0], str(values[0]), False
            for op, v in zip(ops[:-1], values[1:]):
                new = total + v if op == "+" else total - v
                steps.append(f"{total}{op}{v}={new}.")
                total, expr, negative = new, f"{expr}{op}{v}", negative or new < 0
            last = ops[-1]
            lowest = total - self.hidden_max if last == "-" else total
            if task.allow_negative or not (negative or lowest < 0):
                break
        problem = f"Compute {expr}{last}?."
        results = [total + h if last == "+" else total - h for h in range(self.hidden_max + 1)]
        solutions = [" ".join([*steps, f"{total}{last}?={r}."]) + f" \\boxed{{{r}}}" for r in results]
        h = self.hidden_value(problem)
        return {"problem": problem, "answer": str(results[h]), "solution": solutions[h], "solutions": solutions,
                "num_operands": n}


def guess_dataset(split: str = "train", n: int = 1000, seed: int = 0, task: GuessTask | None = None,
                  max_tries_factor: int = 200) -> Dataset:
    """``n`` distinct problems of one split, ``round(guess_fraction * n)`` of them guessable, in a seeded order.

    Columns: those of :func:`~capo_trl.data.arithmetic.arithmetic_dataset` (``prompt``, ``answer``,
    ``solution``, ``num_operands``) plus ``guessable`` and ``solutions`` (every worked solution
    consistent with the prompt: one for a derivable item, ``hidden_max + 1`` for a guessable one).
    The derivable items are exactly ``arithmetic_dataset(split, n - n_guess, seed)``; splits are
    assigned by the same hash of the problem text, so no prompt is shared between splits.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {SPLITS}.")
    task = task or GuessTask()
    n_guess = round(task.guess_fraction * n)
    rng = random.Random(f"guess-{seed}-{split}")
    guessed, seen = [], set()
    for _ in range(max(1, n_guess) * max_tries_factor):
        if len(guessed) == n_guess:
            break
        row = task.sample_guess(rng)
        if row["problem"] in seen or task.arithmetic.split_of(row["problem"]) != split:
            continue
        seen.add(row["problem"])
        guessed.append({"prompt": row.pop("problem"), **row, "guessable": True})
    if len(guessed) < n_guess:
        raise ValueError(f"Could only generate {len(guessed)} distinct guessable {split} problems of {n_guess} asked "
                         f"for with {task}; ask for fewer or widen the task (max_value, max_operands).")
    derived = []
    if n - n_guess:
        for row in arithmetic_dataset(split, n - n_guess, seed=seed, task=task.arithmetic):
            derived.append({**row, "solutions": [row["solution"]], "guessable": False})
    rows = guessed + derived
    rng.shuffle(rows)
    from datasets import Dataset

    return Dataset.from_list(rows)


def sft_completions(dataset: Dataset, seed: int = 0) -> Dataset:
    """Prompt/completion pairs for supervised warm-up, each guessable row with a hidden value drawn at random.

    Why not the gold: a model trained on golds could memorise them; drawn per row, the best it can
    learn is the uniform distribution over the guesses, i.e. a start model calibrated on them.
    """
    rng = random.Random(f"sft-{seed}")
    completions = [" " + rng.choice(row["solutions"]) for row in dataset]
    keep = dataset.select_columns(["prompt"])
    return keep.add_column("completion", completions)


def guess_breakdown(samples: list[dict], rows, n: int) -> dict:
    """Per item kind, from an evaluation's per-sample records (problem-major, ``n`` each, in ``rows``' order).

    ``accuracy``, ``mean_score`` (mean ``s``) for derivable and guessable items, and on guessable
    items ``modal_share``: the mean share of the most frequent answer among an item's ``n``
    samples (0.397 expected for a uniform guess over 5 values with n = 8; 1.0 for a confident guesser;
    a sample with no answer counts as the answer None).
    """
    if len(samples) != len(rows) * n:
        raise ValueError(f"guess_breakdown: {len(samples)} samples for {len(rows)} problems x n={n}.")
    out = {}
    for kind, flag in (("derivable", False), ("guessable", True)):
        groups = [samples[i * n:(i + 1) * n] for i, row in enumerate(rows) if bool(row["guessable"]) == flag]
        flat = [s for g in groups for s in g if s["grade"] is not None]
        out[f"{kind}/problems"] = len(groups)
        out[f"{kind}/accuracy"] = sum(s["grade"] for s in flat) / len(flat) if flat else float("nan")
        out[f"{kind}/mean_score"] = sum(s["score"] for s in flat) / len(flat) if flat else float("nan")
        if flag:
            shares = [Counter(s["extracted"] for s in g).most_common(1)[0][1] / n for g in groups]
            out[f"{kind}/modal_share"] = sum(shares) / len(shares) if shares else float("nan")
    return out


__all__ = ["GUESS_CHARS", "GuessTask", "guess_breakdown", "guess_dataset", "sft_completions"]
