"""What a study's runs depend on: frozen by ``capo-trl study start``, checked by ``run`` and ``queue``.

Freezing writes ``frozen:`` into ``study.yaml``: the commit of the repository that holds the study (its protocol,
file and recipes), the capo-trl version its runs use (and that capo-trl's commit when it runs from a git checkout),
a digest of the study file's content and one of each arm's recipe. A run refuses, in one line, another capo-trl, a
changed study file or a changed recipe, unless the file's ``other_commits`` says why they may differ.

One path for a user and for this project: where the frozen capo-trl is a commit that the running capo-trl's own
checkout holds (this repository's studies), ``run`` and ``queue`` check that commit out into a worktree under the
runs folder and run themselves from it (:func:`frozen_code`), so no one sets ``PYTHONPATH`` by hand. A capo-trl
installed from a wheel runs studies frozen with its own version; for another, the line says what to install.
Files older than the ``frozen:`` block name only ``frozen_commit`` (a commit of this repository): the same rules
apply with that commit as the frozen capo-trl's.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml

from .. import __version__
from ..errors import UsageError
from .study_keys import FILE, mapping, repo_root

CODE = Path(__file__).resolve().parents[3]  # the checkout this capo_trl is imported from (when it is one)
FROZEN_KEYS = {"commit", "capo_trl", "capo_trl_commit", "study", "recipes"}


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def is_checkout() -> bool:
    """Whether this capo_trl runs from a git checkout of its repository (an editable install), not a wheel."""
    return (CODE / "src" / "capo_trl").is_dir() and _git(CODE, "rev-parse", "--show-toplevel") is not None


def code_version() -> tuple[str | None, str | None]:
    """The commit of the capo_trl being run and the tree of its ``src/`` (None, None when it is not a git checkout
    or its ``src/`` has uncommitted changes). Two commits with the same ``src/`` run the same code."""
    if not is_checkout() or _git(CODE, "status", "--porcelain", "--", "src") != "":
        return None, None
    return _git(CODE, "rev-parse", "HEAD"), _git(CODE, "rev-parse", "HEAD:src")


def frozen_tree(commit: str) -> str | None:
    """The ``src/`` tree of a frozen commit, looked up in the running code's repository (None: not there)."""
    return _git(CODE, "rev-parse", f"{commit}:src") if is_checkout() else None


def digest(text: str | bytes) -> str:
    return "sha256:" + hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def study_digest(data: dict) -> str:
    """The study file's content (its keys and values, not its comments or layout), without what freezing writes."""
    kept = {k: v for k, v in data.items() if k not in ("frozen", "frozen_commit")}
    return digest(yaml.safe_dump(kept, sort_keys=True))


def read_frozen(value, where: str) -> dict:
    """The file's ``frozen:`` block, as ``start`` wrote it."""
    value = mapping(value, where)
    fine = set(value) == FROZEN_KEYS and all(isinstance(value[k], str) for k in ("commit", "capo_trl", "study")) \
        and isinstance(value["capo_trl_commit"], (str, type(None))) and isinstance(value["recipes"], dict)
    if not fine:
        raise UsageError(f"{where} is not what `capo-trl study start` writes ({sorted(FROZEN_KEYS)}); restore it "
                         "from the commit that froze the study.")
    return dict(value)


def _recipes(study) -> list[str]:
    return sorted({study.arms[arm].recipe for arm in study.own_arms() if study.arms[arm].recipe})


def recipe_digests(study) -> dict:
    """Each recipe the study's own arms train with, by its path, and the digest of its text here."""
    root = repo_root(study.folder)
    return {r: digest((root / r).read_bytes()) for r in _recipes(study)}


def changed_recipes(study) -> list[str]:
    """The arms' recipes whose text differs from the frozen one: a recipe lies outside the code, yet it sets how an
    arm trains (digests in the file; a file frozen before them: the text at the frozen commit)."""
    root = repo_root(study.folder)
    if study.frozen is not None:
        return [r for r, text in recipe_digests(study).items() if study.frozen["recipes"].get(r) != text]
    return [r for r in _recipes(study)
            if _git(root, "show", f"{study.frozen_commit}:{r}") != (root / r).read_text().strip()]


def frozen_with(study) -> str:
    """The capo-trl a study was frozen with, in words."""
    if study.frozen is None:
        return f"capo-trl at commit {study.frozen_commit[:12]}"
    commit = study.frozen["capo_trl_commit"]
    return f"capo-trl {study.frozen['capo_trl']}" + (f" at commit {commit[:12]}" if commit else "")


def _this() -> str:
    commit, _ = code_version()
    where = f"at commit {commit[:12]}" if commit else ("a checkout with uncommitted changes in src/" if is_checkout()
                                                         else "installed from a wheel")
    return f"capo-trl {__version__} ({where})"


