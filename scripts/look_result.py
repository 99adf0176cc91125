"""At a real-model study's look: write its result constant in scripts/results_evidence.py from its records.

    python scripts/look_result.py smollm2-pick-guess-half REPLICATION_RESULT

The constant (``None`` before the look) becomes ``measure_real`` of the committed records, rounded as printed, in
the file's own style; ``tests/test_tasks.py`` then holds it equal to the files, and the demo, the first screen and
the recommendation block read it. Refused, changing nothing, before the study's look, and for a constant that
already holds another value (a look is written once).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "scripts" / "results_evidence.py"
WIDTH = 116


def literal(value) -> str:
    """``value`` as Python source: double-quoted strings, tuples, lists and dicts, nothing else."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "(" + ", ".join(map(literal, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise TypeError(f"{type(value).__name__} is not a literal the result constants hold")


def wrapped(value, column: int) -> str:
    """``literal(value)`` starting at ``column``; a list or dict too long for the line puts one element per line,
    aligned after its opening bracket."""
    flat = literal(value)
    if column + len(flat) <= WIDTH or not isinstance(value, (list, dict)) or len(value) < 2:
        return flat
    inner = column + 1
    if isinstance(value, list):
        parts = [wrapped(v, inner) for v in value]
        return "[" + (",\n" + " " * inner).join(parts) + "]"
    parts = []
    for k, v in value.items():
        key = f"{literal(k)}: "
        parts.append(key + wrapped(v, inner + len(key)))
    return "{" + (",\n" + " " * inner).join(parts) + "}"


def assignment(name: str, value: dict) -> str:
    """``NAME: dict | None = {...}`` with the dict's items packed into lines of at most WIDTH characters (an item
    too long for a line of its own is wrapped by :func:`wrapped`), continuation lines indented by four."""
    lines, line = [], f"{name}: dict | None = {{"
    for i, (key, item) in enumerate(value.items()):
        tail = "," if i < len(value) - 1 else "}"
        piece = f"{literal(key)}: {literal(item)}{tail}"
        if line.endswith("{") and len(line) + len(piece) <= WIDTH or len(line) + 1 + len(piece) <= WIDTH:
            line += ("" if line.endswith("{") else " ") + piece
            continue
        if not line.endswith("{"):
            lines.append(line)
            line = "   "  # the next item starts a line of its own, indented by four
        key_text = f"{literal(key)}: "
        line += " " + key_text + wrapped(item, len(line) + 1 + len(key_text)) + tail
        if "\n" in line:
            lines.append(line)
            line = "   "
    if line.strip():
        lines.append(line)
    text = "\n".join(lines)
    assert ast.literal_eval(text.split(" = ", 1)[1]) == value
    return text


def write(text: str, name: str, value: dict) -> str:
    """``text`` (evidence.py) with ``name = None`` replaced by ``value``; a ValueError if it holds another value."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            held = ast.literal_eval(node.value)
            if held == value:
                return text
            if held is not None:
                raise ValueError(f"{name} already holds another result (a look is written once): {held!r}")
            lines = text.splitlines(keepends=True)
            start, end = node.lineno - 1, node.end_lineno
            return "".join(lines[:start]) + assignment(name, value) + "\n" + "".join(lines[end:])
    raise ValueError(f"{name} is not a constant of {EVIDENCE.name}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    folder, name = argv
    import results_evidence as evidence
    from capo_trl.harness.study import load_study

    result = evidence.measure_real(load_study(ROOT / "docs" / "results" / folder))
    if not result["look"]:
        print(f"{folder} has not had its look: {result}; nothing written", file=sys.stderr)
        return 1
    try:
        EVIDENCE.write_text(write(EVIDENCE.read_text(), name, result))
    except ValueError as err:
        print(f"{err}; nothing written", file=sys.stderr)
        return 1
    print(f"wrote {name} from {folder}'s look")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
