"""`capo-trl --help` and a usage error answer without loading torch, transformers, TRL or datasets."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
HEAVY = ("torch", "transformers", "trl", "datasets", "accelerate", "peft", "sklearn", "matplotlib", "pandas")


def _imported(args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m capo_trl ARGS``; the top-level names of every module it imported."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "capo_trl", *args], capture_output=True,
                          text=True, env=env, timeout=120)
    modules = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}
    assert "capo_trl" in modules  # the probe sees the package's own imports
    return proc, modules


@pytest.mark.parametrize("args", [["--help"], ["eval", "--help"], ["calibrate-mask", "--help"]])
def test_help_loads_no_heavy_library(args):
    proc, modules = _imported(args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: capo-trl" in proc.stdout
    assert sorted(modules & set(HEAVY)) == []


@pytest.mark.parametrize("args", [["--bogus"], ["eval", "--model", "m", "--benchmark", "b", "--out", "o", "--bogus"],
                                  ["demo", "--steps", "many"]])
def test_a_bad_flag_is_one_line_without_heavy_libraries(args):
    proc, modules = _imported(args)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("capo-trl") and "--help`." in errors[0], errors  # no usage
    assert sorted(modules & set(HEAVY)) == []


@pytest.mark.parametrize("args, expected", [
    (["train", "--bogus"], "unknown flag --bogus; flags are"),
    (["train", "--config", "RECIPE", "--lerning_rate", "1e-5"], "unknown flag --lerning_rate; did you mean "
                                                                "--learning_rate?"),
    (["train", "--config", "RECIPE"], "unknown field(s) 'tua' (did you mean 'tau'?)"),
    (["train", "--accelerate_config", "zero3", "--num_processes", "2", "--bogus"], "unknown flag --bogus; flags are"),
])
def test_a_bad_train_flag_or_recipe_key_is_one_line_without_heavy_libraries(args, expected, tmp_path):
    """TRL's parser needs transformers' Trainer: the committed description of it answers instead."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1.0e-6\n" + ("tua: 0.5\n" if "--lerning_rate" not in args else ""))
    proc, modules = _imported([str(recipe) if a == "RECIPE" else a for a in args])
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("capo-trl train: ") and expected in errors[0], errors
    assert sorted(modules & set(HEAVY)) == []


def test_train_help_loads_no_heavy_library():
    proc, modules = _imported(["train", "--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: capo-trl train") and "--learning_rate LEARNING_RATE" in proc.stdout
    assert sorted(modules & set(HEAVY)) == []


def options_with_defaults(parser, name: str = "capo-trl"):
    """(command, flag, default, help) of every option, in every subcommand, that has a default to state."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from options_with_defaults(subparser, f"{name} {sub}")
        elif (action.option_strings and action.default is not None and action.default is not False
              and action.default is not argparse.SUPPRESS and action.nargs != 0):
            yield name, action.option_strings[0], action.default, action.help or ""


def test_every_commands_help_gives_each_flags_default():
    """The README says `--help` lists every flag with its default (capo-trl train's come from its dataclasses)."""
    from capo_trl.cli.main import build_parser

    found = list(options_with_defaults(build_parser()))
    assert any(flag == "--seeds" for _, flag, _, _ in found)  # the walk reaches the subcommands
    silent = [f"{name} {flag} (default {default!r})" for name, flag, default, text in found
              if "default" not in text.lower()]
    assert not silent, silent
