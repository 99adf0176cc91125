"""examples/quickstart.ipynb: committed without outputs, and runs end to end with a 2-step budget.

How the notebook is executed, and why this way: nbclient starts a Jupyter kernel from a
*kernelspec*. The usual one is called ``python3``, but which interpreter it runs depends on the
machine: a ``python3`` kernelspec in ``~/.local/share/jupyter/kernels`` or
``/usr/share/jupyter/kernels`` may point at a Python without capo-trl. So the test writes a private
kernelspec into a temporary directory, whose ``argv`` is *this* interpreter
(``sys.executable -m ipykernel_launcher -f {connection_file}``), and hands nbclient a kernel
manager whose spec manager looks in that directory only. Nothing is installed or registered
anywhere, and it works whatever kernelspecs the machine has. The spec's ``env`` carries the small
budget (``CAPO_NOTEBOOK_STEPS=2``, which also shrinks the notebook's evaluation sets) and keeps
the kernel offline, single-threaded and away from the user's IPython profile.

Running the notebook yourself: ``jupyter lab examples/quickstart.ipynb`` with the environment
that has capo-trl installed, or headless:
``CAPO_NOTEBOOK_STEPS=2 jupyter nbconvert --to notebook --execute --stdout examples/quickstart.ipynb``.
"""

import json
import math
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager  # nbclient's own default manager class
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
STEPS = 2
SUMMARY_MARK = "CAPO_NOTEBOOK_SUMMARY "

# Appended to the in-memory copy of the notebook (never to the file): reports what it computed.
CHECK_CELL = f"""
import json
print({SUMMARY_MARK!r} + json.dumps({{
    "steps": STEPS,
    "test_samples": TEST_SAMPLES,
    "history": {{label: [h["step"] for h in m.history] for label, m in monitors.items()}},
    "val_keys": sorted(grpo_monitor.history[-1]),
    "global_step": {{label: t.state.global_step for label, t in trainers.items()}},
    "estimator": {{label: t.args.advantage_estimator for label, t in trainers.items()}},
    "rollout_auroc_logged": {{label: any("capo/auroc" in row for row in t.state.log_history)
                              for label, t in trainers.items()}},
    "test": {{label: r.metrics for label, r in results.items()}},
    "curve_points": {{label: len(r.curves["precision_coverage"]["coverage"]) for label, r in results.items()}},
    "table_columns": list(table.columns),
    "calibrated": {{label: results[label].metrics["ece_calibrated"] for label in calibrators}},
    "decision": decision.probability,
}}))
"""


def _kernel_manager(tmp_path: Path) -> AsyncKernelManager:
    """A kernel manager that runs this interpreter's ipykernel, whatever kernelspecs the machine has."""
    kernels = tmp_path / "kernels"
    spec = kernels / "capo-trl-test"
    spec.mkdir(parents=True)
    env = {
        "CAPO_NOTEBOOK_STEPS": str(STEPS),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "IPYTHONDIR": str(tmp_path / "ipython"),  # no profile or history written to the user's home
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # figures become outputs even if CI sets Agg
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # silences the debugger's frozen-modules warning
    }
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "capo-trl test kernel", "language": "python", "env": env,
    }))
    return AsyncKernelManager(kernel_name="capo-trl-test",
                              kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))


def _outputs(cell, kind: str) -> list:
    return [o for o in cell.get("outputs", []) if kind in o.get("data", {})]


def _cell(nb, needle: str):
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    return cell


def test_committed_notebook_has_no_outputs_and_one_budget_knob():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and any(c.cell_type == "markdown" for c in nb.cells)
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"code cell {i} has committed outputs: clear them before committing"
        assert cell.execution_count is None, f"code cell {i} has an execution count: clear it"
    setup = code[0].source
    assert "STEPS = " in setup and 'os.environ.get("CAPO_NOTEBOOK_STEPS"' in setup
    assert "widgets" not in nb.metadata  # no saved widget state either


@pytest.mark.slow
def test_notebook_runs_with_a_tiny_budget(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute(cleanup_kc=True)  # raises CellExecutionError, naming the cell, if any cell fails

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    summary = json.loads(printed.split(SUMMARY_MARK, 1)[1])

    assert summary["steps"] == STEPS
    assert summary["estimator"] == {"grpo": "grpo", "capo": "capo"}
    assert summary["global_step"] == {"grpo": STEPS, "capo": STEPS}
    # validation at step 0 and every step (EVAL_EVERY = 1 for 2 steps): the per-step curves
    assert summary["history"] == {"grpo": list(range(STEPS + 1)), "capo": list(range(STEPS + 1))}
    assert {"val/auroc", "val/auroc_question", "val/ece"} <= set(summary["val_keys"])
    assert all(summary["rollout_auroc_logged"].values())

    n = summary["test_samples"]
    assert set(summary["test"]) == {"start (no RL)", "grpo", "capo"}
    for label, metrics in summary["test"].items():
        for key in (f"mean@{n}", f"maj@{n}", f"pc@{n}"):
            assert 0.0 <= metrics[key] <= 1.0, (label, key, metrics[key])
        assert math.isnan(metrics["auroc"]) or 0.0 <= metrics["auroc"] <= 1.0
        assert summary["curve_points"][label] > 1
    assert {f"mean@{n}", f"pc@{n}", "auroc"} <= set(summary["table_columns"])
    assert set(summary["calibrated"]) == {"grpo", "capo"} and all(0 <= v <= 1 for v in summary["calibrated"].values())
    assert 0 <= summary["decision"] <= 1

    # the figures and the table are real outputs of their cells
    assert _outputs(_cell(nb, "validation AUROC (pooled)"), "image/png"), "no validation-curve figure"
    assert _outputs(_cell(nb, "precision-coverage (test)"), "image/png"), "no precision-coverage figure"
    table = _outputs(_cell(nb, "table.round(3)"), "text/html")
    assert table and f"pc@{n}" in "".join(table[0]["data"]["text/html"])


def _relative_links(markdown: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_docs_index_readme_section_and_notebook_links_resolve():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name}" in index, f"docs/README.md does not list {page.name}"
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    for page in ("docs/README.md", "examples/quickstart.ipynb", "docs/results/README.md", "CHANGELOG.md"):
        assert f"]({page})" in section, f"README's Documentation section does not link {page}"
    sources = {ROOT / "docs" / "README.md": index, ROOT / "README.md": section}
    nb = nbformat.read(NOTEBOOK, as_version=4)
    sources[NOTEBOOK] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for origin, text in sources.items():
        for link in _relative_links(text):
            assert (origin.parent / link).exists(), f"{origin.relative_to(ROOT)} links to missing {link}"
