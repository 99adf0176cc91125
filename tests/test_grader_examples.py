"""Answers the grader once paid although wrong, shortcuts that once disagreed with the full path,
and right answers that once scored 0.0: each graded on both paths."""

import pytest

from capo_trl.grader import MathGrader
from capo_trl.grader.fast import fast_verdict, plain_number
from capo_trl.grader.normalize import _canon, _normalize


@pytest.fixture(scope="module")
def graders():
    with MathGrader(timeout=5, workers=2) as fast, MathGrader(timeout=5, workers=2, fast_path=False) as full:
        yield fast, full


WRONG = [  # (completion, gold): different values
    ("\\boxed{\\frac{11}{2}", "\\frac{1}{12}"),  # box never closed: text only, braces dropped
    ("\\boxed{\\frac{12}{3}", "\\frac{1}{23}"),
    ("\\boxed{\\text{\\sqrt{2}3}}", "\\sqrt{23}"),
    ("\\boxed{\\text{2^{1}0}}", "2^{10}"),
    ("\\boxed{\\mathrm{2^{1}0}}", "2^{10}"),
    ("\\boxed{\\frac{11}{2}", "\\frac{11}{2}"),  # the right digits, but the box never closes
    ("\\boxed{2\u00a0000}", "0"),  # a no-break space read as 2*000
    ("\\boxed{2 000}", "0"),
    ("\\boxed{1\\,251}", "252"),  # latex2sympy reads 1\,251 as 1+251
    ("\\boxed{1\\;251}", "252"),
    ("\\boxed{1\\thinspace 251}", "252"),
    ("\\boxed{2e+1}", "20"),  # 2e + 1 with Euler's e
    ("\\boxed{4e-3}", "0.004"),
    ("\\boxed{1–3}", "-2"),  # an en dash between operands may be a range: not a minus
    ("\\boxed{2 – 3}", "-1"),
    ("\\boxed{π–1}", "\\pi - 1"),
    ("\\boxed{x²⁄₃}", "\\frac{2x}{3}"),  # after a letter: not a fraction
    ("\\boxed{10 100 1000}", "10100000"),  # not thousands groups
]

RIGHT = [  # (completion, gold): the same value
    ("\\boxed{2\u00a0000}", "2000"),
    ("\\boxed{1\\,251}", "1251"),
    ("\\boxed{1 000}", "1000"),
    ("\\boxed{1\\;251}", "1251"),
    ("\\boxed{1\u2009251}", "1251"),
    ("\\boxed{12\u202f345\u202f678}", "12345678"),
    ("\\boxed{2e+1}", "1+2e"),
    ("\\boxed{4e-3}", "4e - 3"),
    ("\\boxed{1.5e-3}", "0.0015"),  # a decimal mantissa: scientific notation
    ("\\boxed{1e-5}", "0.00001"),
    ("\\boxed{4.5e33}", "4.5 \\times 10^{33}"),
    ("\\boxed{1234567890123.45}", "1234567890123.450"),  # 16+ significant digits
    ("\\boxed{1234567890123.4500}", "1234567890123.45"),
    ("\\boxed{0.٥}", "0.5"),  # Arabic-Indic digits
    ("\\boxed{1٣}", "13.0"),
    ("\\boxed{\\frac{١}{2}}", "0.5"),
    ("\\boxed{7}", "٧"),
    ("\\boxed{ℝ}", "\\mathbb{R}"),
    ("\\boxed{\\mathbb{R}}", "ℝ"),
    ("\\boxed{ℤ}", "\\mathbb{Z}"),
    ("\\boxed{ℕ}", "\\mathbb{N}"),
    ("\\boxed{ℂ}", "\\mathbb{C}"),
    ("\\boxed{ℚ}", "\\mathbb{Q}"),
    ("\\boxed{–3}", "-3"),  # en dash as a minus
    ("\\boxed{‐3}", "-3"),  # hyphen
    ("\\boxed{(–1, 2)}", "(-1, 2)"),
    ("\\boxed{²⁄₃}", "\\frac{2}{3}"),
    ("\\boxed{1²⁄₃}", "\\frac{5}{3}"),  # a mixed number, as 1⅔
    ("\\boxed{√\\frac{1}{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{√½}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{15.}", "15"),
    ("The final answer is $15.$", "15"),
    ("\\boxed{2.50}", "\\frac{5}{2}"),
    ("\\boxed{E_1, E_2}", "E_{1},E_{2}"),
]


