"""Every code block of README.md runs as written on a CPU machine, or is checked as far as it can be without
installing packages or training for minutes. The rule, by the block's language:

- ``python``: run as written, each block a script in its own interpreter (cwd a fresh temporary folder, no GPU
  visible, ``HF_HUB_OFFLINE=1``, a time limit), with one substitution, the only change: a model id named in
  :data:`MODEL_IDS` becomes the embedded tiny model's folder, so nothing is downloaded. The README says so next
  to the block.
- ``diff``: a change to the ``python`` block after it. Its added and kept lines (marker removed) are lines of that
  block, in order, so what the diff shows is what runs; the block with the diff undone (its removed lines in place
  of its added ones, the TRL script it started from) compiles.
- ``bash``: each command (a line split at ``&&``, ``||`` and ``;``, continuations joined, comments dropped) is
  - run where it is cheap and offline: ``capo-trl``, ``python -m capo_trl`` with ``--help`` or ``--version``
    (it must exit 0);
  - parsed where it trains, evaluates or is the demo (minutes to hours): every other ``capo-trl`` command, by the
    real parsers (``check_command`` of ``tests/test_docs.py``);
  - checked where it installs (``pip install``: the network, and a changed environment): each requirement is this
    project (``.``, ``.[extra]`` with extras pyproject.toml defines) or a pinned package it depends on;
  - checked where it is the test suite itself (``python -m pytest``): its paths exist;
  - anything else fails this test: a new kind of command needs a rule here first.
- any other language, or none, fails: a new kind of block needs a rule here first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from capo_trl.data.arithmetic import embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The one substitution a python block gets: a hub model id -> the embedded tiny model (offline, seconds on a CPU).
MODEL_IDS = {"Qwen/Qwen2.5-Math-1.5B": embedded_model_path}
RULES = ("python", "diff", "bash")
TIMEOUT = 240  # seconds per python block (about 20 s on the 2-core development machine, loaded)


def blocks() -> list[tuple[str, str, int]]:
    """(language, text, line of its opening fence) for every fenced block of the README, in order."""
    return [(m[1], m[2], README[:m.start()].count("\n") + 1)
            for m in re.finditer(r"^```([\w-]*)\n(.*?)^```\s*$", README, re.S | re.M)]


BLOCKS = blocks()


def of(language: str) -> list[tuple[str, int]]:
    return [(text, line) for lang, text, line in BLOCKS if lang == language]


def test_every_block_has_a_rule():
    assert BLOCKS and all(lang in RULES for lang, _, _ in BLOCKS), [(lang, line) for lang, _, line in BLOCKS]
    assert of("python"), "the README's drop-in example is a python block: it must be run"
    assert README.count("```") == 2 * len(BLOCKS), "an unclosed or indented fence: this test would not see it"


# ------------------------------------------------------------------------------------ python
def offline(code: str) -> str:
    """``code`` with each model id of :data:`MODEL_IDS` replaced by its local folder, and nothing else changed."""
    script = code
    for model_id, local in MODEL_IDS.items():
        script = script.replace(model_id, local())
    undone = script
    for model_id, local in MODEL_IDS.items():
        undone = undone.replace(local(), model_id)
    assert undone == code
    return script


@pytest.mark.parametrize("code, line", of("python"), ids=[f"README.md:{line}" for _, line in of("python")])
def test_python_block_runs_as_written_on_a_cpu(code, line, tmp_path):
    (tmp_path / "block.py").write_text(offline(code))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, f"README.md line {line}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_the_substitution_changes_only_the_model_id():
    code = 'model = "Qwen/Qwen2.5-Math-1.5B"  # Qwen/Qwen2.5-Math-1.5B\nother = "Qwen/Qwen2.5-Math-7B"\n'
    local = embedded_model_path()
    assert offline(code) == f'model = "{local}"  # {local}\nother = "Qwen/Qwen2.5-Math-7B"\n'


# ------------------------------------------------------------------------------------ diff
def undo(diff: str, code: str) -> tuple[list[str], str]:
    """The diff's added and kept lines as found in ``code`` (in order; a line not found fails), and ``code`` with
    the diff undone: each run of added lines replaced by the removed lines before it."""
    lines = code.splitlines()
    before, at, removed, shown = [], 0, [], []
    for row in diff.splitlines():
        marker, text = row[:1], row[1:].rstrip()
        if marker == "-":
            removed.append(text)
            continue
        if not text.strip():
            continue
        assert marker in "+ ", f"diff line {row!r}: neither +, - nor a kept line"
        found = next((i for i in range(at, len(lines)) if lines[i].rstrip() == text), None)
        assert found is not None, f"the diff's line {text!r} is not in the python block after it (in order)"
        before += lines[at:found] + removed + ([] if marker == "+" else [text])
        removed = []
        shown.append(text)
        at = found + 1
    return shown, "\n".join(before + lines[at:] + removed) + "\n"


def test_a_diff_shows_lines_that_run_and_undoes_to_a_script():
    assert of("diff")
    for diff, line in of("diff"):
        after = [(code, at) for code, at in of("python") if at > line]
        assert after, f"README.md line {line}: a diff block needs the python block it changes after it"
        shown, trl_script = undo(diff, after[0][0])
        assert len(shown) >= 3, shown
        compile(trl_script, f"README.md:{line} undone", "exec")
        assert "GRPOTrainer" in trl_script and "CAPOTrainer" not in trl_script, trl_script


def test_undo_fails_on_a_line_the_python_block_lacks():
    with pytest.raises(AssertionError, match="not in the python block"):
        undo("-a = 1\n+a = 2\n", "a = 3\n")
    assert undo("-a = 1\n+a = 2\n b = a\n", "x = 0\na = 2\nb = a\n") == (["a = 2", "b = a"], "x = 0\na = 1\nb = a\n")


# ------------------------------------------------------------------------------------ bash
def commands(text: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for row in joined.splitlines():
        row = row.split(" #", 1)[0].strip()
        if row and not row.startswith("#"):
            out += [c.strip() for c in re.split(r"&&|\|\||;", row) if c.strip()]
    return out


def kind(words: list[str]) -> tuple[str, list[str]]:
    """What the rule does with a command: run, parse, install, suite or unknown; and its words after the program."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value before a command
        words = words[1:]
    for program in (["capo-trl"], ["python", "-m", "capo_trl"], ["python", "-m", "capo_trl.cli"]):
        if words[:len(program)] == program:
            rest = words[len(program):]
            return ("run" if {"-h", "--help", "--version"} & set(rest) else "parse"), rest
    if words[:2] == ["pip", "install"]:
        return "install", words[2:]
    if words[:3] == ["python", "-m", "pytest"]:
        return "suite", words[3:]
    return "unknown", words


