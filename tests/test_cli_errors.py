"""Help text for every option, one-line errors for malformed recipes, and what would certify a target."""

import argparse
import re
from pathlib import Path

import pytest

from capo_trl.evaluation import certify
from capo_trl.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def _subcommands():
    return build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_option_has_help(command):
    missing = [a.option_strings or a.dest for a in _subcommands()[command]._actions
               if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_every_train_field_has_help():
    from capo_trl.cli.train_args import make_parser

    missing = [a.dest for a in make_parser()._actions if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


@pytest.mark.parametrize("text, where", [("max_steps: 3\nlearning_rate: [1e-5\nbeta: 0\n", "line 3, column 5"),
                                         ("a: b: c\n", "line 1, column 5")])
def test_a_malformed_recipe_is_one_line(tmp_path, capsys, text, where):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    assert main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"capo-trl train: Recipe {recipe} is not valid YAML") and where in err


def test_the_table_in_the_docs_is_the_committed_simulation():
    table = certify.load_table()
    assert certify.render_markdown(table) in (ROOT / "docs" / "evaluation.md").read_text()
    row = next(r for r in table["rows"] if r["target"] == 0.8 and r["case"] == "all right")
    # one cell recomputed (about a second): the file holds what the simulation gives
    assert certify.questions_needed(0.8, row["answered_precision"], **table["settings"]) == row["questions"]


def test_advice_quotes_the_row_at_or_above_the_target():
    table = certify.load_table()
    text = certify.advice(0.93, 40, table)
    row = next(r for r in table["rows"] if r["target"] == 0.95 and r["case"] == "all right")
    assert text.startswith(f"certifying precision >= 0.95 at 95% confidence takes about {row['questions']} ")
    assert "this split had 40" in text
    assert "more calibration questions than the table's highest target" in certify.advice(0.999, 40, table)


def test_eval_that_certifies_nothing_says_how_many_questions_would(tmp_path, capsys):
    from capo_trl.data.arithmetic import embedded_model_path

    rc = main(["eval", "--model", embedded_model_path(), "--benchmark", "arithmetic", "--split", "test", "--limit", "4",
               "--n", "2", "--max_new_tokens", "48", "--calibrate_on", "validation", "--calibrate_limit", "8",
               "--target_precision", "0.95", "--out", str(tmp_path / "out"), "--no_progress"])
    assert rc == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("no threshold meets"))
    needed = next(r["questions"] for r in certify.load_table()["rows"]
                  if r["target"] == 0.95 and r["case"] == "all right")
    assert re.search(rf"always abstain; certifying precision >= 0\.95 .* takes about {needed} calibration questions",
                     line)
    assert "this split had 8" in line