def _both(graders, pairs):
    fast, full = graders
    texts, golds = [c for c, _ in pairs], [g for _, g in pairs]
    return fast.grade(texts, golds), full.grade(texts, golds)


def test_wrong_answers_score_zero_on_both_paths(graders):
    ours, ref = _both(graders, WRONG)
    paid = [(c, g, a, b) for (c, g), a, b in zip(WRONG, ours, ref) if a != 0.0 or b != 0.0]
    assert not paid, paid


def test_right_answers_score_one_on_both_paths(graders):
    ours, ref = _both(graders, RIGHT)
    missed = [(c, g, a, b) for (c, g), a, b in zip(RIGHT, ours, ref) if a != 1.0 or b != 1.0]
    assert not missed, missed


def test_chat_messages_and_dollars_too(graders):
    fast, full = graders
    texts = [[{"role": "assistant", "content": "So $\\boxed{\\text{2^{1}0}}$."}],
             [{"role": "assistant", "content": "So $\\boxed{1\\,251}$."}]]  # fmt: skip
    for g in (fast, full):
        assert g.grade(texts, ["2^{10}", "1251"]) == [0.0, 1.0]


def test_shortcuts_take_ascii_digits_and_exact_decimals_only():
    assert plain_number("0.٥") is None and plain_number("1٣") is None and plain_number("\\frac{١}{2}") is None
    assert plain_number("١") is None  # such a gold is not taken as plain (and so is parse-checked)
    assert fast_verdict("0.٥", "0.5") is None and fast_verdict("1٣", "13") is None
    assert plain_number("1.50") is None and plain_number("2.0") is None  # trailing zeros: math-verify's Floats differ
    assert fast_verdict("1234567890123.45", "1234567890123.450") is None
    assert fast_verdict("1234567890123.45", "\\frac{123456789012345}{100}") == 1


def test_rewrites_keep_the_value():
    assert _normalize("\\boxed{2e+1} \\boxed{4e-3}") == "\\boxed{2e+1} \\boxed{4e-3}"  # Euler's e stays
    assert _normalize("4.5e33, 1e-5, 2E+1, 6e13") == "4.5\\times10^{33}, 1\\times10^{-5}, 2\\times10^{1}, 6\\times10^{13}"
    assert _normalize("1 000 and 1\\,251 and 2~000") == "1000 and 1251 and 2000"
    assert _normalize("3.141 592, 10 100 1000") == "3.141 592, 10 100 1000"
    assert _normalize("\\boxed{1.50\\overline{3}} 2.50 10.0 15.}") == "\\boxed{1.50\\overline{3}} 2.5 10 15}"
    assert _normalize("1–3, 2 – 3, –3") == "1–3, 2 – 3, -3"


def test_text_only_answers_keep_their_structure():
    assert _canon("\\frac{11}{2") != _canon("\\frac{1}{12}")
    assert _canon("\\text{\\sqrt{2}3}") != _canon("\\sqrt{23}")
    assert _canon("\\text{2^{1}0}") != _canon("2^{10}")
    assert _canon("\\pi x") != _canon("\\pix")
    assert _canon("E_{1},E_{2}") == _canon("E_1, E_2") == "e_1,e_2"
    assert _canon("\\text{Evelyn}") == _canon("Evelyn")
    assert _canon("\\frac{1}{2}") == _canon("\\frac12")  # the same TeX


def test_new_rewrites_are_linear():
    """They run in the parent process, outside any deadline: no input may make them slow."""
    import time

    for text in [" " * 20000 + "x é", (" " * 50 + "–") * 2000, "1." + "0" * 20000 + "1", " 000" * 20000,
                 "1." * 20000 + "é", "²" * 20000 + "/x", "1 e" * 20000]:  # fmt: skip
        t0 = time.perf_counter()
        _normalize(text)
        assert time.perf_counter() - t0 < 1.0, text[:20]
