"""TRL reward functions over the math grader (:mod:`capo_trl.grader`): thin adapters, no grading logic.

``math_accuracy_reward`` uses the process's shared grader; :class:`MathReward` is a grader with its
own settings that is also a reward function. The verbalised-confidence rewards of RLCR and a
grader-noise wrapper for mask ablations live here too.
"""

from __future__ import annotations

import hashlib
import math
import re

import torch

from .grader import MathGrader, as_text, default_grader, last_boxed
from .grader.normalize import _box_spans
from .grader.worker import CORRECT, DIED, GOLD_BAD, OOM, PRED_BAD, TIMED_OUT
from .methods.verbalized import answer_tag, parse_rlcr, rlcr_rewards

__all__ = ["MathReward", "math_accuracy_reward", "boxed_format_reward", "AnswerTagReward", "RLCRReward",
           "with_grader_noise", "last_boxed", "redraw_reward"]

_COUNTERS = (("timed_out", TIMED_OUT), ("pred_unparseable", PRED_BAD), ("gold_unparseable", GOLD_BAD),
             ("worker_died", DIED), ("out_of_memory", OOM))


def _golds(n: int, answer=None, solution=None) -> list:
    """The gold column: ``answer`` as is, else the last ``\\boxed{}`` of each ``solution``."""
    if answer is not None:
        golds = list(answer)
    elif solution is not None:
        golds = [_solution_gold(s) for s in solution]
    else:
        raise ValueError(
            "math accuracy reward needs the gold answer: a dataset column named 'answer' (bare "
            "LaTeX, or a list of acceptable answers) or 'solution' (its last \\boxed{} is used). "
            "Rename yours, e.g. dataset = dataset.rename_column('final_answer', 'answer')."
        )
    if len(golds) != n:
        raise ValueError(f"got {n} completions but {len(golds)} gold answers")
    return golds


def _solution_gold(solution):
    """A solution text -> its last boxed answer; a solution without one is taken as the answer."""
    if isinstance(solution, (list, tuple)):
        return [_solution_gold(s) for s in solution]
    text = "" if solution is None else str(solution)
    boxed = last_boxed(text)
    return text if boxed is None else boxed


def _accuracy(grader: MathGrader, completions, answer, solution, log_prefix: str, **kwargs) -> list[float | None]:
    """1.0 / 0.0 per completion, None where the gold cannot be parsed; counters through TRL's ``log_metric``."""
    golds = _golds(len(completions), answer, solution)
    codes, extracted = grader._grade_codes([as_text(c) for c in completions], golds)
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if callable(log_metric) and codes:
        for name, code in _COUNTERS:
            log_metric(f"{log_prefix}/{name}", sum(c == code for c in codes) / len(codes))
    if callable(log_extra):
        log_extra(f"{log_prefix}/extracted", list(extracted))
    return [None if c == GOLD_BAD else float(c == CORRECT) for c in codes]


class MathReward(MathGrader):
    """A :class:`~capo_trl.grader.MathGrader` with its own settings that is also a TRL reward function.

    Args: those of ``MathGrader``, and ``log_prefix``, the prefix of the counters sent through TRL's
    ``log_metric``. Prefer :func:`math_accuracy_reward` (the shared grader) unless you need other settings.
    """

    def __init__(self, *args, log_prefix: str = "math_reward", **kwargs):
        super().__init__(*args, **kwargs)
        self.log_prefix = log_prefix
        self.__name__ = "math_accuracy"  # TRL names the reward column after this
        self.reward_range = (0.0, 1.0)

    def __call__(self, completions, answer=None, solution=None, **kwargs) -> list[float | None]:
        """TRL reward function: gold from the ``answer`` column, else last ``\\boxed{}`` of ``solution``."""
        return _accuracy(self, completions, answer, solution, self.log_prefix, **kwargs)


def math_accuracy_reward(completions, answer=None, solution=None, **kwargs) -> list[float | None]:
    """1.0 if the completion's final answer equals the gold, else 0.0; None if the gold is unparseable.

    Grades with the process's shared grader (:func:`~capo_trl.grader.default_grader`, timeout 5 s).
    """
    return _accuracy(default_grader(), completions, answer, solution, "math_reward", **kwargs)


def _math_answer_spans(completions, **kwargs) -> list[tuple[int, int] | None]:
    """Where the shared grader reads each completion's final answer (:meth:`MathGrader.answer_spans`)."""
    return default_grader().answer_spans(completions)


# A reward function that says where each answer is lets CAPO score the answer's own tokens (score_span='answer').
math_accuracy_reward.answer_spans = _math_answer_spans
# The values a reward function can return (None aside): CAPOTrainer refuses a correct_threshold outside them.
math_accuracy_reward.reward_range = (0.0, 1.0)


# A boxed answer, then only closing punctuation, math delimiters, markdown bold and end tags.
_TAIL = re.compile(r"(?:\s|[.,;:!)\]$*]|\\\]|\\\)|</[A-Za-z_][\w-]*>|<\|[\w-]+\|>|<｜[^｜<>]{1,40}｜>)*")


