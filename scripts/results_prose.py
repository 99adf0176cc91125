"""Every decimal number in the prose of the results pages is cited to a committed file, and checked.

    python scripts/results_prose.py            exit 1, naming each number that differs from its citation
    python scripts/results_prose.py --cite     (re)write docs/results/citations.json and print new citations

The prose of a results page (docs/results/README.md and docs/results/<study>/README.md) is its text outside
the blocks that scripts/results_tables.py renders, code and link targets. Each decimal number in it, in order,
has a citation in ``citations.json``: ``{"at": [file, key, ...]}`` (a JSON value; a CSV cell is
``[file.csv, row, column]``), ``{"block": NAME, "i": i}`` (the i-th number of a rendered block on the same
page), ``{"minus": [a, b]}``, ``{"mean": [a, ...]}``, each with an optional ``"scale"`` (100 for percent or
points, 1/60 for minutes from seconds). The check formats the cited value with the decimals the prose uses:
a number changed in the prose, in a file or in the citation fails. A number with three decimals or more is a
measured value and must be cited; one with fewer (points, minutes, settings, rounded figures) is checked
where a citation was written, and otherwise only held to what the prose said when it was cited. ``--cite``
keeps every citation that still holds, searches one for each new number (three decimals or more) among the
page's rendered blocks, then its study's files, then the files of the studies it links (read what it
prints: a value can match by coincidence), and leaves a number that replaced another to be cited by hand.
Whole numbers are not cited.
"""

from __future__ import annotations

import csv
import difflib
import functools
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
CITATIONS = RESULTS / "citations.json"
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?![\w.])")
BLOCK = re.compile(r"<!-- (table|text): ([\w-]+) \(rendered by scripts/results_tables\.py\) -->\n(.*?)<!-- end \1 -->",
                   re.DOTALL)


def pages() -> list[Path]:
    return [RESULTS / "README.md", *sorted(RESULTS.glob("*/README.md"))]


def prose(text: str) -> str:
    """The page without its rendered blocks, code blocks, code spans, link targets and comments."""
    for pattern in (BLOCK, re.compile(r"```.*?```", re.DOTALL), re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"),
                    re.compile(r"<!--.*?-->", re.DOTALL)):
        text = pattern.sub(" ", text)
    return text


def result(written: str) -> bool:
    """Three decimals or more: a measured value, which must be cited (fewer: cited where a citation was written)."""
    return len(written.split(".")[1]) >= 3


def numbers(page: Path) -> list[str]:
    return NUMBER.findall(prose(page.read_text()))


@functools.cache
def _load(path: str):
    """A result file (JSON, or a CSV's rows) or a page's text, read once per process."""
    if path.endswith(".csv"):
        with open(RESULTS / path, newline="") as f:
            return list(csv.DictReader(f))
    return json.loads((RESULTS / path).read_text()) if path.endswith(".json") else Path(path).read_text()


def _at(path: str, keys: list):
    found = _load(path)
    for key in keys:
        found = found[key]
    return found


def value(page: Path, source: dict) -> float:
    """The cited value, scaled."""
    scale = source.get("scale", 1.0)
    if "at" in source:
        path, *keys = source["at"]
        return scale * float(_at(path, keys))
    if "block" in source:
        blocks = {m[2]: m[3] for m in BLOCK.finditer(_load(str(page)))}
        return scale * float(NUMBER.findall(blocks[source["block"]])[source["i"]])
    if "minus" in source:
        a, b = source["minus"]
        return scale * (value(page, a) - value(page, b))
    return scale * statistics.mean(value(page, s) for s in source["mean"])


def holds(page: Path, written: str, source: dict | None) -> bool:
    if source is None:
        return False
    digits = len(written.split(".")[1])
    try:
        return f"{abs(value(page, source)):.{digits}f}" == written.lstrip("+-")
    except (KeyError, IndexError, ValueError, TypeError, FileNotFoundError):
        return False


