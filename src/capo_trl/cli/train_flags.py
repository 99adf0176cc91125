"""`capo-trl train`'s flags written down, so --help and an unknown flag or recipe key answer without TRL.

Why: the real parser (TRL's TrlParser over ScriptArguments, CAPOConfig and trl.ModelConfig,
:func:`capo_trl.cli.train_args.make_parser`) needs transformers' Trainer imported, ten seconds and more
before a typo could be named. ``train_flags.json`` is that parser described (:func:`describe`), written
by ``python scripts/train_flags.py``; ``tests/test_train_flags.py`` fails when it differs from the real
parser. A flag the file does not know is refused here; every other command goes to the real parser as
before. The same checks (:func:`check_flags`, :func:`check_recipe_keys`) run there too, over the real
parser's flags, so both paths give the same message.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
from importlib.resources import files

import yaml

from ..errors import UsageError, did_you_mean
from ..errors import unknown_flags as unknown_flags_message

FILE = "train_flags.json"
LAUNCH_FLAG = "--accelerate_config"  # launches through accelerate (capo_trl.cli.launch)
RECIPE_FLAG = "--config"  # TrlParser reads the recipe itself: not one of its argparse flags
HELP = ("-h", "--help")
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options
_KINDS = {"_StoreAction": "store", "_StoreFalseAction": "store_false", "_StoreTrueAction": "store_true",
          "_HelpAction": "help"}


# ------------------------------------------------------------------------------------------ the file
def describe(parser: argparse.ArgumentParser, launch_parser: argparse.ArgumentParser) -> dict:
    """What --help and the checks need of the real parser (and of `accelerate launch`'s), as JSON.

    Defaults and choices are kept as the text --help prints (``str``).
    """
    actions = []
    for action in parser._actions:
        kind = _KINDS.get(type(action).__name__)
        if kind is None:  # a new kind of argparse action in TRL or transformers: teach describe/help_parser
            raise TypeError(f"{action.dest}: {type(action).__name__} is not described by {__name__}")
        actions.append({
            "kind": kind, "option_strings": list(action.option_strings), "dest": action.dest, "nargs": action.nargs,
            "const": action.const, "default": str(action.default), "required": action.required, "help": action.help,
            "choices": None if action.choices is None else [str(c) for c in action.choices], "metavar": action.metavar,
        })
    launch = sorted(s for action in launch_parser._actions for s in action.option_strings)
    return {"prog": parser.prog, "description": parser.description, "actions": actions, "launch_flags": launch}


def render(spec: dict) -> str:
    """The file's text (stable, so a stale file shows as a diff)."""
    return json.dumps(spec, indent=1, ensure_ascii=False) + "\n"


@functools.cache
def load() -> dict:
    """The committed description of the real parser."""
    return json.loads(files(__package__).joinpath(FILE).read_text(encoding="utf-8"))


def help_parser(spec: dict) -> argparse.ArgumentParser:
    """A plain argparse parser that prints the real parser's --help (it parses nothing else)."""
    parser = argparse.ArgumentParser(prog=spec["prog"], description=spec["description"], add_help=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for a in spec["actions"]:
        default = argparse.SUPPRESS if a["default"] == argparse.SUPPRESS else a["default"]  # compared by identity
        kwargs = {"dest": a["dest"], "help": a["help"], "default": default}
        if a["kind"] == "store":
            kwargs.update(nargs=a["nargs"], const=a["const"], choices=a["choices"], metavar=a["metavar"],
                          required=a["required"])
        parser.add_argument(*a["option_strings"], action=a["kind"], **kwargs)
    return parser


# ------------------------------------------------------------------------------------------ the checks
def read_recipe(argv: list[str]) -> dict:
    """The YAML mapping named by ``--config`` (TrlParser's own form), or {}."""
    if RECIPE_FLAG not in argv or argv.index(RECIPE_FLAG) + 1 >= len(argv):
        return {}
    path = argv[argv.index(RECIPE_FLAG) + 1]
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except OSError as err:
        raise UsageError(f"Cannot read recipe {path}: {err.strerror}.") from err
    except yaml.YAMLError as err:  # the parser's message spans lines: its problem and where, on one
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"Recipe {path} is not valid YAML: {problem}{where}; fix the file (one `field: value` "
                         "per line).") from err
    if not isinstance(config, dict):
        raise UsageError(f"Recipe {path} must be a YAML mapping of field: value.")
    return config


def _guess(name: str, known) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_recipe_keys(config: dict, dests, path: str) -> None:
    """Name every unknown recipe key (TrlParser would only list them as '--key value' pairs)."""
    known = set(dests) | {"env"}
    unknown = [key for key in config if key not in known]
    if unknown:
        hints = ", ".join(f"{key!r}{_guess(str(key), sorted(known))}" for key in unknown)
        raise UsageError(f"Recipe {path}: unknown field(s) {hints}. Fields are those of ScriptArguments, "
                         "CAPOConfig (every GRPOConfig field) and trl.ModelConfig; see `capo-trl train --help`.")


def unknown_flags(argv: list[str], flags, exact=()) -> list[str]:
    """The strings of ``argv`` the real parser leaves unused because of an unknown ``--flag``: each with its values.

    A flag is unknown when it is none of ``flags`` and ``exact``: an abbreviation is unknown too (the real
    parser has ``allow_abbrev=False``: ``--learning_rat`` is a slip, not ``--learning_rate``). What argparse
    could still read as something else (after ``--``, a string with a space, a single-dash option) is left to
    the real parser, so every command it accepts passes here.
    """
    flags = set(flags)
    unused, taking = [], False
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("--") and " " not in arg:
            name = arg.split("=", 1)[0]
            taking = name not in exact and name not in flags
        elif arg.startswith("-") and not _NUMBER.match(arg):
            taking = False
        elif not taking:
            continue
        if taking:
            unused.append(arg)
    return unused


# The other subcommands' names for train's fields (`capo-trl eval --model M --dataset_name D`, `demo --task T`).
SYNONYMS = {"--model": "--model_name_or_path", "--benchmark": "--dataset_name", "--task": "--dataset_name"}


def check_flags(argv: list[str], flags, launch_flags=()) -> None:
    """Refuse unknown flags (abbreviations included) in one line naming the closest flag:
    ``unknown flag --learning_rat; did you mean --learning_rate?``."""
    launching = LAUNCH_FLAG in argv
    exact = {RECIPE_FLAG, *((LAUNCH_FLAG, *launch_flags) if launching else ())}
    unused = unknown_flags(argv, flags, exact)
    if unused:
        names = [arg.split("=", 1)[0] for arg in unused if arg.startswith("--")]
        hints = {name: f"did you mean {flag}?" for name, flag in SYNONYMS.items()}
        if not launching:  # `accelerate launch`'s own flags, given without the flag that launches
            hints.update({"--" + flag[2:].replace("-", "_"): f"an `accelerate launch` flag: it needs {LAUNCH_FLAG} "
                          "NAME|PATH" for flag in launch_flags})
        known = [*flags, *sorted(exact | {LAUNCH_FLAG})]
        message = unknown_flags_message(names, known, hints)
        if any(not hints.get("--" + n[2:].replace("-", "_")) and not did_you_mean(n, known) for n in names):
            launch = " or `accelerate launch` flags" if launching else ""  # a flag nothing is close to: what flags are
            message += (f"; flags are the fields of ScriptArguments, CAPOConfig (every GRPOConfig field) and "
                        f"trl.ModelConfig{launch}: see `capo-trl train --help`")
        raise UsageError(message if message.endswith("?") else message + ".")


def precheck(argv: list[str]) -> None:
    """What needs no TRL, from the file: --help (printed, then SystemExit(0) as argparse), UsageError for an
    unknown recipe key or flag."""
    spec = load()
    config = read_recipe(argv)
    if config:
        check_recipe_keys(config, [a["dest"] for a in spec["actions"]], argv[argv.index(RECIPE_FLAG) + 1])
    if any(arg in HELP for arg in argv):
        parser = help_parser(spec)
        parser.print_help()
        parser.exit()
    check_flags(argv, [s for a in spec["actions"] for s in a["option_strings"]], spec["launch_flags"])


__all__ = ["FILE", "check_flags", "check_recipe_keys", "describe", "help_parser", "load", "precheck",
           "read_recipe", "render", "unknown_flags"]
