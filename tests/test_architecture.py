"""docs/architecture.md stays true: its folder table names every module, and every rule it states
holds on the real import graph (all imports, also those inside functions, read with ``ast``)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "capo_trl"
DOC = (ROOT / "docs" / "architecture.md").read_text()


# ------------------------------------------------------------------------------------ the doc's table
def layer_table() -> list[tuple[str, list[str]]]:
    """(layer, [module paths relative to the package]) for each row of the folder table, in order."""
    section = DOC.split("## Folders", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[\w/.]+`", cells[0]):
            continue
        layer = cells[0].strip("`")
        names = re.findall(r"`([\w]+\.py)`", cells[1])
        folder = layer if layer.endswith("/") else ""
        rows.append((layer, [folder + name for name in names]))
    return rows


LAYERS = layer_table()
RANK = {path: i for i, (_, paths) in enumerate(LAYERS) for path in paths}  # the layer's row
POSITION = {path: j for _, paths in LAYERS for j, path in enumerate(paths)}  # the place within its folder


def layer_of(path: str) -> str:
    return path.split("/", 1)[0] + "/" if "/" in path else path


def layer_rank(path: str) -> int:
    return next(i for i, (layer, _) in enumerate(LAYERS) if layer == layer_of(path))


# ------------------------------------------------------------------------------------ the code's graph
def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str) -> str | None:
    """``capo_trl.a.b`` -> ``a/b.py`` (``a/__init__.py`` for a folder; None outside the package)."""
    base = SRC / name.replace(".", "/")
    if base.with_suffix(".py").is_file():
        return str(base.with_suffix(".py").relative_to(PKG))
    if (base / "__init__.py").is_file():
        return str((base / "__init__.py").relative_to(PKG))
    return None


def imports(path: Path) -> list[tuple[str, int, bool, str]]:
    """(imported module path, line, inside a function, imported name) for every package import of ``path``."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if n is not f}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            head = ".".join(base + ([node.module] if node.module else []))
            # `from pkg import module` imports that module; `from module import name` the module
            targets = [(f"{head}.{a.name}" if module_path(f"{head}.{a.name}") else head, a.name) for a in node.names]
        else:
            continue
        for target, name in targets:
            if target.split(".")[0] == "capo_trl":
                out.append((module_path(target), node.lineno, id(node) in in_function, name))
    return out


MODULES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))
GRAPH = {m: imports(PKG / m) for m in MODULES}
EDGES = [(src, dst, line, lazy, name) for src, targets in GRAPH.items() for dst, line, lazy, name in targets]
ENTRY = {"__init__.py", "__main__.py"}  # the public names and `python -m capo_trl`: outside the layers


def in_layers(path: str) -> bool:
    return path not in ENTRY


# ------------------------------------------------------------------------------------ the tests
def test_the_table_reads_as_expected():
    assert len(LAYERS) >= 10 and LAYERS[0][0] == "errors.py" and LAYERS[-1][0] == "testing/"


def test_the_table_names_every_module_and_no_other():
    named = set(RANK)
    actual = {m for m in MODULES if in_layers(m) and Path(m).name not in ENTRY}
    assert not actual - named, f"modules the table in docs/architecture.md does not name: {sorted(actual - named)}"
    assert not named - actual, f"modules the table names that do not exist: {sorted(named - actual)}"
    assert len(named) == sum(len(paths) for _, paths in LAYERS), "a module is named twice"


def test_every_package_path_the_doc_names_exists():
    paths = set(re.findall(r"`((?:\w+/)+\w+\.py)`", DOC)) | set(re.findall(r"`(\w+/)`", DOC))
    missing = sorted(p for p in paths if not any((base / p).exists() for base in (PKG, SRC, ROOT)))
    assert not missing, missing


def test_the_top_level_holds_layers_and_few_modules():
    entries = [p.name for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()]
    assert len(entries) <= 14, sorted(entries)


@pytest.mark.parametrize("src, dst, line", sorted({(s, d, n) for s, d, n, _, _ in EDGES
                                                    if in_layers(s) and in_layers(d) and s != d}))
def test_no_import_upwards(src, dst, line):
    """A module imports its own layer or those listed before it; within a folder, the modules listed before it."""
    if layer_of(src) != layer_of(dst):
        assert layer_rank(dst) < layer_rank(src), f"{src}:{line} imports {dst}, a layer listed after its own"
    elif Path(src).name not in ENTRY and Path(dst).name not in ENTRY:  # a folder's entry points import freely
        assert POSITION[dst] < POSITION[src], f"{src}:{line} imports {dst}, listed after it in its folder"


