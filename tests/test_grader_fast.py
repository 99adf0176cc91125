"""The grader's exact shortcuts, deduplication, cache and chunks: never a label the full path would not give."""

import random
from fractions import Fraction
from pathlib import Path

import pytest
from capo_trl.testing.reward_workloads import grpo_workload, missing_files, mixed_workload, write_sample

from capo_trl.grader import MathGrader
from capo_trl.grader.fast import answer_key, fast_verdict, plain_number
from capo_trl.grader.normalize import prepared_text
from capo_trl.grader.worker import CORRECT, WRONG

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


@pytest.fixture(scope="module")
def graders():
    with MathGrader(timeout=5, workers=2) as fast, MathGrader(timeout=5, workers=2, fast_path=False) as full:
        yield fast, full


def _shared_or_sample(tmp_path_factory) -> Path:
    """The shared benchmark files, or (CI without them) the sample shipped with the tests, split per file."""
    if SHARED.is_dir() and not missing_files(SHARED):
        return SHARED
    return write_sample(tmp_path_factory.mktemp("benchmarks"), Path(__file__).parent / "data" / "benchmarks_sample.jsonl")


@pytest.mark.parametrize(
    "text, key",
    [
        ("Some reasoning, $x = 3$.\nThe answer is $\\boxed{5}$.", "5"),
        ("Putting it together, \\[\\boxed{\\frac{1}{2}}\\]", "\\frac{1}{2}"),
        ("so $x = \\boxed{ 3 }$ and we are done", "3"),
        ("$\\boxed{7}$ and $\\boxed{8}$", None),  # two boxes: math-verify reads a set
        ("\\boxed{\\fbox{1}}", None),  # latex2sympy unboxes \fbox too
        ("The final answer is $\\boxed{4}$. I hope it is correct.", None),  # a priority-0 pattern of its own
        ("\\boxed{a$b}", None),  # a $ inside could end an environment early
        ("$\\boxed{50}$\\%", None),  # a percent sign after the box converts the value
        ("\\boxed{}", None),
        ("\\boxed{\\frac{1}{2}", None),  # unbalanced
        ("\\boxed {3}", None),  # not the pattern math-verify looks for
        ("the answer is 3", None),
    ],
)
def test_answer_key(text, key):
    assert answer_key(prepared_text(text)) == key


def test_fast_verdict_rules():
    assert fast_verdict("\\frac{1}{2}", "\\frac{1}{2}") == CORRECT
    assert fast_verdict("12", "13") == WRONG
    assert fast_verdict("0.5", "\\frac{1}{2}") == CORRECT
    assert fast_verdict("-\\frac{3}{6}", "-0.5") == CORRECT
    assert fast_verdict("1.5", "2") == WRONG
    assert fast_verdict("0.3333333", "\\frac{1}{3}") is None  # math-verify rounds floats: the workers decide
    assert fast_verdict("x+1", "1+x") is None
    assert plain_number("007") is None and plain_number("-0") is None and plain_number("1,000") is None
    assert plain_number("-\\dfrac{2}{4}") == Fraction(-1, 2)


def _same_as_full(graders, completions, golds):
    fast, full = graders
    ours, ref = fast.grade(completions, golds), full.grade(completions, golds)
    diff = [(c, g, a, b) for c, g, a, b in zip(completions, golds, ours, ref) if a != b]
    assert not diff, diff
    return ours