def check() -> list[str]:
    """One line per number that is not cited, or whose citation does not give it."""
    cited, problems = json.loads(CITATIONS.read_text()), []
    for page in pages():
        name, found = str(page.relative_to(RESULTS)), numbers(page)
        entries = cited.get(name, [])
        for i, written in enumerate(found):
            entry = entries[i] if i < len(entries) else None
            if entry is not None and entry[0] == written and entry[1] is None and not result(written):
                continue  # a setting, a range or a rounded figure that no file holds: not checked
            if entry is None or entry[0] != written:
                was = f"cited as {entry[0]}" if entry else "not cited"
                problems.append(f"docs/results/{name}: number {i + 1} of the prose is {written}, {was}; if a file says "
                                f"so, re-cite with: python scripts/results_prose.py --cite")
            elif entry[1] and "changed_from" in entry[1]:
                problems.append(f"docs/results/{name}: {written} (number {i + 1}) replaced {entry[1]['changed_from']}; "
                                f"cite the file that gives it by hand in {CITATIONS.name}, or fix the prose.")
            elif not holds(page, written, entry[1]):
                problems.append(f"docs/results/{name}: {written} (number {i + 1}) is not what its citation "
                                f"{json.dumps(entry[1])} gives ({value(page, entry[1]):.6g}); fix the prose.")
        if len(entries) > len(found):
            problems.append(f"docs/results/{name}: {len(entries) - len(found)} cited numbers are gone from the prose; "
                            f"re-cite with: python scripts/results_prose.py --cite")
    return problems


# ------------------------------------------------------------------------------------ --cite
def _leaves(obj, keys: list):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, [*keys, k])
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, [*keys, i])
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield keys


def _file_sources(folder: Path, history: bool):
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(RESULTS))
        if path.suffix == ".json" and path != CITATIONS:
            for keys in _leaves(json.loads(path.read_text()), []):
                if ("history" in keys) == history and not isinstance(_at(rel, keys), int):  # validation curves last
                    yield {"at": [rel, *keys]}  # (whole numbers are counts and seeds, not results)
        elif path.suffix == ".csv" and (path.name == "metrics.csv") == history:
            with open(path, newline="") as f:
                for r, row in enumerate(csv.DictReader(f)):
                    for column, cell in row.items():
                        if re.fullmatch(r"[-+]?\d*\.\d+(e[-+]?\d+)?", cell or ""):
                            yield {"at": [rel, r, column]}


def candidates(page: Path):
    """Where a number on ``page`` may come from, nearest first."""
    for m in BLOCK.finditer(page.read_text()):
        for i, _ in enumerate(NUMBER.findall(m[3])):
            yield {"block": m[2], "i": i}
    own = [page.parent] if page.parent != RESULTS else []
    linked = {RESULTS / (page.parent / t).resolve().relative_to(RESULTS).parts[0]
              for t in re.findall(r"\]\((\.\./[\w-]+)/", page.read_text())} - set(own)
    for folder in [*own, *sorted(linked)]:
        yield from _file_sources(folder, history=False)


def cite() -> list[str]:
    """Rewrite citations.json, aligning the numbers with the old ones: keep each citation that still holds,
    search one for a new number, and mark a number that replaced another as ``changed_from`` (an error until
    it is cited by hand, so a wrong number cannot be laundered through a coincidental match)."""
    old = json.loads(CITATIONS.read_text()) if CITATIONS.exists() else {}
    new, missing = {}, []
    for page in pages():
        name, before, found, entries = str(page.relative_to(RESULTS)), old.get(str(page.relative_to(RESULTS)), []), \
            numbers(page), []
        matcher = difflib.SequenceMatcher(None, [w for w, _ in before], found, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for k, written in enumerate(found[j1:j2]):
                source = before[i1 + k][1] if tag == "equal" else None
                if tag == "equal" and source is not None and not holds(page, written, source):
                    source = None  # its file changed
                if tag == "replace":
                    source = {"changed_from": before[i1 + k][0] if i1 + k < i2 else None}
                elif source is None and result(written):
                    source = next((s for s in candidates(page) if holds(page, written, s)), None)
                    print(f"docs/results/{name}: {written} <- {json.dumps(source)}")
                if source is None and result(written) or source and "changed_from" in source:
                    missing.append(f"docs/results/{name}: {written}")
                entries.append([written, source])
        new[name] = entries
    CITATIONS.write_text(json.dumps(new, indent=1) + "\n")
    return missing


def main(argv: list[str]) -> int:
    problems = [f"no file gives {m}; cite it by hand in {CITATIONS.name} or rewrite it" for m in cite()] \
        if "--cite" in argv else check()
    print("\n".join(problems))
    return int(bool(problems))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
