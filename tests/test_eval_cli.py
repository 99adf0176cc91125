"""`capo-trl eval`: every bad input is one line on stderr and exit 2, before any model is loaded."""

import json

import pytest
from eval_helpers import math500_file, one_torch_thread

import capo_trl.evaluation.evaluate as evaluation
from capo_trl.cli.main import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")
_ = one_torch_thread  # a fixture, imported to be used by this module


@pytest.fixture
def no_loading(monkeypatch):
    """Fails the test if anything gets as far as evaluating (and so loading the model)."""
    def evaluate(*args, **kwargs):
        raise AssertionError("evaluate() ran: the bad input was not caught before loading the model")

    monkeypatch.setattr(evaluation, "evaluate", evaluate)


def _eval(model, out, *extra):
    return main(["eval", "--model", str(model), "--benchmark", str(math500_file()), "--limit", "2", "--n", "2",
                 "--max_new_tokens", "4", "--out", str(out), "--no_progress", *extra])


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("capo-trl eval: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("extra, flag", [
    (["--n", "0"], "--n"), (["--limit", "0"], "--limit"), (["--batch_size", "0"], "--batch_size"),
    (["--max_new_tokens", "0"], "--max_new_tokens"), (["--temperature", "-0.5"], "--temperature"),
    (["--top_p", "0"], "--top_p"), (["--top_p", "1.5"], "--top_p"), (["--top_k", "-1"], "--top_k"),
    (["--ks", "1", "4"], "--ks"), (["--ks", "0"], "--ks"),
    (["--target_precision", "0.9"], "--calibrate_on"), (["--calibrate_on", "test", "--target_precision", "1.5"],
                                                       "--target_precision"),
    (["--calibrate_on", "test", "--calibrate_limit", "0"], "--calibrate_limit"),
])
def test_bad_numbers_are_one_line_errors(no_loading, tiny_model_dir, tmp_path, capsys, extra, flag):
    assert _eval(tiny_model_dir, tmp_path / "out", *extra) == 2
    _one_line_error(capsys, flag)


def test_missing_model_or_tokenizer_is_a_one_line_error(no_loading, tiny_model_dir, tmp_path, capsys):
    assert _eval(tmp_path / "no-such-model", tmp_path / "out") == 2
    _one_line_error(capsys, "no-such-model", "no such directory")
    assert _eval(tiny_model_dir, tmp_path / "out", "--tokenizer", str(tmp_path / "no-tok")) == 2
    _one_line_error(capsys, "no-tok", "no such directory")


@pytest.mark.parametrize("name, content, needle", [
    ("missing.jsonl", None, "not found"),
    ("binary.jsonl", b"\xff\xfe\x00garbage", "binary.jsonl"),
    ("empty.csv", b"", "empty.csv"),
    ("bad.parquet", b"garbage", "bad.parquet"),
    ("cols.jsonl", b'{"question": "1+1?", "answer": "2"}\n', "--dataset_columns problem="),
    ("dup.jsonl", b'{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n', "unique"),
])
def test_bad_benchmark_files_are_one_line_errors(no_loading, tiny_model_dir, tmp_path, capsys, name, content,
                                                 needle, monkeypatch):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    if name == "dup.jsonl":  # duplicate ids are found by evaluate() itself, still before the model loads
        monkeypatch.undo()
        monkeypatch.setattr(evaluation, "_load_model", lambda *a, **k: pytest.fail("model loaded"))
        monkeypatch.setattr(evaluation, "_load_tokenizer", lambda *a, **k: pytest.fail("tokenizer loaded"))
    rc = main(["eval", "--model", tiny_model_dir, "--benchmark", str(path), "--out", str(tmp_path / "out"),
               "--no_progress"])
    assert rc == 2
    _one_line_error(capsys, needle)


def test_an_existing_report_is_not_overwritten_without_overwrite(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert _eval(tiny_model_dir, out, "--plots") == 0
    first = (out / "report.json").read_text()
    assert json.loads(first)["config"]["dtype"] == "float32"  # on a CPU, unless --dtype says otherwise
    assert (out / "reliability.png").is_file()
    capsys.readouterr()
    assert _eval(tiny_model_dir, out, "--seed", "1") == 2
    _one_line_error(capsys, "not empty", "--overwrite")
    assert (out / "report.json").read_text() == first
    assert _eval(tiny_model_dir, out, "--seed", "1", "--overwrite", "--dtype", "bfloat16") == 0
    config = json.loads((out / "report.json").read_text())["config"]
    assert (config["seed"], config["dtype"]) == (1, "bfloat16")
    assert not (out / "reliability.png").exists()  # a stale plot of the replaced report is removed
    capsys.readouterr()
    (tmp_path / "a-file").write_text("x")
    assert _eval(tiny_model_dir, tmp_path / "a-file", "--overwrite") == 2
    _one_line_error(capsys, "a-file", "is a file")


def test_target_precision_is_bounded_by_question(tmp_path, capsys):
    """The threshold and the report bound precision by question: the CLI passes each sample's problem."""
    from capo_trl.data.arithmetic import embedded_model_path
    from capo_trl.evaluation.confidence import QUESTIONS

    out = tmp_path / "out"
    rc = main(["eval", "--model", embedded_model_path(), "--benchmark", "arithmetic", "--split", "test", "--limit", "8",
               "--n", "4", "--max_new_tokens", "48", "--calibrate_on", "validation", "--calibrate_limit", "16",
               "--target_precision", "0.5", "--out", str(out), "--no_progress"])
    assert rc == 0
    assert f"bound by {QUESTIONS}" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["selective_bound"] == QUESTIONS
    m = report["metrics"]
    assert m["selective/n_questions"] <= 8 and m["selective/calibration_questions"] <= 16
