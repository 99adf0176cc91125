"""Grading workloads built from benchmark gold answers, shared by ``benchmarks/bench_reward.py`` and the tests.

Each item is ``(completion, gold, label, kind)``: the label a careful grader should give.

- :func:`mixed_workload`: one of each kind per gold (correct, equivalent rewrite, anchored but
  unboxed, wrong, a corrected first guess): every item distinct.
- :func:`grpo_workload`: what a GRPO step grades: groups of ``group`` completions per problem
  sharing the gold, about half stating it verbatim, a tenth in another notation, the rest one of
  two wrong answers that repeat within the group; each with a few hundred characters of
  reasoning before the box, different per completion; ``epochs`` passes over the same problems.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

FILES = ["math500", "aime24", "amc23", "minerva", "olympiadbench"]
GRPO_FILES = ["math500", "math_train"]
PATHOLOGICAL = [
    r"So the answer is \boxed{9^{9^{9^{9}}}}",
    r"\boxed{(10^{7})!}",
    "\\boxed{" + "\\frac{1}{" * 2500 + "2" + "}" * 2500 + "}",
    "\\[" * 10000,
    r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}",
]
_STEPS = [
    "First, note that the expression simplifies once we collect like terms.",
    "Substituting $x = {a}$ gives ${a} + {b} = {c}$, which we keep for later.",
    "We can check the small cases by hand: $n = 1, 2, 3$ all satisfy the condition.",
    "By symmetry it suffices to consider the case where the first term is the largest.",
    "Multiplying both sides by ${b}$ clears the denominator.",
    "The discriminant is ${c}^2 - 4 \\cdot {a} \\cdot {b}$, so there are two real roots.",
    "Counting the complementary cases is easier: there are ${c}$ of them.",
    "Hence the quantity we want equals the previous result divided by ${a}$.",
]
_ENDINGS = [
    "Therefore, the final answer is $\\boxed{{{x}}}$.",
    "So the answer is $\\boxed{{{x}}}$.",
    "\n\n**Answer:** $\\boxed{{{x}}}$",
    "Putting it together, we get \\[\\boxed{{{x}}}\\]",
    "The answer is \\boxed{{{x}}}.",
]


def missing_files(shared: Path) -> list[str]:
    """The benchmark files the workloads read that ``shared`` lacks."""
    return [f"{name}.jsonl" for name in dict.fromkeys(FILES + GRPO_FILES) if not (shared / f"{name}.jsonl").is_file()]


def write_sample(out: Path, sample: Path) -> Path:
    """A sample of every benchmark (``tests/data/benchmarks_sample.jsonl`` in the repository), one file
    per benchmark in ``out`` (its MATH500 rows stand in for MATH train, which the sample lacks); returns ``out``."""
    rows_ = [json.loads(line) for line in sample.open()]
    out.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(FILES + GRPO_FILES):
        mine = [r for r in rows_ if r["benchmark"] == (name if name != "math_train" else "math500")]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
    return out


def rows(shared: Path, name: str, limit: int | None = None) -> list[dict]:
    """A benchmark file's rows (``{"answer": ...}`` at least), the first ``limit`` of them."""
    with (shared / f"{name}.jsonl").open() as f:
        out = [json.loads(line) for line in f]
    return out[:limit] if limit is not None else out


