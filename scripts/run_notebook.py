"""Re-execute examples/quickstart.ipynb in place, so the committed notebook carries current outputs.

    python scripts/run_notebook.py        # the notebook's own budget (its STEPS): minutes on a CPU

Why committed outputs: a reader on the code host sees the figures without running anything. The
notebook's metadata records a digest of its code cells as executed (``capo_trl.sources_sha256``);
``tests/test_notebook.py`` checks it against the cells, so an edited cell without a re-run fails.

How it runs: nbclient starts a kernel from a private kernelspec in a temporary directory whose
``argv`` is *this* interpreter, whatever kernelspecs the machine has (nothing is installed or
registered); the kernel is offline, single-threaded and away from the user's IPython profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager  # nbclient's own default manager class
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # figures become outputs even if CI sets Agg
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # silences the debugger's frozen-modules warning
}


def sources_digest(nb) -> str:
    """sha256 of the code cells' sources, in order: what the outputs were computed from."""
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def kernel_manager(directory: Path, env: dict | None = None) -> AsyncKernelManager:
    """A kernel manager that runs this interpreter's ipykernel, whatever kernelspecs the machine has."""
    spec = Path(directory) / "kernels" / "capo-trl"
    spec.mkdir(parents=True)
    env = {**KERNEL_ENV, "IPYTHONDIR": str(Path(directory) / "ipython"), **(env or {})}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "capo-trl", "language": "python", "env": env,
    }))
    return AsyncKernelManager(kernel_name="capo-trl", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def execute(nb, directory: Path, env: dict | None = None, timeout: int = 3600):
    """Run every cell of ``nb`` (in place) with the kernel of :func:`kernel_manager`, cwd ``directory``."""
    client = NotebookClient(nb, km=kernel_manager(directory, env), timeout=timeout,
                            resources={"metadata": {"path": str(directory)}})
    client.execute(cleanup_kc=True)  # raises CellExecutionError, naming the cell, if any cell fails
    return nb


def main() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    kernelspec = nb.metadata.get("kernelspec")
    steps = os.environ.get("CAPO_NOTEBOOK_STEPS")
    with tempfile.TemporaryDirectory() as tmp:
        execute(nb, Path(tmp), {"CAPO_NOTEBOOK_STEPS": steps} if steps else None)
    nb.metadata["kernelspec"] = kernelspec  # readers' Jupyter: the usual kernel, not the private one
    nb.metadata.pop("widgets", None)
    nb.metadata["capo_trl"] = {"sources_sha256": sources_digest(nb), "executed_by": "scripts/run_notebook.py"}
    nbformat.validate(nb)
    nbformat.write(nb, NOTEBOOK)
    print(f"executed {NOTEBOOK.relative_to(ROOT)} in place")


if __name__ == "__main__":
    main()
