"""Where each completion's final answer is, in tokens: the glue between a reward function's ``answer_spans`` and
CAPO's answer score (``CAPOConfig.score_span='answer'``).

A reward function reports spans by carrying an ``answer_spans(completions, **columns)`` callable that returns,
per completion text, ``(start, end)`` characters of the answer it reads, or None when there is none
(:func:`capo_trl.rewards.math_accuracy_reward` and :class:`capo_trl.rewards.MathReward` do). The span is the
reward's own reading, so the score is the policy's confidence in the very answer that was graded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..errors import UsageError
from ..methods.base import token_start


def span_source(reward_funcs: Sequence, names: Sequence[str]) -> tuple[Callable, str]:
    """The first reward function that reports answer spans, and its name; a clear error when none does."""
    for func, name in zip(reward_funcs, names):
        spans = getattr(func, "answer_spans", None)
        if callable(spans):
            return spans, name
    raise UsageError(
        f"CAPOConfig.score_span='answer' scores each answer's own tokens, so a reward function must say where the "
        f"answer is, but none of {list(names)} has an `answer_spans` method. Use capo_trl.rewards."
        "math_accuracy_reward or MathReward, give yours `answer_spans(completions, **columns) -> [(start, end) or "
        "None, ...]` (characters of each completion's text), or set score_span='completion'.")


def checked_spans(spans, texts: Sequence[str], name: str) -> list[tuple[int, int] | None]:
    """``spans`` as ``(start, end)`` pairs inside each text (None kept); an error naming the reward otherwise."""
    spans = list(spans) if spans is not None else None
    if spans is None or len(spans) != len(texts):
        raise UsageError(f"reward function {name!r}: answer_spans returned {None if spans is None else len(spans)} "
                         f"spans for {len(texts)} completions; return one (start, end) or None per completion.")
    out = []
    for span, text in zip(spans, texts):
        if span is None:
            out.append(None)
            continue
        ok = isinstance(span, (tuple, list)) and len(span) == 2 and all(isinstance(v, int) for v in span)
        if not ok or not 0 <= span[0] < span[1] <= len(text):
            raise UsageError(f"reward function {name!r}: answer_spans gave {span!r} for a completion of {len(text)} "
                             "characters; a span is (start, end) characters with 0 <= start < end <= len(text), or "
                             "None when the completion has no answer.")
        out.append((int(span[0]), int(span[1])))
    return out


def answer_token_mask(completion_ids: torch.Tensor, lengths: Sequence[int], spans: Sequence[tuple[int, int] | None],
                      decode: Callable[[list[int]], str]) -> torch.Tensor:
    """``(B, T)`` bool: the tokens whose decoded text overlaps each row's answer characters (none for None).

    A token that straddles the answer's first or last character counts (``42`` may share a token with ``{``).
    """
    mask = torch.zeros(completion_ids.shape, dtype=torch.bool)
    for i, (n, span) in enumerate(zip(lengths, spans)):
        if span is None or n <= 0:
            continue
        ids = completion_ids[i, :n].tolist()
        first, last = token_start(ids, span[0], decode), token_start(ids, span[1] - 1, decode)
        if first is not None and last is not None:
            mask[i, first : last + 1] = True
    return mask.to(completion_ids.device)