def test_no_cycle():
    graph = {m: {d for s, d, _, _, _ in EDGES if s == m and d != m} for m in MODULES}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt])}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("module", ["cache.py", "advantages.py", "evaluation/calibration.py"])
def test_pure_math_imports_nothing_of_the_package(module):
    assert GRAPH[module] == []


def test_scaling_imports_the_grader_only_lazily():
    grader = [(dst, lazy) for dst, _, lazy, _ in GRAPH["evaluation/scaling.py"] if dst.startswith("grader/")]
    assert grader and all(lazy for _, lazy in grader)


def test_only_the_cli_imports_the_package_root_and_only_the_version():
    """And the study freezer, which records the version a study's runs use."""
    users = {(src, name) for src, dst, _, _, name in EDGES if dst == "__init__.py" and src != "__main__.py"}
    assert users == {("cli/main.py", "__version__"), ("cli/study_check.py", "__version__"),
                     ("cli/study_run.py", "__version__"), ("harness/study_freeze.py", "__version__")}


# ------------------------------------------------------------------------------------ the method boundary
def declared(cls) -> set[str]:
    """Class attributes, annotations and the attributes its ``__init__`` sets."""
    init = inspect.getsource(cls.__init__) if "__init__" in vars(cls) else ""
    return ({n for klass in cls.__mro__ for n in (*vars(klass), *getattr(klass, "__annotations__", {}))}
            | set(re.findall(r"self\.(\w+)\s*=", init)))


def called_on(attribute: str) -> set[str]:
    """Names the training layer reads on ``self.<attribute>`` (directly, through a local alias, or getattr)."""
    names = set()
    for path in (PKG / "training").glob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and isinstance(node.value, ast.Attribute) and node.value.attr == attribute
                   for t in node.targets if isinstance(t, ast.Name)}

        def is_target(node) -> bool:
            return (isinstance(node, ast.Attribute) and node.attr == attribute) or (
                isinstance(node, ast.Name) and node.id in aliases)

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_target(node.value):
                names.add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and is_target(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                names.add(node.args[1].value)
    return names


def test_the_trainer_calls_only_what_method_declares():
    from capo_trl.methods import Method

    used = called_on("method")
    assert {"advantages", "make_state"} <= used
    assert used <= declared(Method), sorted(used - declared(Method))


def test_the_trainer_calls_only_what_method_state_declares():
    from capo_trl.methods import MethodState

    used = called_on("_method_state")
    assert {"next_batch", "observe", "state_dict", "load_state_dict", "reshard"} <= used
    assert used <= declared(MethodState), sorted(used - declared(MethodState))


# ------------------------------------------------------------------------------------ one source per fact
def test_the_baselines_table_names_every_registered_method_and_its_fields():
    """docs/baselines.md's table: one row per registered method but CAPO, each naming its method's fields."""
    from dataclasses import fields

    from capo_trl.methods import METHODS

    table = (ROOT / "docs" / "baselines.md").read_text().split("| method | `advantage_estimator`", 1)[1]
    rows = [line for line in table.split("\n\n", 1)[0].splitlines()[2:] if line.startswith("|")]
    named = {re.match(r'\| [^|]+\| `"(\w+)"`', row)[1]: row for row in rows}
    assert set(named) == set(METHODS) - {"capo"}
    for name, row in named.items():
        args = METHODS[name].Args
        missing = [f.name for f in fields(args) if f"`{f.name}`" not in row] if args else []
        assert not missing, f"docs/baselines.md's row of {name!r} does not name {missing}"


def test_the_readme_lists_the_registered_baselines():
    from capo_trl.methods import METHODS

    listed = re.search(r"Baseline methods \(([^;)]*)", (ROOT / "README.md").read_text())[1]
    assert re.findall(r"`(\w+)`", listed) == [m for m in METHODS if m not in ("grpo", "capo")]


def test_the_config_docs_name_the_methods_that_honour_aggregation():
    from capo_trl.methods import METHODS

    text = (ROOT / "docs" / "config.md").read_text()
    named = re.search(r"honoured by the methods\s+built on TRL's advantages \(([^;)]*)", text)[1]
    assert set(re.findall(r"`(\w+)`", named)) == {m for m, cls in METHODS.items() if cls.honours_aggregation}