def same_code(study) -> bool:
    """Whether the running capo-trl is the one the study was frozen with: the same ``src/`` tree where both are
    commits this checkout knows, else the same version (a wheel), never a checkout with uncommitted changes."""
    commit = study.frozen_commit if study.frozen is None else study.frozen["capo_trl_commit"]
    _, tree = code_version()
    if is_checkout() and tree is None:
        return False
    if commit is not None and tree is not None:
        return frozen_tree(commit) == tree
    return study.frozen is not None and study.frozen["capo_trl"] == __version__


def check_code(study) -> None:
    """Refuse, in one line, another capo-trl than the frozen one, a changed study file or a changed recipe (unless
    the file's ``other_commits`` says why they may differ)."""
    if not study.frozen_commit or study.other_commits:
        return
    path = study.folder / FILE
    if not same_code(study):
        fix = (f"install it (pip install \"capo-trl=={study.frozen['capo_trl']}\")" if study.frozen is not None
               and not study.frozen["capo_trl_commit"] else "run it from a git checkout of capo-trl that holds that "
               "commit (the runner then checks it out by itself)")
        raise UsageError(f"{path} was frozen with {frozen_with(study)}, but this is {_this()}; {fix}, or say in "
                         "study.yaml's other_commits why another capo-trl may run it.")
    data = yaml.safe_load(path.read_text())
    if study.frozen is not None and study_digest(data) != study.frozen["study"]:
        raise UsageError(f"{path} changed since `capo-trl study start` froze it; a frozen study's file stays as it "
                         f"was: undo the change (git diff {study.frozen_commit[:12]} -- {path}), or say in "
                         "other_commits why its runs may differ.")
    changed = changed_recipes(study)
    if changed:
        raise UsageError(f"{path} was frozen with other text in the recipes {changed}; restore them (git checkout "
                         f"{study.frozen_commit[:12]} -- {' '.join(changed)}), or say in study.yaml's other_commits "
                         "why they may differ.")


def frozen_code(study, runs: Path) -> Path | None:
    """Where the frozen capo-trl's ``src/`` is, when this checkout is another commit but holds the frozen one: a
    worktree of that commit under ``runs/.code/`` (made once); None when this code runs the study itself."""
    commit = study.frozen_commit if study.frozen is None else study.frozen["capo_trl_commit"]
    if not study.frozen_commit or study.other_commits or commit is None or same_code(study) or \
            frozen_tree(commit) is None:
        return None
    tree = (runs / ".code" / commit[:12]).resolve()
    if _git(tree, "rev-parse", "HEAD") != _git(CODE, "rev-parse", f"{commit}^{{commit}}"):
        _git(CODE, "worktree", "prune")
        tree.parent.mkdir(parents=True, exist_ok=True)
        if _git(CODE, "worktree", "add", "--detach", "--force", str(tree), commit) is None:
            raise UsageError(f"could not check out capo-trl's commit {commit[:12]} into {tree} (git worktree add); "
                             "free the folder, or run the study from a checkout of that commit.")
    return tree / "src"


def start(study) -> dict:
    """Freeze a study (loaded and checked): refuse a dirty tree, write ``frozen:`` into its file (the team then
    commits that)."""
    root = repo_root(study.folder)
    status = _git(root, "status", "--porcelain")
    if status is None:
        raise UsageError(f"{root} is not a git repository; a study freezes the commit that holds its file and "
                         "recipes (git init, git add, git commit), then runs.")
    if status:
        raise UsageError(f"the tree at {root} has uncommitted changes; commit the protocol, study.yaml and the "
                         "recipes first, so the frozen commit holds them:\n" + status[:500])
    if study.frozen_commit:
        raise UsageError(f"{study.folder / FILE}: frozen already (at {study.frozen_commit}); a study is started "
                         "once.")
    commit, _ = code_version()
    if is_checkout() and commit is None:
        raise UsageError(f"this capo-trl is a checkout with uncommitted changes in src/ ({CODE}); commit them, so "
                         "the study freezes code that can be run again.")
    path = study.folder / FILE
    data = yaml.safe_load(path.read_text())
    frozen = {"commit": _git(root, "rev-parse", "HEAD"), "capo_trl": __version__, "capo_trl_commit": commit,
              "study": study_digest(data),
              "recipes": recipe_digests(study)}
    kept = [line for line in path.read_text().splitlines() if line.split(":")[0] not in ("frozen_commit", "frozen")]
    block = yaml.safe_dump({"frozen": frozen}, sort_keys=False, width=1000).rstrip()
    path.write_text("\n".join(kept) + "\n# written by `capo-trl study start`: what the runs depend on (run and "
                    "queue check it)\n" + block + "\n")
    return frozen