def boxed_format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion ends with a non-empty ``\\boxed{...}`` final answer, else 0.0.

    Rule: after the last balanced ``\\boxed{...}`` only whitespace, ``. , ; : ! ) ] * $``, ``\\]``,
    ``\\)`` and closing tags (``</answer>``, ``<|im_end|>``) may follow. Why so strict: the reward is
    meant to teach "finish with the boxed answer", not "mention a box somewhere".
    """
    out = []
    for c in completions:
        text = as_text(c)
        ok = False
        spans = _box_spans(text)
        if spans:
            start, end = spans[-1]
            body = text[text.index("{", start) + 1 : end]
            ok = bool(body.strip()) and _TAIL.fullmatch(text, end + 1) is not None
        out.append(1.0 if ok else 0.0)
    return out


boxed_format_reward.reward_range = (0.0, 1.0)


# --------------------------------------------------------------------------------------------
# verbalised confidence (RLCR)
# --------------------------------------------------------------------------------------------
def _boxed(answer: str | None) -> str:
    """MathReward reads anchored answers only: box a bare tag content so ``42`` is graded."""
    if answer is None:
        return ""
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


class AnswerTagReward:
    """Accuracy of the last ``<answer>`` tag (0 when absent), graded by a MathGrader (default: the shared one).

    The correctness reward for ``advantage_estimator="rlcr"``: the estimator adds format and Brier terms.
    """

    def __init__(self, math_reward: MathGrader | None = None):
        self.math = math_reward  # None: the process's shared grader, looked up at call time
        self.__name__ = "answer_tag_accuracy"
        self.reward_range = (0.0, 1.0)

    def __call__(self, completions, answer=None, solution=None, **kwargs):
        answers = [_boxed(answer_tag(as_text(c))) for c in completions]
        return _accuracy(self.math or default_grader(), answers, answer, solution, "answer_tag")


class RLCRReward(AnswerTagReward):
    """RLCR's whole released reward as one TRL reward function: ``0.5 format + 0.5 accuracy +
    0.5 (1 - (correct - q)^2)``, 0 when the format fails.

    For GRPOTrainer or ``advantage_estimator="grpo"``. Inside capo-trl prefer ``"rlcr"`` with
    :class:`AnswerTagReward`: the ``capo/*`` metrics then see correctness, not this total.
    """

    def __init__(self, math_reward=None, format_weight: float = 0.5, accuracy_weight: float = 0.5,
                 brier_weight: float = 0.5):
        super().__init__(math_reward)
        self.weights = (format_weight, accuracy_weight, brier_weight)
        self.__name__ = "rlcr"
        # 0 when the format fails, else format_weight + accuracy_weight * c + brier_weight * (a number in [0, 1])
        self.reward_range = (min(0.0, format_weight + min(0.0, accuracy_weight) + min(0.0, brier_weight)),
                             max(0.0, format_weight + max(0.0, accuracy_weight) + max(0.0, brier_weight)))

    def __call__(self, completions, answer=None, solution=None, **kwargs):
        grades = super().__call__(completions, answer=answer, solution=solution)
        stated = [parse_rlcr(as_text(c)) for c in completions]
        correct = torch.tensor([float("nan") if g is None else g for g in grades])
        conf = torch.tensor([float("nan") if s.confidence is None else s.confidence for s in stated])
        ok = torch.tensor([s.format_ok for s in stated])
        return [None if math.isnan(v) else v for v in rlcr_rewards(correct, conf, ok, *self.weights).tolist()]


# --------------------------------------------------------------------------------------------
# label noise, for mask ablations
# --------------------------------------------------------------------------------------------
def redraw_reward(completions, solutions, guessable, prompts=None, trainer_state=None, **kwargs) -> list:
    """Math accuracy where a guessable item's hidden operand is drawn afresh for every sample (the
    ``guess-redraw`` task: columns ``solutions`` and ``guessable`` of :func:`capo_trl.data.guessing.guess_dataset`).

    Why: with the operand fixed per problem a policy can memorise the training items' golds; drawn
    per sample, every answer to a guessable item is right with probability ``1 / (hidden_max + 1)``
    whatever the policy does, so the best policy stays uncertain there and a confident guesser is
    miscalibrated by construction. The draw hashes (step, position in the batch, prompt), so a run
    and its resumed twin draw the same. Derivable items keep their one gold.
    """
    step = trainer_state.global_step if trainer_state is not None else 0
    golds = []
    for i, (options, flag) in enumerate(zip(solutions, guessable)):
        prompt = prompts[i] if prompts is not None else ""
        digest = hashlib.sha256(f"redraw:{step}:{i}:{prompt}".encode()).digest()
        golds.append(options[int.from_bytes(digest[:8], "big") % len(options)] if flag else options[0])
    kwargs.pop("answer", None)  # the fixed gold; graded against the drawn solution instead
    kwargs.pop("solution", None)
    return math_accuracy_reward(completions, solution=golds, **kwargs)


redraw_reward.answer_spans = _math_answer_spans  # graded by the math reward: its answers are where it reads them
redraw_reward.reward_range = (0.0, 1.0)


def with_grader_noise(reward_func, rate: float, seed: int = 0):
    """Wrap a reward function so a fraction ``rate`` of its 0/1 grades are flipped.

    The flip is a deterministic function of (seed, prompt, completion), like a grader that
    consistently misreads certain answers, so the same completion always gets the same grade.
    This is what CAPO's noise mask is meant to catch.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"with_grader_noise: rate must be in [0, 1], got {rate}.")

    def noisy(prompts=None, completions=None, **kwargs):
        grades = reward_func(prompts=prompts, completions=completions, **kwargs)
        out = []
        for prompt, completion, grade in zip(prompts or [None] * len(grades), completions, grades):
            text = f"{seed}|{prompt}|{completion}".encode()
            u = int.from_bytes(hashlib.sha256(text).digest()[:8], "big") / 2**64
            out.append(grade if grade is None or u >= rate else 1.0 - grade)
        return out

    noisy.__name__ = f"{getattr(reward_func, '__name__', 'reward')}_noisy{rate:g}"
    if getattr(reward_func, "reward_range", None) is not None:  # a flip maps r to 1 - r
        low, high = reward_func.reward_range
        noisy.reward_range = (min(low, 1.0 - high), max(high, 1.0 - low))
    return noisy
