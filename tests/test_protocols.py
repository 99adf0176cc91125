"""Every protocol predates its runs in git history: for each study with a ``study.yaml``, a protocol and records of
its own, the commit that first added the protocol is an ancestor of (or is) the commit its code was frozen at and
the commit a record says it ran from, and of the commit that added each record."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest

from capo_trl.harness.study import load_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def first_added(path: Path, follow: bool) -> str:
    """The commit that added ``path`` first: through its renames (``follow``: a protocol moved with its folder), or
    where it appeared under this name (a record; following a small JSON file can land on a look-alike elsewhere)."""
    out = git("log", "--diff-filter=A", "--format=%H", *(["--follow"] if follow else ["--no-renames"]), "--",
              str(path.relative_to(ROOT))).splitlines()
    assert out, f"{path.relative_to(ROOT)}: not in git history (commit it)"
    return out[-1]


@functools.cache
def is_ancestor(older: str, newer: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", older, newer]).returncode == 0


def studies_with_protocols() -> list[str]:
    return sorted(p.parent.name for p in RESULTS.glob("*/study.yaml") if list(p.parent.glob("protocol*.md")))


def test_the_check_reads_the_studies():
    assert {"smollm2-study", "smollm2-lr-study", "smollm2-screen", "smollm2-pick-study",
            "guess-half-mask-study"} <= set(studies_with_protocols())


@pytest.mark.parametrize("name", studies_with_protocols())
def test_the_protocol_predates_the_studys_code_and_every_run(name):
    study = load_study(RESULTS / name)
    protocol = min((first_added(p, follow=True) for p in (RESULTS / name).glob("protocol*.md")),
                   key=lambda c: int(git("log", "-1", "--format=%ct", c)))
    records = [p for p in (study.record_path(arm, seed) for arm, seed in study.own_runs()) if p.is_file()]
    if study.frozen_commit and records:
        assert is_ancestor(protocol, study.frozen_commit), f"{name}: frozen at a commit before its protocol"
    late = []
    for record in records:
        ran_at = json.loads(record.read_text()).get("commit")  # older runners wrote none; the frozen commit holds
        added = first_added(record, follow=False)
        if not is_ancestor(protocol, added) or (ran_at and not is_ancestor(protocol, ran_at)):
            late.append(str(record.relative_to(ROOT)))
    assert not late, f"{name}: records from before its protocol: {late}"
