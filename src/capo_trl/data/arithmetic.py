"""The embedded default: an offline arithmetic task, its character tokenizer and the tiny model shipped for it.

The task is what the CPU demo trains on: problems like ``Compute 37+5-19.`` with a short chain of
thought ``37+5=42. 42-19=23. \\boxed{23}``. It is generated from a seed, split into
train/validation/test by a hash of the problem text (so no problem leaks across splits, whatever
the sizes asked for), and graded by the library's math reward like any benchmark.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `capo-trl --help` must not load datasets (seconds)
    from datasets import Dataset

SPLITS = ("train", "validation", "test")
# Fractions of the problem space assigned to each split by hash; train gets the rest.
_SPLIT_SHARE = {"validation": 0.1, "test": 0.1}


@dataclass(frozen=True)
class ArithmeticTask:
    """Seeded generator of multi-step addition/subtraction problems with a worked solution.

    Args:
        min_operands / max_operands: how many numbers a problem chains (difficulty knob).
        max_value: operands are drawn from ``[0, max_value]`` (difficulty knob).
        ops: the operators to use, a subset of ``"+-"``.
        allow_negative: keep problems whose intermediate or final results go below 0.
    """

    min_operands: int = 2
    max_operands: int = 3
    max_value: int = 49
    ops: str = "+-"
    allow_negative: bool = False

    def __post_init__(self):
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError(
                f"ArithmeticTask needs 2 <= min_operands <= max_operands, got {self.min_operands}, {self.max_operands}."
            )
        if self.max_value < 1:
            raise ValueError(f"ArithmeticTask.max_value must be >= 1, got {self.max_value}.")
        if not self.ops or set(self.ops) - set("+-"):
            raise ValueError(f"ArithmeticTask.ops must be a non-empty subset of '+-', got {self.ops!r}.")

    def sample(self, rng: random.Random) -> dict:
        """One problem: ``{"problem", "answer", "solution", "num_operands"}``."""
        while True:
            n = rng.randint(self.min_operands, self.max_operands)
            values = [rng.randint(0, self.max_value) for _ in range(n)]
            ops = [rng.choice(self.ops) for _ in range(n - 1)]
            steps, total, expr = [], values[0], str(values[0])
            for op, v in zip(ops, values[1:]):
                new = total + v if op == "+" else total - v
                steps.append(f"{total}{op}{v}={new}.")
                total, expr = new, f"{expr}{op}{v}"
                if new < 0 and not self.allow_negative:
                    break
            else:
                return {
                    "problem": f"Compute {expr}.",
                    "answer": str(total),
                    "solution": " ".join(steps) + f" \\boxed{{{total}}}",
                    "num_operands": n,
                }

    def split_of(self, problem: str) -> str:
        """Deterministic split assignment from the problem text alone."""
        u = int.from_bytes(hashlib.sha256(problem.encode()).digest()[:8], "big") / 2**64
        if u < _SPLIT_SHARE["validation"]:
            return "validation"
        if u < _SPLIT_SHARE["validation"] + _SPLIT_SHARE["test"]:
            return "test"
        return "train"


def arithmetic_dataset(split: str = "train", n: int = 1000, seed: int = 0, task: ArithmeticTask | None = None,
                       max_tries_factor: int = 200) -> Dataset:
    """``n`` distinct problems of one split as a TRL-ready dataset.

    Columns: ``prompt`` (the problem, plain text), ``answer`` (gold for the math reward),
    ``solution`` (the worked answer, for supervised warm-up), ``num_operands``.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {SPLITS}.")
    task = task or ArithmeticTask()
    rng = random.Random(f"{seed}-{split}")
    rows, seen = [], set()
    for _ in range(n * max_tries_factor):
        row = task.sample(rng)
        if row["problem"] in seen or task.split_of(row["problem"]) != split:
            continue
        seen.add(row["problem"])
        rows.append({"prompt": row["problem"], **{k: v for k, v in row.items() if k != "problem"}})
        if len(rows) == n:
            from datasets import Dataset

            return Dataset.from_list(rows)
    raise ValueError(
        f"Could only generate {len(rows)} distinct {split} problems of {n} asked for with {task}; "
        "ask for fewer or widen the task (max_value, max_operands)."
    )


ARITHMETIC_CHARS = "0123456789+-=. Cmpute\\boxed{}"


def char_tokenizer(chars: str = ARITHMETIC_CHARS, chat_template: str | None = None):
    """A character-level tokenizer (pad/eos/unk + one token per character) that survives reloading.

    It is a merge-free byte-level BPE, exactly what ``Qwen2Tokenizer`` rebuilds from
    ``tokenizer.json``: transformers 5 loads a tokenizer saved next to a Qwen2 ``config.json`` as
    ``Qwen2Tokenizer``, which imposes its byte-level pre-tokenizer (space becomes ``\u0120``). A
    plain character vocabulary would silently lose every space on reload; this one round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_char = bytes_to_unicode()
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in chars:
        vocab.setdefault("".join(byte_char[b] for b in ch.encode()), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


EMBEDDED_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "arith-tiny"


def embedded_model_path() -> str:
    """The tiny arithmetic model shipped in the package (built by ``scripts/pretrain_tiny.py``):
    the default model of the CPU demo, so it runs with no hub access."""
    if not (EMBEDDED_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"The embedded arithmetic model is missing from {EMBEDDED_MODEL_DIR}. Build it with "
            "`python scripts/pretrain_tiny.py --out runs/pretrain`, or pass a model path."
        )
    return str(EMBEDDED_MODEL_DIR)
