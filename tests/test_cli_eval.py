"""`capo-trl eval` on the tiny model and real MATH-500 rows; the dispatcher and `python -m`."""

import csv
import json
import runpy
import sys

import pytest
from eval_helpers import PNG, math500_file, one_torch_thread

from capo_trl.cli.main import build_parser, main

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # a fixture, imported to be used by this module


def test_eval_writes_report_samples_and_plots(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["eval", "--model", tiny_model_dir, "--benchmark", str(math500_file()), "--limit", "2", "--n", "2",
               "--max_new_tokens", "8", "--out", str(out), "--plots", "--no_progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "2 problems x 2 samples" in printed and "mean@2" in printed and "auroc_question" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["n_samples"] == 4 and report["config"]["max_new_tokens"] == 8
    with (out / "samples.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (out / "reliability.png").read_bytes()[:8] == PNG


def test_eval_bad_benchmark_is_a_clean_error(tmp_path, capsys):
    rc = main(["eval", "--model", "unused", "--benchmark", "gsm9k", "--out", str(tmp_path)])
    assert rc == 2 and "Unknown benchmark 'gsm9k'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--model", "m", "--benchmark", "x.jsonl", "--out", "o", "--column", "problem"])


def test_dispatcher_and_module_entry_point(monkeypatch, capsys):
    assert "eval" in build_parser().format_help()
    with pytest.raises(SystemExit) as exc:
        main([])  # a subcommand is required
    assert exc.value.code == 2
    monkeypatch.setattr(sys, "argv", ["capo_trl.cli", "eval", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("capo_trl.cli", run_name="__main__")  # what `python -m capo_trl.cli` runs
    assert exc.value.code == 0 and "--benchmark" in capsys.readouterr().out


def test_one_flag_style_and_the_old_spelling_still_works():
    """TRL's underscores everywhere; the hyphenated spelling of earlier releases is accepted."""
    from capo_trl.cli.main import build_parser

    parser = build_parser()
    new = parser.parse_args(["eval", "--model", "m", "--benchmark", "b", "--out", "o", "--max_new_tokens", "7",
                             "--no_progress"])
    old = parser.parse_args(["eval", "--model", "m", "--benchmark", "b", "--out", "o", "--max-new-tokens", "7",
                             "--no-progress"])
    assert new.max_new_tokens == old.max_new_tokens == 7 and new.no_progress and old.no_progress
    compare = parser.parse_args(["compare", "--out", "o", "--first-seed", "2", "--val_every", "5"])
    assert (compare.first_seed, compare.val_every) == (2, 5)


@pytest.mark.parametrize("command", ["eval", "calibrate-mask"])
def test_column_mapping_has_trains_name_and_the_old_one(command):
    """`--dataset_columns` as in `capo-trl train` (several pairs after one flag); `--column`, one pair per flag,
    as in earlier releases: both give the same mapping."""
    from capo_trl.cli.main import build_parser

    parser = build_parser()
    head = ["eval", "--model", "m", "--dataset_name", "b", "--out", "o"] if command == "eval" else [command]
    new = parser.parse_args([*head, "--dataset_columns", "problem=q", "answer=a"])
    old = parser.parse_args([*head, "--column", "problem=q", "--column", "answer=a"])
    assert new.dataset_columns == old.dataset_columns == ["problem=q", "answer=a"]
