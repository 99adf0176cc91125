"""Module and function sizes of a source tree: the modules over ``--module-lines`` and the functions
over ``--function-lines`` (lines from ``def`` to the last line of the body, docstring included).

    python scripts/code_sizes.py src/capo_trl
    git archive REV src | tar -x -C /tmp/rev && python scripts/code_sizes.py /tmp/rev/src/capo_trl
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, module) for every module and (lines, module:function) for every function under ``root``."""
    modules, functions = [], []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(root))
        modules.append((len(text.splitlines()), name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    return sorted(modules, reverse=True), sorted(functions, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--module-lines", type=int, default=400)
    parser.add_argument("--function-lines", type=int, default=60)
    args = parser.parse_args()
    modules, functions = sizes(args.root)
    print(f"{len(modules)} modules, {sum(n for n, _ in modules)} lines; largest {modules[0][0]} ({modules[0][1]})")
    print(f"modules over {args.module_lines} lines:")
    for n, name in modules:
        if n > args.module_lines:
            print(f"  {n:5d}  {name}")
    print(f"{len(functions)} functions; functions over {args.function_lines} lines:")
    for n, name in functions:
        if n > args.function_lines:
            print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
