"""`capo-trl eval` on the tiny model and real MATH-500 rows; the dispatcher and `python -m`."""

import csv
import json
import runpy
import sys

import pytest
from eval_helpers import PNG, math500_file, one_torch_thread

from capo_trl.cli import build_parser, main

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # a fixture, imported to be used by this module


def test_eval_writes_report_samples_and_plots(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["eval", "--model", tiny_model_dir, "--benchmark", str(math500_file()), "--limit", "2", "--n", "2",
               "--max-new-tokens", "8", "--out", str(out), "--plots", "--no-progress"])
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
