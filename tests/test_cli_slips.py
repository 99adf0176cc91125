"""Every subcommand refuses an abbreviated or misspelt flag in one line, exit 2, naming the flag meant, before
anything loads (argparse would take `--learning_rat` for `--learning_rate`, or `--mod` for `--model`)."""

from __future__ import annotations

import argparse
import re

import pytest

from capo_trl.cli import train_flags
from capo_trl.cli.main import build_parser, main


def refused(argv, capsys) -> str:
    """The one line a command is refused with (exit status 2, from argparse or from a UsageError)."""
    try:
        code = main(argv)
    except SystemExit as end:
        code = end.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (argv, code, err)
    return err


def parsers():
    """(words before the flags, parser) of every subcommand that argparse parses, study's verbs included."""
    out = []
    for name, sub in build_parser()._subparsers._group_actions[0].choices.items():
        verbs = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if verbs:
            out += [((name, verb), parser) for verb, parser in verbs[0].choices.items()]
        elif name != "train":  # train's flags are TRL's: below
            out.append(((name,), sub))
    return out


def slips():
    """(words, abbreviated flag, the name the error should give) for every long flag of every parser: the flag less
    its last letter; the name given is the flag's own first long name (an old alias, `--benchmark`, is answered with
    today's name, `--dataset_name`: one name for one thing)."""
    rows = []
    for words, parser in parsers():
        for flag, action in parser._option_string_actions.items():
            short = flag[:-1]
            if flag.startswith("--") and len(short) > 3 and short not in parser._option_string_actions:
                rows.append((words, short, next(o for o in action.option_strings if o.startswith("--"))))
    return rows


def named(flag: str, line: str) -> bool:
    """The flag is in the line, as a whole word, in TRL's spelling (``--max_new_tokens`` for ``--max-new-tokens``)."""
    return re.search(rf"{re.escape('--' + flag[2:].replace('-', '_'))}(?![\w-])", line) is not None


@pytest.mark.parametrize("words, short, flag", slips(), ids=[f"{' '.join(w)} {s}" for w, s, _ in slips()])
def test_every_abbreviation_is_refused_naming_the_flag(words, short, flag, capsys):
    line = refused([*words, short, "1"], capsys)
    assert line.startswith(f"capo-trl {' '.join(words)}: unknown flag {short}; did you mean "), line
    assert named(flag, line), line


def test_every_subcommand_is_walked():
    walked = {words for words, _, _ in slips()}
    assert {w[0] for w in walked} == {"eval", "demo", "compare", "calibrate-mask", "fetch-model", "study"}
    assert {w[1] for w in walked if w[0] == "study"} == {"plan", "check", "start", "run", "queue", "status", "report", "close"}


def test_every_train_flag_abbreviated_is_refused_naming_it(capsys):
    """All of train's flags (TRL's fields, read from train_flags.json: no TRL is loaded) and its own two."""
    spec = train_flags.load()
    flags = {s for a in spec["actions"] for s in a["option_strings"] if s.startswith("--")}
    flags |= {"--config", "--accelerate_config"}
    checked = 0
    for flag in sorted(flags):
        short = flag[:-1]
        if len(short) <= 3 or short in flags:
            continue
        line = refused(["train", short, "1"], capsys)
        assert line.startswith(f"capo-trl train: unknown flag {short}; did you mean "), line
        assert named(flag, line), line
        checked += 1
    assert checked > 300


@pytest.mark.parametrize("argv, line", [
    (["train", "--config", "examples/recipes/capo-smollm2-135m-lora-cpu.yaml", "--learning_rat", "1e-4"],
     "capo-trl train: unknown flag --learning_rat; did you mean --learning_rate?"),
    (["train", "--model", "smollm2-135m-instruct"], "capo-trl train: unknown flag --model; did you mean "
                                                      "--model_name_or_path?"),
    (["train", "--benchmark", "addition"], "capo-trl train: unknown flag --benchmark; did you mean --dataset_name?"),
    (["train", "--accelerate_config", "zero3", "--num_proc", "2"],
     "capo-trl train: unknown flag --num_proc; did you mean --num_processes?"),
    (["eval", "--mod", "m", "--bench", "addition", "--ou", "out"],
     "capo-trl eval: unknown flags --mod (did you mean --model?), --bench (did you mean --dataset_name?), --ou (did "
     "you mean --out?); see `capo-trl eval --help`."),
    (["eval", "--model", "m", "--dataset_nam", "addition", "--out", "o"],
     "capo-trl eval: unknown flag --dataset_nam; did you mean --dataset_name?"),
    (["evl"], "capo-trl: argument COMMAND: invalid choice: 'evl'; did you mean eval? choose from eval, demo, compare, "
              "calibrate-mask, train, fetch-model, study; see `capo-trl --help`."),
    (["study", "ru", "x"], "capo-trl study: argument VERB: invalid choice: 'ru'; did you mean run? choose from plan, check, "
                           "start, run, queue, status, report, close; see `capo-trl study --help`."),
    (["eval", "--model", "m", "--dataset_name", "addition", "--out", "o", "--template", "qwen"],
     "capo-trl eval: argument --template: invalid choice: 'qwen'; did you mean qwen_math? choose from addition_chat, "
     "plain, qwen_math, raw; see `capo-trl eval --help`."),
])
def test_slips_read_as_written(argv, line, capsys):
    assert refused(argv, capsys) == line


