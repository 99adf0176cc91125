"""The docs say only what exists: every command parses, every path, name, preset and field exists,
and every table of results is rendered from a committed file.

Generic by design: it reads README.md, docs/**/*.md and the recipes' comments as they are, so a
sentence added tomorrow is checked like the ones written today.
"""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))
TOP_DIRS = ("src/", "docs/", "examples/", "scripts/", "tests/", "benchmarks/")
TINY_RECIPE = "examples/recipes/capo-arith-tiny-cpu.yaml"
RESULTS = ROOT / "docs" / "results"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def texts() -> list[tuple[str, Path, str]]:
    """(where, file, text) for every doc, and the comment lines of every recipe."""
    out = [(rel(p), p, p.read_text()) for p in DOCS]
    for recipe in RECIPES:
        comments = "\n".join(line.split("#", 1)[1] for line in recipe.read_text().splitlines() if "#" in line)
        out.append((rel(recipe), recipe, comments))
    return out


# ------------------------------------------------------------------------------------ commands
def command_lines(text: str) -> list[str]:
    """Every ``capo-trl ...`` / ``-m capo_trl.cli ...`` invocation: code blocks (continuations joined),
    inline code spans and comment lines; each cut at a shell separator or comment."""
    joined = re.sub(r"\\\n\s*", " ", text)
    candidates = [m[1] for m in re.finditer(r"`([^`\n]*capo-trl [^`\n]*)`", joined)]
    candidates += [line for line in joined.splitlines() if "`" not in line and ("capo-trl " in line or "capo_trl.cli " in line)]
    out = []
    for cand in candidates:
        for m in re.finditer(r"(?:capo-trl|-m capo_trl\.cli) ([a-z][a-z-]*)\b([^;&|#`]*)", cand):
            out.append(f"{m[1]}{m[2]}".strip())
    return out


SUBCOMMANDS = {"eval", "demo", "compare", "calibrate-mask", "train", "study"}


def normalise(words: list[str]) -> list[str]:
    """Placeholders a reader fills in become values the parsers accept; elisions (``...``) are dropped."""
    out = []
    for i, word in enumerate(words):
        if word in ("...", "…"):
            if i and words[i - 1] == "--config":
                out.append(TINY_RECIPE)  # `--config ...`: any recipe
            continue
        word = re.sub(r"\$\(.*?\)|\$\{?\w+\}?", "0", word)  # shell variables and substitutions
        if i and words[i - 1] == "--config" and not (ROOT / word).exists() and re.fullmatch(r"[A-Z_.]+\.ya?ml", word):
            word = TINY_RECIPE  # `--config RECIPE.yaml`: any recipe
        out.append(word)
    return out


def all_commands() -> list[tuple[str, str]]:
    found = []
    for where, _, text in texts():
        for line in command_lines(text):
            if line.split()[0] in SUBCOMMANDS and line not in {c for _, c in found}:
                found.append((where, line))
    return found


def check_command(line: str) -> None:
    """Parse ``line`` (after ``capo-trl``) with the real parsers; raise on anything they refuse."""
    from capo_trl.cli.main import build_parser

    elided = "..." in line or "…" in line
    words = normalise(shlex.split(line.replace("[", " ").replace("]", " ")))  # [--optional part]: included
    if len(words) == 1 or {"-h", "--help"} & set(words):  # the command's name, or its help
        assert words[0] in SUBCOMMANDS
        return
    if words[0] == "train":
        from capo_trl.cli.train_args import parse_args

        parse_args(words[1:])
        return
    parser = build_parser()  # no abbreviations (allow_abbrev=False): the docs must spell flags out
    if elided:  # `capo-trl eval ... --flag`: the required arguments are the elided part
        sub = parser._subparsers._group_actions[0].choices[words[0]]
        for action in sub._actions:
            if action.required and action.option_strings and not set(action.option_strings) & set(words):
                words += [action.option_strings[0], "X"]
    try:
        args = parser.parse_args(words)
    except SystemExit as err:
        raise ValueError(f"argparse refused it (exit {err.code})") from err
    if words[0] == "compare":
        from capo_trl.harness.presets import Budget, check_methods, parse_methods

        check_methods(parse_methods(args.methods), Budget())


COMMANDS = all_commands()


def test_the_docs_name_commands():
    assert len(COMMANDS) > 40 and {c.split()[0] for _, c in COMMANDS} == SUBCOMMANDS