def test_tricky_texts_match_the_full_path(graders):
    boxes = ["5", "\\frac{1}{2}", "0.5", "x+1", "(1, 2)", "50\\%", "2\\sqrt{3}", "6"]
    wrappers = [
        "{b}", "$\\boxed{{{b}}}$", "$$\\boxed{{{b}}}$$", "\\[\\boxed{{{b}}}\\]", "\\(\\boxed{{{b}}}\\)",
        " [\\boxed{{{b}}}] ", "$x = \\boxed{{{b}}}$.", "\\boxed{{{b}}}}}", "The final answer is $\\boxed{{{b}}}$. I hope",
        "$\\boxed{{{b}}}$ percent", "\\boxed{{{b}}} and \\boxed{{{b}}}", "Answer: $\\boxed{{{b}}}$\n$$ y $$",
        "$$ a = 1\n\\boxed{{{b}}} $$", "\\boxed{{7}}. Wait, no. \\boxed{{{b}}}",
    ]
    golds = ["5", "\\frac12", "\\frac{1}{2}", "1+x", "(1,2)", "50", "\\sqrt{12}", "6"]
    completions, gs = [], []
    for b in boxes:
        for w in wrappers:
            text = w.format(b=b) if w != "{b}" else f"\\boxed{{{b}}}"
            for g in golds:
                completions.append("Reasoning with $a = 2$ first.\n" + text)
                gs.append(g)
    ours = _same_as_full(graders, completions, gs)
    assert ours.count(1.0) > 50 and ours.count(0.0) > 50


def test_equal_numbers_in_other_notations(graders):
    rng = random.Random(0)
    completions, golds = [], []
    for _ in range(120):
        v = Fraction(rng.randint(-500, 500), rng.choice([1, 2, 4, 5, 8, 10, 3]))
        w = v + rng.choice([0, 0, Fraction(1, 7), Fraction(-3, 2)])
        def forms(x):
            return [f"{'-' if x < 0 else ''}\\frac{{{abs(x.numerator) * 3}}}{{{x.denominator * 3}}}"] + (
                [str(x.numerator)] if x.denominator == 1 else []) + (
                [f"{float(x):.6f}"] if (10**6 * x).denominator == 1 else [])  # fmt: skip
        completions.append(f"So $\\boxed{{{rng.choice(forms(v))}}}$.")
        golds.append(rng.choice(forms(w)))
    _same_as_full(graders, completions, golds)


def test_workloads_on_benchmark_files_match_the_full_path(graders, tmp_path_factory):
    shared = _shared_or_sample(tmp_path_factory)
    fast, _ = graders
    items, _ = mixed_workload(shared, per_file=40)
    grpo = grpo_workload(shared, problems=48, epochs=2)
    before = fast.stats
    for chunk in (items, grpo):
        for i in range(0, len(chunk), 64):
            part = chunk[i : i + 64]
            ours = _same_as_full(graders, [c for c, *_ in part], [g for _, g, *_ in part])
            wrong_label = [(c[-60:], g, s, lab) for (c, g, lab, _), s in zip(part, ours) if s != lab]
            assert len(wrong_label) <= 0.02 * len(part), wrong_label
    after = fast.stats
    graded = after["graded"] - before["graded"]
    assert after["fast_path"] - before["fast_path"] > 0.3 * graded
    assert after["cached"] > before["cached"]  # the second epoch reuses verdicts of the first
    assert after["worker_tasks"] - before["worker_tasks"] < 0.3 * graded


def test_cache_is_bounded_and_optional():
    with MathGrader(timeout=5, workers=1, cache_size=2) as g:
        g.grade([f"\\boxed{{x+{k}}}" for k in range(5)], ["x"] * 5)
        assert len(g._verdicts) == 2
    with MathGrader(timeout=5, workers=1, cache_size=0) as g:
        g.grade(["\\boxed{x+1}"], ["x"])
        assert not g._verdicts
        assert g.grade(["\\boxed{x+1}"], ["x"]) == [0.0] and g.stats["cached"] == 0
    with pytest.raises(ValueError, match="cache_size"):
        MathGrader(cache_size=-1)
    with pytest.raises(ValueError, match="fast_path"):
        MathGrader(fast_path="yes")