@pytest.mark.parametrize("argv, expected", [
    (["eval", "--model", "m", "--dataset_name", "no-such-task", "--out", "OUT"],
     r"^capo-trl eval: --dataset_name: Unknown benchmark 'no-such-task': not a registered name \(addition, .*\) nor "
     r"a local file ending in \.json, \.jsonl, \.csv, \.parquet\.$"),
    (["eval", "--model", "m", "--benchmark", "guess-hlf", "--out", "OUT"],
     r"^capo-trl eval: --dataset_name: Unknown benchmark 'guess-hlf' \(did you mean guess-half\?\): not a registered"),
    (["calibrate-mask", "--dataset_name", "adition"], r"^capo-trl calibrate-mask: --dataset_name: Unknown benchmark "
                                                      r"'adition' \(did you mean addition\?\)"),
    (["eval", "--model", "smollm2-135m-instrcut", "--dataset_name", "addition", "--out", "OUT"],
     r"^capo-trl eval: --model smollm2-135m-instrcut: no such directory, nor a model short name; did you mean "
     r"smollm2-135m-instruct\? \(a short name: `capo-trl fetch-model smollm2-135m-instruct` fetches it once\)\.$"),
    (["demo", "--model_name_or_path", "smollm2-135m-instrcut"], r"did you mean smollm2-135m-instruct\?"),
    (["fetch-model", "smollm2-135m-instrcut"], r"^capo-trl fetch-model: unknown model 'smollm2-135m-instrcut': did you "
                                               r"mean smollm2-135m-instruct\? give one of"),
    (["demo", "--dataset_name", "gues-half"], r"^capo-trl demo: --task: unknown task 'gues-half'; did you mean "
                                              r"'guess-half'\?"),
    (["train", "--dataset_name", "gues-half"], r"^capo-trl train: dataset_name gues-half: not a registered name nor a "
                                               r"local file \(and a hub dataset id is org/name\); did you mean "
                                               r"guess-half\?$"),
    (["train", "--reward_funcs", "math_acuracy"], r"^capo-trl train: Unknown reward function 'math_acuracy' \(did you "
                                                  r"mean math_accuracy\?\)"),
    (["train", "--advantage_estimator", "capoo"], r"^capo-trl train: CAPOConfig.advantage_estimator='capoo' is "
                                                  r"invalid; did you mean capo\?"),
    (["train", "--tau_mode", "relativ"], r"^capo-trl train: argument --tau_mode/--tau-mode: invalid choice: "
                                         r"'relativ'; did you mean relative\?"),
])
def test_unknown_names_are_one_line_with_the_name_meant(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no folder there is named like the slips
    line = refused([str(tmp_path / "out") if a == "OUT" else a for a in argv], capsys)
    assert re.search(expected, line), line


def test_train_names_are_accepted_by_the_other_commands_and_the_old_names_still_work():
    parser = build_parser()
    for old, new in (("--benchmark", "--dataset_name"), ("--model", "--model_name_or_path")):
        a = parser.parse_args(["eval", old, "x", "--model" if old != "--model" else "--dataset_name", "y",
                               "--out", "o"])
        b = parser.parse_args(["eval", new, "x", "--model" if old != "--model" else "--dataset_name", "y",
                               "--out", "o"])
        assert a == b
    assert parser.parse_args(["demo", "--dataset_name", "guess"]).task == "guess"
    assert parser.parse_args(["compare", "--out", "o", "--model_name_or_path", "m"]).model == "m"
    assert parser.parse_args(["calibrate-mask", "--benchmark", "addition"]).dataset_name == "addition"