@pytest.mark.parametrize("where, line", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_command_in_the_docs_parses(where, line, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    check_command(line)


def test_ci_runs_the_readmes_test_command_and_nothing_else_a_user_needs():
    """CI (.ci/run) installs what CI itself needs, then runs the README's test command (its first shell block, on the
    first screen) as written, as its last step: a step a user would need too (fetching the real model, say) cannot
    hide in CI."""
    quick = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```")[0]
    readme = [line for line in quick.splitlines() if "pytest" in line]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(readme) == 1 and [line for line in ci if "pytest" in line] == readme and ci[-1] == readme[0], ci
    assert not [line for line in ci if "capo-trl" in line or "capo_trl" in line], ci


# ------------------------------------------------------------------------------------ paths
def mentioned_paths(path: Path, text: str) -> list[str]:
    """Repository paths in code spans or links (globs allowed); ``runs/`` and URLs are outputs / elsewhere."""
    spans = re.findall(r"`([^`\s]+)`(?!\]\()", text)  # a link's label is checked as its link
    links = [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text) if not m.startswith(("http", "#", "mailto"))]
    out = []
    for token in spans:
        token = token.rstrip(".,:;")
        if token.startswith(TOP_DIRS) and "=" not in token and "(" not in token:
            out.append(token)
        elif RESULTS in path.parents and path.name == "README.md" and re.fullmatch(r"[\w./-]+(/|\.(md|json|csv|png))",
                                                                                   token):
            out.append(str((path.parent / token).resolve().relative_to(ROOT)))  # relative to its results page
    for link in filter(None, links):
        out.append(str((path.parent / link).resolve().relative_to(ROOT)))
    return out


def exists(token: str) -> bool:
    token = token.split("::")[0].split(":")[0] if not token.startswith("src/capo_trl/assets") else token
    if any(c in token for c in "*?["):
        return any(ROOT.glob(token))
    return (ROOT / token).exists()


def command_words(text: str) -> list[str]:
    """The words of every command: code blocks (continuations joined) and code spans with a space in them."""
    blocks = re.findall(r"```[\w-]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    lines = [line for block in blocks for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    lines += [span for span in re.findall(r"`([^`\n]+)`", rest) if " " in span.strip()]
    words = []
    for line in lines:
        line = line.split(" #", 1)[0]  # a trailing comment is prose
        words += [w.strip("'\"();,") for part in re.split(r"\s+", line) for w in part.split("=")]
    return words


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def frozen(path: Path) -> str | None:
    """A protocol is a record committed before its runs and never edited after them: the commit that last changed it
    (its paths are checked as they were then, since a runner it names may be gone today); None for any other doc."""
    if not (RESULTS in path.parents and path.name.startswith("protocol")):
        return None
    found = git("log", "-1", "--format=%H", "--", str(path.relative_to(ROOT))).stdout.strip()
    assert found, f"{rel(path)}: no commit holds this protocol; commit it before its runs (a clone needs its history)"
    return found


def exists_for(path: Path, token: str) -> bool:
    """``token`` exists today, or, in a protocol, existed at the commit that last changed it."""
    if exists(token):
        return True
    commit = frozen(path)
    return commit is not None and git("cat-file", "-e", f"{commit}:{token.split('::')[0]}").returncode == 0


def test_every_repository_path_in_a_command_exists():
    """``python scripts/x.py``, ``--config examples/...``, ``benchmarks/...``: a misspelt path fails here."""
    missing = [f"{where}: {word}" for where, path, text in texts() for word in command_words(text)
               if word.startswith(TOP_DIRS) and not exists_for(path, word)]
    assert not missing, missing


def test_every_path_the_docs_mention_exists():
    missing = [f"{where}: {token}" for where, path, text in texts() for token in mentioned_paths(path, text)
               if not exists_for(path, token)]
    assert not missing, missing


def test_a_path_named_with_its_commit_exists_at_that_commit():
    """``COMMIT:path`` (a runner that is gone since, named with the commit it ran at) names a file of that commit."""
    found = [(where, m[1], m[2]) for where, _, text in texts()
             for m in re.finditer(r"`([0-9a-f]{7,40}):((?:%s)[\w./-]+)" % "|".join(TOP_DIRS), text)]
    missing = [f"{where}: {commit}:{path}" for where, commit, path in found
               if git("cat-file", "-e", f"{commit}:{path}").returncode != 0]
    assert found and not missing, missing


# ------------------------------------------------------------------------------------ capo_trl names
def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def resolved_then(path: Path, dotted: str) -> bool:
    """In a protocol, a name of the package as the commit that last changed it defined it (a plan it names may be
    gone today): the module's file of then defines the name."""
    commit = frozen(path)
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        source = git("show", f"{commit}:src/{'/'.join(parts[:cut])}.py") if commit else None
        if source is not None and source.returncode == 0:
            name = parts[cut]
            return bool(re.search(rf"^(?:{name}\b\s*[:=]|def {name}\b|class {name}\b)", source.stdout, re.M))
    return False


def test_every_capo_trl_name_the_docs_mention_exists():
    names = {(where, path, m) for where, path, text in texts() for m in re.findall(r"\bcapo_trl(?:\.\w+)+", text)}
    missing = sorted(f"{where}: {name}" for where, path, name in names
                     if not resolves(name) and not resolved_then(path, name))
    assert not missing, missing


# ------------------------------------------------------------------------------------ presets and fields
def known_fields() -> set[str]:
    from trl import ModelConfig

    from capo_trl import CAPOConfig
    from capo_trl.harness.presets import Budget
    from capo_trl.cli.train_args import ScriptArguments

    return {f.name for cls in (CAPOConfig, ScriptArguments, ModelConfig, Budget) for f in fields(cls)}


def test_every_preset_the_docs_name_exists():
    from capo_trl.harness.presets import PRESETS

    named = {(where, m) for where, _, text in texts() for m in re.findall(r"`([\w-]+)` preset", text)}
    named |= {(where, m) for where, _, text in texts() for m in re.findall(r"preset `([\w-]+)`", text)}
    missing = sorted(f"{where}: {name}" for where, name in named if name not in PRESETS)
    assert not missing, missing


def test_every_config_field_the_docs_name_exists():
    """The first column of every ``| field | default | ...`` table, and the keys of every YAML block."""
    known = known_fields()
    named = set()
    for where, _, text in texts():
        header = ""
        for line in text.splitlines():
            header = header if line.startswith("|") else ""
            header = header or (line if line.startswith("|") else "")
            m = re.match(r"\| `(\w+)` \|", line)
            if m and header.startswith("| field |"):
                named.add((where, m[1]))
        for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
            keys = set(yaml.safe_load(block) or {})
            if {"question", "arms"} <= keys:  # a study file (docs/studies.md): its keys, not a config's
                from capo_trl.harness.study import KEYS

                named |= {(where, f"study.yaml key {key}") for key in keys - KEYS}
                continue
            named |= {(where, key) for key in keys}
    missing = sorted(f"{where}: {name}" for where, name in named if name not in known)
    assert not missing, missing


# ------------------------------------------------------------------------------------ results tables and prose
def script(name: str):
    """A module of scripts/ (the results renderers), loaded from its file."""
    return load_script(name)


def test_every_number_in_the_results_prose_is_cited_to_a_committed_file():
    """docs/results pages: each decimal number outside the rendered blocks equals what its citation gives."""
    problems = script("results_prose").check()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", ["README.md", "docs/concepts.md"])
def test_a_measured_number_in_the_readme_or_concepts_is_rendered(page):
    """Outside the blocks scripts/results_tables.py renders, these pages hold no measured value (three decimals)."""
    prose = script("results_prose").prose((ROOT / page).read_text())
    stray = re.findall(r"(?<![\w.])[-+]?\d?\.\d{3,}(?![\w.])", prose)
    assert not stray, f"{page}: {stray}: render them (a text block of scripts/results_tables.py) or drop them"


def test_results_tables_are_rendered_from_committed_files():
    """Every block scripts/results_tables.py renders is current (in-process: capo_trl is imported already)."""
    problems = script("results_tables").problems()
    assert not problems, "\n".join(problems)[-6000:]


def started_studies() -> set[str]:
    """The study folders (with a ``study.yaml``) holding at least one record of a run of their own."""
    from capo_trl.harness.study import load_study

    out = set()
    for path in sorted(RESULTS.glob("*/study.yaml")):
        study = load_study(path.parent)
        if any(study.record_path(arm, seed).is_file() for arm, seed in study.own_runs()):
            out.add(path.parent.name)
    return out


def test_no_page_says_a_study_that_has_records_has_not_started():
    """A study's state in prose goes stale as its records land: a line saying "not started" may name (or, as a
    page's title, be the page of) only a study without a record of its own."""
    started = started_studies()
    assert "guess-redraw-study" in started  # the check reads records at all
    stale = []
    for where, path, text in texts():
        for n, line in enumerate(text.splitlines(), 1):
            if "not started" not in line:
                continue
            named = {name for name in started if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line)}
            if line.startswith("# ") and path.parent.parent == RESULTS:
                named |= {path.parent.name} & started
            stale += [f"{where}:{n}: says 'not started' of {name}, which has records" for name in sorted(named)]
    assert not stale, "\n".join(stale)