def rewrites(gold: str) -> list[tuple[str, float]]:
    """(completion, label) pairs that a correct grader scores 1.0 although the text differs."""
    g = gold.strip()
    out = []
    if re.fullmatch(r"-?\d+", g):
        n = int(g)
        out += [(rf"\boxed{{\frac{{{2 * n}}}{{2}}}}", 1.0), (rf"\boxed{{{n}.0}}", 1.0)]
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", g)
    if m:
        out += [(rf"\boxed{{{m[1]}{m[2]}/{m[3]}}}", 1.0), (rf"\boxed{{{m[1]}\dfrac{{{m[2]}}}{{{m[3]}}}}}", 1.0)]
        if len(m[2]) == 1 and len(m[3]) == 1:
            out.append((rf"\boxed{{{m[1]}\frac{m[2]}{m[3]}}}", 1.0))  # \frac12: valid TeX
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)", g)
    if m:
        out.append((rf"\boxed{{{m[1]} \times 10^{{{int(m[2])}}}}}", 1.0))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*\\times\s*10\^\{?(-?\d+)\}?", g)
    if m:
        out.append((rf"\boxed{{{m[1]}e{m[2]}}}", 1.0))
    m = re.fullmatch(r"(\d*)\\sqrt\{(\d+)\}", g)
    if m:
        out.append((rf"\boxed{{{m[1]}\sqrt {m[2]}}}" if len(m[2]) == 1 else rf"\boxed{{{m[1]} \sqrt{{{m[2]}}}}}", 1.0))
    return out


def wrong(gold: str, k: int = 1) -> str:
    """A boxed wrong answer for ``gold`` (``k`` picks one of several)."""
    g = gold.strip()
    if re.fullmatch(r"-?\d+", g):
        return rf"\boxed{{{int(g) + k}}}"
    if re.fullmatch(r"-?\d+\.\d+", g):
        return rf"\boxed{{{float(g) * (1 + k / 2):g}}}"
    if len(g) >= 40:
        return rf"\boxed{{{k - 1}}}"
    return rf"\boxed{{{g} + {k}}}" if k == 1 else rf"\boxed{{{k}\left({g}\right)}}"


def mixed_workload(shared: Path, per_file: int | None = None, seed: int = 0):
    """(items, pathological items): every kind once per gold of the five test benchmarks, shuffled."""
    rng = random.Random(seed)
    items = []
    for name in FILES:
        for r in rows(shared, name, per_file):
            g = r["answer"]
            items.append((f"Let me compute.\nThe answer is $\\boxed{{{g}}}$.", g, 1.0, "correct"))
            items.append((f"So the final answer is ${g}$", g, 1.0, "unboxed, anchored"))
            items.append((f"We find {wrong(g)}.", g, 0.0, "wrong"))
            items.append((f"First guess \\boxed{{{g}}}. Wait, that is off. Final: {wrong(g)}", g, 0.0, "wrong"))
            for c, label in rewrites(g):
                items.append((f"Hence {c}", g, label, "equivalent rewrite"))
    rng.shuffle(items)
    return items, [(c, "3", 0.0, "pathological") for c in PATHOLOGICAL]


def _reasoning(rng: random.Random) -> str:
    steps = []
    while sum(map(len, steps)) < rng.randint(200, 450):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        steps.append(rng.choice(_STEPS).format(a=a, b=b, c=a + b))
    return " ".join(steps) + "\n"


def grpo_workload(shared: Path, problems: int | None = None, group: int = 8, epochs: int = 2, seed: int = 0):
    """Items in step order: ``epochs`` passes over the problems, each problem a group of ``group``."""
    golds = [r["answer"] for name in GRPO_FILES for r in rows(shared, name)]
    rng = random.Random(seed)
    rng.shuffle(golds)
    golds = golds[:problems] if problems is not None else golds
    items = []
    for _ in range(epochs):
        for g in golds:
            other = rewrites(g)
            for _ in range(group):
                u = rng.random()
                if u < 0.5:
                    box, label, kind = f"\\boxed{{{g}}}", 1.0, "verbatim gold"
                elif u < 0.6:
                    box, label, kind = (rng.choice(other)[0], 1.0, "equivalent rewrite") if other else (
                        None, 1.0, "unboxed, anchored")
                else:
                    box, label, kind = wrong(g, rng.choice((1, 2))), 0.0, "wrong (repeats)"
                if box is None:
                    ending = f"So the final answer is ${g}$"
                else:
                    ending = rng.choice(_ENDINGS).replace("\\boxed{{{x}}}", box)
                items.append((_reasoning(rng) + ending, g, label, kind))
    return items
