"""Property test of the grader: generated answer/gold notations of equal and of different values.

For every generated item the shortcut path (``MathGrader()``) and the full path
(``MathGrader(fast_path=False)``: every completion through math-verify in a worker) give the same
label, and no completion whose answer has a different value from the gold's ever scores 1.0.
Derandomized (a fixed seed): every run checks the same items.
"""

import re
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from capo_trl.grader import MathGrader

_DENOMS = [1, 1, 1, 2, 3, 4, 5, 7, 8, 10, 12, 16, 20, 25, 100]
_SEPS = [" ", "\\,", "\\;", "\\:", "\\thinspace ", "\u00a0", "\u202f", "\u2009", "~", "\\ "]
_MINUS = ["-", "\u2212", "\u2013"]  # hyphen-minus, minus sign, en dash (leading: a minus)
_FULL = str.maketrans("0123456789", "０１２３４５６７８９")
_ARABIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
_SUP = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
_SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_VULGAR = {Fraction(1, 2): "½", Fraction(1, 4): "¼", Fraction(3, 4): "¾", Fraction(1, 3): "⅓", Fraction(2, 3): "⅔",
           Fraction(1, 5): "⅕", Fraction(1, 8): "⅛", Fraction(7, 8): "⅞"}  # fmt: skip


def _decimal(v: Fraction) -> str | None:
    """Exact decimal digits of ``v`` if it terminates within 6 places, else None."""
    for places in range(7):
        if (v * 10**places).denominator == 1:
            n = abs(v.numerator * 10**places // v.denominator)
            s = str(n).rjust(places + 1, "0")
            body = f"{s[:-places]}.{s[-places:]}" if places else s
            return ("-" if v < 0 else "") + body
    return None


def _grouped(n: int, sep: str) -> str:
    s = f"{abs(n):,}".replace(",", sep)
    return ("-" if n < 0 else "") + s


@st.composite
def notation(draw, v: Fraction) -> str:
    """One way of writing ``v`` that a careful reader takes for ``v``."""
    neg, a = v < 0, abs(v)
    minus = draw(st.sampled_from(_MINUS)) if neg else ""
    p, q = a.numerator, a.denominator
    forms = [f"{minus}\\frac{{{p}}}{{{q}}}", f"{minus}\\dfrac{{{2 * p}}}{{{2 * q}}}", f"{minus}{p}/{q}" if q > 1 else None]
    if neg and q > 1:
        forms.append(f"\\frac{{-{p}}}{{{q}}}")
    dec = _decimal(a)
    if dec is not None:
        forms += [minus + dec, minus + dec + ("0" if "." in dec else ".0"), minus + dec + ("00" if "." in dec else ".")]
    if q == 1:
        forms += [minus + str(p).translate(_FULL), minus + str(p).translate(_ARABIC), f"{minus}{{{p}}}"]
        if p >= 1000:
            forms.append(minus + _grouped(p, draw(st.sampled_from(_SEPS))))
    elif a in _VULGAR:
        forms.append(minus + _VULGAR[a])
    elif a < 1 and not neg:
        forms.append(f"{p}".translate(_SUP) + "\u2044" + f"{q}".translate(_SUB))
    if 1 < a < 2 and a - 1 in _VULGAR and not neg:
        forms.append("1" + _VULGAR[a - 1])  # a mixed number
    return draw(st.sampled_from([f for f in forms if f]))


values = st.builds(lambda n, d: Fraction(n, d), st.integers(-3000, 3000), st.sampled_from(_DENOMS))
big = st.builds(lambda i, c: Fraction(i * 100 + c, 100), st.integers(10**11, 10**14), st.integers(1, 99))


@st.composite
def big_notation(draw, v: Fraction) -> str:
    """A decimal of 14-18 significant digits, with up to two trailing zeros."""
    return _decimal(v) + draw(st.sampled_from(["", "0", "00"]))


@st.composite
def scientific(draw):
    """(value, a notation in scientific form: unambiguous ``AeB`` or ``A\\times10^{B}``)."""
    m = draw(st.sampled_from(["1", "1.5", "2.25", "3.3", "4.5", "6", "7"]))
    k = draw(st.integers(-12, 12))
    v = Fraction(m) * Fraction(10) ** k
    forms = [f"{m}\\times10^{{{k}}}", f"{m} \\times 10^{{{k}}}", f"{m}E{k}"]
    if "." in m or k >= 0 or m == "1":
        forms.append(f"{m}e{k}")
    return v, draw(st.sampled_from(forms))


@st.composite
def pair(draw):
    """(answer text, gold text, same value?)."""
    kind = draw(st.sampled_from(["plain", "plain", "plain", "big", "sci", "euler", "braces", "digits"]))
    if kind == "plain":
        v = draw(values)
        w = v if draw(st.booleans()) else draw(values | st.sampled_from([v + 1, v - 1, v * 10, v / 10, -v, v + Fraction(1, 2)]))
        return draw(notation(v)), draw(notation(w)), v == w
    if kind == "big":
        v = draw(big)
        w = v if draw(st.booleans()) else v + draw(st.sampled_from([Fraction(1, 100), Fraction(-1, 10), 1, 1000]))
        return draw(big_notation(v)), draw(big_notation(w)), v == w
    if kind == "sci":
        (v, a), (w, g) = draw(scientific()), draw(scientific())
        return a, g, v == w
    if kind == "euler":  # ``2e+1`` is 2e + 1 (Euler's e): never a power of ten
        m, k = draw(st.integers(2, 9)), draw(st.integers(1, 9))
        sign = draw(st.sampled_from(["+", "-"]))
        gold = draw(st.sampled_from([str(Fraction(m) * Fraction(10) ** int(sign + str(k))), f"{m}\\times10^{{{sign}{k}}}"]))
        return f"{m}e{sign}{k}", gold, False
    if kind == "braces":  # the same digits, grouped differently: a text-only answer must not match
        digits = draw(st.text("123456789", min_size=3, max_size=5))
        i, j = draw(st.integers(1, len(digits) - 1)), draw(st.integers(1, len(digits) - 1))
        shape = draw(st.sampled_from(["\\frac{{{a}}}{{{b}}}", "{a}^{{{b}}}", "\\sqrt{{{a}}}{b}", "\\sqrt[{a}]{{{b}}}"]))
        a, g = shape.format(a=digits[:i], b=digits[i:]), shape.format(a=digits[:j], b=digits[j:])
        if i == j:
            return a, g, True
        wrap = draw(st.sampled_from(["\\text{{{x}}}", "\\mathrm{{{x}}}", "{x}"]))
        return wrap.format(x=a), g, False
    # "digits": thousands groups against what the separator would make of them
    n = draw(st.integers(1000, 10**7))
    text = _grouped(n, draw(st.sampled_from(_SEPS)))
    parts = [int(x) for x in re.split(r"\D+", text)]
    product, total = 1, 0
    for x in parts:
        product, total = product * x, total + x
    g = draw(st.sampled_from([n, product, total, parts[-1]]))
    return text, str(g), g == n


_REASONING = st.sampled_from([
    "", "Let me think. ", "We have $x = 3$ and $y = 4$, so $x + y = 7$.\n",
    "First, $\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}$. Then we double it. ",
    "Numbers: 1 000, 2.50 and 3e-2 appear in the problem. ",
])  # fmt: skip
_ENDINGS = ["\\boxed{@}", "The answer is $\\boxed{@}$.", "\\[\\boxed{@}\\]", "The final answer is $@$",
            "\\boxed{0}. Wait, that is wrong. \\boxed{@}", "\\boxed{@"]  # the last: never closed (truncated)


@st.composite
def items(draw):
    answer, gold, same = draw(pair())
    ending = draw(st.sampled_from(_ENDINGS))
    text = draw(_REASONING) + ending.replace("@", answer)
    if draw(st.booleans()):
        text = [{"role": "user", "content": "Solve it."}, {"role": "assistant", "content": text}]
    return text, gold, same


@pytest.fixture(scope="module")
def graders():
    with MathGrader(timeout=5, workers=2) as fast, MathGrader(timeout=5, workers=2, fast_path=False) as full:
        yield fast, full


# No shrinking: a failing batch is reported as it is (its assertion lists the offending items).
@settings(derandomize=True, max_examples=25, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(batch=st.lists(items(), min_size=16, max_size=16))
def test_shortcuts_agree_with_the_full_path_and_different_values_never_score_one(graders, batch):
    fast, full = graders
    texts, golds = [t for t, _, _ in batch], [g for _, g, _ in batch]
    ours, ref = fast.grade(texts, golds), full.grade(texts, golds)
    disagree = [(t, g, a, b) for t, g, a, b in zip(texts, golds, ours, ref) if a != b]
    assert not disagree, disagree
    paid = [(t, g) for (t, g, same), s in zip(batch, ours) if not same and s == 1.0]
    assert not paid, paid


def test_the_property_test_is_not_vacuous(graders):
    """Equal values in these notations do score 1.0 (so the assertions above have something to bite)."""
    fast, _ = graders
    pairs = [("\\frac{3}{4}", "0.75"), ("1 000", "1000"), ("–3", "-3"), ("٣", "3"), ("²⁄₃", "\\frac{2}{3}"),
             ("1234567890123.450", "1234567890123.45"), ("4.5e-3", "0.0045"), ("2e+1", "1+2e"), ("15.", "15")]  # fmt: skip
    assert fast.grade([f"\\boxed{{{a}}}" for a, _ in pairs], [g for _, g in pairs]) == [1.0] * len(pairs)
