"""examples/quickstart.ipynb: committed with current outputs, and runs end to end with a 2-step budget.

The outputs are written by ``python scripts/run_notebook.py`` (the notebook's full budget), which
also records a digest of the code cells it ran; the first test checks that digest against the cells
(an edited cell without a re-run fails), that every code cell ran in order and none failed. How
the notebook is executed (a private kernelspec running this interpreter) is the script's
docstring; the slow test runs an in-memory copy the same way with ``CAPO_NOTEBOOK_STEPS=2``, which
also shrinks the notebook's evaluation sets.

Running the notebook yourself: ``jupyter lab examples/quickstart.ipynb`` with the environment
that has capo-trl installed, or ``python scripts/run_notebook.py`` to refresh the committed outputs.
"""

import importlib.util
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
STEPS = 2
SUMMARY_MARK = "CAPO_NOTEBOOK_SUMMARY "
_spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "scripts" / "run_notebook.py")
run_notebook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebook)

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


def _outputs(cell, kind: str) -> list:
    return [o for o in cell.get("outputs", []) if kind in o.get("data", {})]


def _cell(nb, needle: str):
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    return cell


def test_committed_notebook_carries_current_outputs_and_one_budget_knob():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and any(c.cell_type == "markdown" for c in nb.cells)
    stamp = nb.metadata.get("capo_trl", {})
    assert stamp.get("sources_sha256") == run_notebook.sources_digest(nb), (
        "the code cells changed since their outputs were computed: run python scripts/run_notebook.py")
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # every cell, once, in order
    errors = [o.get("ename") for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == []
    for needle in ("validation AUROC (pooled)", "precision-coverage (test)"):
        assert _outputs(_cell(nb, needle), "image/png"), f"no figure committed for the cell with {needle!r}"
    assert "STEPS=300," in "".join(o.get("text", "") for o in code[0].outputs)  # the full budget, not a smoke run
    abstention = "".join(o.get("text", "") for o in _cell(nb, "answer_or_abstain(").outputs)
    assert "certifies precision >=" in abstention, abstention  # a threshold the data allow, for some model ...
    assert "answer '" in abstention, abstention  # ... and a test problem it answers rather than abstains on
    setup = code[0].source
    assert "STEPS = " in setup and 'os.environ.get("CAPO_NOTEBOOK_STEPS"' in setup
    assert "widgets" not in nb.metadata  # no saved widget state
    assert nb.metadata["kernelspec"]["name"] == "python3"  # a reader's usual kernel, not the private one


@pytest.mark.slow
def test_notebook_runs_with_a_tiny_budget(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    run_notebook.execute(nb, tmp_path, {"CAPO_NOTEBOOK_STEPS": str(STEPS)}, timeout=300)

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