BASH = [(c, line) for text, line in of("bash") for c in commands(text)]


def check_install(args: list[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    depends = {re.match(r"[A-Za-z0-9_.-]+", d)[0].lower() for d in project["dependencies"]}
    args = [a for a in args if a not in ("-e", "--editable", "-U", "--upgrade")]
    assert args, "pip install of nothing"
    for arg in args:
        m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg)
        if m:
            assert set(filter(None, (m[1] or "").split(","))) <= extras, f"{arg}: extras pyproject.toml lacks"
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==[\w.+]+", arg)
        assert m and m[1].lower() in depends, f"{arg}: neither this project nor a pinned package it depends on"


def check_suite(args: list[str]) -> None:
    paths, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-n", "-k", "-m", "--timeout"):
            skip = True  # an option with a value
        elif not arg.startswith("-"):
            paths.append(arg)
    assert paths and all((ROOT / p.split("::")[0]).exists() for p in paths), paths


@pytest.mark.parametrize("command, line", BASH, ids=[f"README.md:{line}:{c[:50]}" for c, line in BASH])
def test_bash_command_runs_or_parses_by_its_rule(command, line, monkeypatch):
    what, rest = kind(shlex.split(command))
    if what == "run":
        program = [shutil.which("capo-trl")] if shutil.which("capo-trl") else [sys.executable, "-m", "capo_trl"]
        done = subprocess.run(program + rest, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, f"README.md line {line}: {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert done.stdout.strip()
    elif what == "parse":
        from test_docs import check_command

        monkeypatch.chdir(ROOT)
        check_command(shlex.join(rest))
    elif what == "install":
        check_install(rest)
    elif what == "suite":
        check_suite(rest)
    else:
        pytest.fail(f"README.md line {line}: {command!r} is a kind of command with no rule (tests/test_readme_blocks.py)")


def test_every_kind_of_bash_command_is_checked_somewhere():
    """The README exercises each rule but "unknown", and the rules refuse what they should."""
    assert {kind(shlex.split(c))[0] for c, _ in BASH} == {"run", "parse", "install", "suite"}
    assert kind(["accelerate", "launch", "x.py"])[0] == "unknown"
    assert kind(["OMP_NUM_THREADS=1", "capo-trl", "demo", "--help"]) == ("run", ["demo", "--help"])
    with pytest.raises(AssertionError):
        check_install([".[no-such-extra]"])
    with pytest.raises(AssertionError):
        check_install(["requests==2.0"])
    with pytest.raises(AssertionError):
        check_suite(["-n", "2", "tests/no_such_test.py"])