def test_plain_number_golds_need_no_worker():
    with MathGrader(timeout=5, workers=1) as g:
        out = g.grade(["\\boxed{12}", "$\\boxed{13}$", "\\boxed{0.5}", "\\boxed{\\frac{24}{2}}"], ["12", "12", "1/2", "12"])
        assert out[:2] == [1.0, 0.0] and out[3] == 1.0
        assert g.stats["worker_tasks"] == 1  # "1/2" is not written as a plain number; \frac{24}{2} is


def test_a_hanging_answer_in_a_chunk_costs_only_itself():
    with MathGrader(timeout=1, workers=2) as g:
        preds = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{x+2}", "\\boxed{2+x}", "\\boxed{x+3}"]
        out = g.grade(preds, ["x+2"] * 4)  # an unknown gold: the chunk is its probe
        assert out == [0.0, 1.0, 1.0, 0.0]
        assert g.stats["timed_out"] == 1
        assert g.grade(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{x}"], ["x"] * 2) == [0.0, 1.0]  # a known gold


def _plain_number_texts(rng: random.Random) -> list[str]:
    """Completions whose one box holds an integer or a decimal (shortcut) or something close to one (workers)."""
    values = ["47", "-3", "0", "12.5", "0.25", "-0.75", "\\frac{3}{4}", "-\\frac{1}{2}", "\\dfrac{6}{8}", "1.50",
              "007", "1,000", "-0", "7+", "x+1", "3.0", "1e3", "10^{2}", "\\sqrt{4}", "2/4"]
    wrappers = ["{v}", " 48-?={v}. \\boxed{{{v}}}", "So $\\boxed{{{v}}}$.", "\\boxed{{ {v} }}", "\\[\\boxed{{{v}}}\\]",
                "\\boxed{{{v}}}.", "\\boxed{{1}} then \\boxed{{{v}}}", "\\boxed{{{v}}}\\%", "\\boxed{{{v}", "it is {v}"]
    texts = [w.format(v=v) for v in values for w in wrappers]
    texts += [f"\\boxed{{{rng.randint(-999, 999)}}}" for _ in range(20)]
    return texts


def test_extract_in_process_matches_the_workers(graders):
    fast, full = graders
    texts = _plain_number_texts(random.Random(1))
    ours, ref = fast.extract(texts), full.extract(texts)
    diff = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b]
    assert not diff, diff
    assert sum(a is not None for a in ours) > 100  # most of them read an answer


def test_extract_of_plain_numbers_needs_no_worker():
    with MathGrader(timeout=5, workers=1) as g:
        assert g.extract(["48-?=47. \\boxed{47}", "$\\boxed{-12}$", "\\boxed{0.25}"]) == ["47", "-12", "0.25"]
        assert g._worker_pids() == []  # no pool was started
        assert g.extract(["\\boxed{7+}"]) == ["7+"] and g._worker_pids()  # not a plain number: a worker reads it


def test_equivalent_of_plain_numbers_matches_the_workers(graders):
    fast, full = graders
    rng = random.Random(2)
    numbers = ["47", "48", "-3", "0", "0.5", "\\frac{1}{2}", "\\frac{2}{4}", "-\\frac{1}{2}", "-0.5", "12.5",
               "\\frac{25}{2}", "0.3333333", "\\frac{1}{3}", "1000000", "1000001", "3.0", "3"]
    pairs = [(a, b) for a in numbers for b in numbers if a != b]
    pairs += [(str(rng.randint(-50, 50)), str(rng.randint(-50, 50))) for _ in range(30)]
    with MathGrader(timeout=5, workers=1) as alone:
        for a, b in pairs:
            assert alone.equivalent(a, b) == full.equivalent(a, b), (a, b)
        assert alone.equivalent("47", "48") is False and alone.equivalent("0.5", "\\frac{1}{2}") is True
    with MathGrader(timeout=5, workers=1) as g:
        g.equivalent("47", "48"), g.equivalent("-\\frac{1}{2}", "-0.5")
        assert g._worker_pids() == []  # both decided without a worker
