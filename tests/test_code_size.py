"""The house's size rule for what users install: no function in the package over 80 lines (scripts/code_sizes.py
measures from ``def`` to the last line of the body, docstring included)."""

from pathlib import Path

from code_sizes import sizes

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "capo_trl"


def test_no_function_in_the_package_is_over_80_lines():
    _, functions = sizes(PACKAGE)
    assert functions and not [(n, name) for n, name in functions if n > 80]


def test_the_training_guide_stays_a_guide():
    """At most 300 lines: what to set and why; measurements live on the result pages it links to."""
    lines = (PACKAGE.parents[1] / "docs" / "training.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
