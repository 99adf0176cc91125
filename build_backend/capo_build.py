"""setuptools' build backend, plus the README the package index shows: relative links made absolute.

Why: the index renders README.md away from the repository, where ``docs/config.md`` leads nowhere.
Before each build hook, ``build/README.pypi.md`` is written from README.md with every relative link
target prefixed by the ``Repository`` URL of ``[project.urls]`` (``blob/main/``); pyproject.toml
names that file as the readme.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook not wrapped below)

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "build" / "README.pypi.md"
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_ABSOLUTE = re.compile(r"^([a-z][a-z0-9+.-]*:|#|/)", re.IGNORECASE)


def absolute_links(text: str, base: str) -> str:
    """Markdown ``[text](target)`` links with a relative target rewritten to ``base/target``."""
    base = base.rstrip("/") + "/blob/main/"

    def fix(match: re.Match) -> str:
        target = match.group(2)
        return match.group(0) if _ABSOLUTE.match(target) else f"{match.group(1)}{base}{target}{match.group(3)}"

    return _LINK.sub(fix, text)


def write_readme() -> Path:
    """build/README.pypi.md from README.md and pyproject's Repository URL."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    text = absolute_links((ROOT / "README.md").read_text(encoding="utf-8"), project["urls"]["Repository"])
    GENERATED.parent.mkdir(exist_ok=True)
    GENERATED.write_text(text, encoding="utf-8")
    return GENERATED


def _with_readme(hook):
    def wrapped(*args, **kwargs):
        write_readme()
        return hook(*args, **kwargs)

    wrapped.__name__ = hook.__name__
    return wrapped


build_wheel = _with_readme(_setuptools.build_wheel)
build_sdist = _with_readme(_setuptools.build_sdist)
build_editable = _with_readme(_setuptools.build_editable)
prepare_metadata_for_build_wheel = _with_readme(_setuptools.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _with_readme(_setuptools.prepare_metadata_for_build_editable)
get_requires_for_build_wheel = _with_readme(_setuptools.get_requires_for_build_wheel)
get_requires_for_build_sdist = _with_readme(_setuptools.get_requires_for_build_sdist)
get_requires_for_build_editable = _with_readme(_setuptools.get_requires_for_build_editable)
