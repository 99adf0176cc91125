"""Exact shortcuts in the parent process: when math-verify's verdict is known without running it.

math-verify (``first_match`` extraction, the boxed pattern at priority 0) reads a completion by
the rightmost-ending priority-0 match: the plain ``\\boxed{...}`` pattern, a math environment
holding the box, or "final answer is ... I hope". latex2sympy's normalisation then keeps only the
content of the last box in that match, stripped. So when the text math-verify is given holds
exactly one ``\\boxed{`` (and no ``\\fbox``, which it also unboxes), no "I hope", no math
delimiter or bracket-space inside the box that could end an environment early, and no percent
sign after it, every candidate match reduces to the box content: the verdict is that of
``\\boxed{content}`` alone, whatever reasoning comes before. :func:`answer_key` returns that
content (else None), and it is what grading is deduplicated and cached on.

:func:`fast_verdict` then decides two cases without sympy: the same content as the gold's box
(math-verify compares the extracted strings first: correct once the gold parses) and two plain
numbers that differ by far more than math-verify's rounding (wrong). Everything else goes to the
workers. Numbers are ASCII digits only, decimals without trailing zeros (the normalisation strips
them, and math-verify compares equal decimals of 16+ digits written with different trailing zeros
as different). ``tests/test_grader_fast.py`` checks both against the full path on the benchmark
files, ``tests/test_grader_properties.py`` on generated notations.
"""

from __future__ import annotations

import re
from fractions import Fraction

from .worker import _BOX_OPEN, CORRECT, WRONG

_PERCENT = re.compile(r"%|percent|pct", re.IGNORECASE)
_CLOSES_ENV = re.compile(r"\$|\\\)|\\\]|\][\s]")  # ends a $..$, \(..\), \[..\] or " [..] " environment
_INT = r"-?(?:0|[1-9][0-9]{0,17})"
_NUMBER = re.compile(rf"(?P<int>{_INT})(?:\.(?P<dec>[0-9]{{0,11}}[1-9]))?")
_FRAC = re.compile(r"(?P<neg>-?)\\[dt]?frac\{(?P<p>[0-9]{1,18})\}\{(?P<q>[1-9][0-9]{0,17})\}")
_INTEGER = re.compile(_INT)
# math-verify calls floats equal when they agree to 6 decimals; far beyond that they differ.
_APART = Fraction(1, 10**4)


def _box_end(text: str, start: int) -> int | None:
    """Index of the brace closing the box whose ``{`` is at ``start - 1`` (raw brace count, as latex2sympy)."""
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if not depth:
                return i
    return None


def answer_key(text: str) -> str | None:
    """The box content that alone decides math-verify's reading of ``text`` (prepared), or None."""
    if text.count("\\boxed") != 1 or "\\fbox" in text or "i hope" in text.lower():
        return None
    start = text.find(_BOX_OPEN)
    if start < 0:
        return None
    start += len(_BOX_OPEN)
    end = _box_end(text, start)
    if end is None:
        return None
    content = text[start:end]
    if not content.strip() or _CLOSES_ENV.search(content) or _PERCENT.search(text, end + 1):
        return None
    return content.strip()


def plain_number(s: str) -> Fraction | None:
    """An integer, a decimal or ``\\frac{p}{q}`` written plainly, as an exact fraction; else None."""
    if m := _NUMBER.fullmatch(s):
        if m["int"] == "-0" and not (m["dec"] or "").strip("0"):
            return None  # "-0": leave signed zeros to math-verify
        return Fraction(s)
    if m := _FRAC.fullmatch(s):
        value = Fraction(int(m["p"]), int(m["q"]))
        return -value if m["neg"] else value
    return None


def fast_verdict(answer: str, gold: str) -> int | None:
    """CORRECT / WRONG when certain without sympy (``gold`` parses), else None.

    ``answer`` and ``gold`` are box contents as :func:`answer_key` returns them.
    """
    if answer == gold:
        return CORRECT
    a, g = plain_number(answer), plain_number(gold)
    if a is None or g is None:
        return None
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
        return WRONG  # two integers written canonically and differently: different values
    if a == g:
        return CORRECT  # equal values in any of these notations (sympy: an exact numeric match)
    if abs(a - g) > _APART * max(1, abs(a), abs(g)):
        return WRONG
    return None
