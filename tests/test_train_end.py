"""What `capo-trl train` says: errors in its own flags, no noise a user cannot act on, a model card that names
the model, the embedded default's recipe kept, and a calibration summary at the end of a run that evaluated."""

import json
import logging
import warnings
from pathlib import Path

import pytest
import yaml

from test_train_cli import job, problems_file  # noqa: F401  (a fixture)

from capo_trl.cli import train as capo_train
from capo_trl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_problem_column_names_trains_flag(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    assert main(["train", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data),
                 "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--dataset_columns problem=NAME" in err and "columns={" not in err, err


def test_an_unreachable_registry_dataset_suggests_trains_flags_not_evals():
    message = ("Could not load benchmark 'deepscaler' (offline). To use a local copy instead, pass its path: "
               "load_benchmark('deepscaler.jsonl') (CLI: --dataset_name deepscaler.jsonl), one JSON object per line "
               "with keys \"id\", \"problem\", \"answer\"; for other column names add columns={'problem': ..., "
               "'answer': ..., 'id': ...}.")
    said = capo_train.train_spelling(message)
    assert "--dataset_name deepscaler.jsonl" in said and "CLI:" not in said and "load_benchmark" not in said
    assert "--dataset_columns problem=NAME answer=NAME id=NAME" in said and "columns={" not in said


def test_the_lora_recipe_offline_answers_in_trains_flags(tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    recipe = ROOT / "examples" / "recipes" / "capo-qwen2.5-math-1.5b-lora.yaml"
    assert main(["train", "--config", str(recipe), "--model_name_or_path", tiny_model_dir, "--use_vllm", "false",
                 "--bf16", "false", "--use_cpu", "true", "--output_dir", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "deepscaler" in err and "--benchmark" not in err and "--dataset_name deepscaler.jsonl" in err, err


def test_the_checkpointing_default_does_not_warn_but_the_old_name_still_does(tiny_model_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        _, args, _ = capo_train.parse_args(["--model_name_or_path", tiny_model_dir])
    assert args.activation_checkpointing is True  # TRL's default, under the new name
    for old in (["--gradient_checkpointing", "false"], ["--no_gradient_checkpointing"]):
        with pytest.warns(FutureWarning, match="gradient_checkpointing"):
            _, args, _ = capo_train.parse_args(["--model_name_or_path", tiny_model_dir, *old])
        assert args.activation_checkpointing is False  # what was asked for, never overridden


def test_the_embedded_default_is_its_recipe_field_by_field():
    """Every trainer field capo-arith-tiny-cpu.yaml sets is what `capo-trl train` with no arguments uses."""
    path = ROOT / "examples" / "recipes" / "capo-arith-tiny-cpu.yaml"
    keys = [k for k in yaml.safe_load(path.read_text()) if k != "output_dir"]
    parsed, bare = capo_train.parse_args(["--config", str(path)]), capo_train.parse_args([])
    a, b = parsed[1], bare[1]  # the trainer's fields (the data fields' None means the embedded task)
    differ = {k: (getattr(a, k), getattr(b, k)) for k in keys if hasattr(a, k) and getattr(a, k) != getattr(b, k)}
    assert not differ, differ
    assert str(b.save_strategy).endswith("NO")  # it wrote checkpoint-20 once, though its recipe says "no"


def test_a_run_that_evaluated_ends_with_its_calibration_quietly(tiny_model_dir, problems_file, tmp_path,  # noqa: F811
                                                                  capsys, caplog):
    out = tmp_path / "run"
    argv = [a if a != "--gradient_checkpointing" else "--activation_checkpointing"  # the old name warns, rightly
            for a in job(tiny_model_dir, problems_file, out)] + ["--max_steps", "2",  # saves a checkpoint and a card
               "--calibration_dataset", problems_file, "--calibration_every", "2", "--calibration_samples", "2",
               "--calibration_limit", "4"]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        capo_train.main(argv)
    printed = capsys.readouterr()
    noise = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert not noise, noise
    assert "Setting accelerator to CPU" not in printed.out + printed.err + caplog.text
    said = logging.LogRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 213, "Setting accelerator to CPU. If "
                             "you have GPU or other accelerator, we were unable to detect it.", None, None)
    assert not logging.getLogger("DeepSpeed").filter(said)  # its own handler writes to the real stdout: filtered
    summary = json.loads((out / capo_train.SUMMARY_FILE).read_text())
    assert summary["start"]["step"] == 0 and summary["end"]["step"] == 2
    assert set(summary["end"]) == {"step", "accuracy", "auroc", "auroc_question", "ece"}
    assert "calibration (calibration_dataset, 4 problems x 2 samples), step 0 -> step 2:" in printed.out
    assert "  ece " in printed.out and "written to" in printed.out
    card = (out / "README.md").read_text()
    assert "[None]" not in card and 'model="None"' not in card and str(out) in card and tiny_model_dir in card


def test_a_run_that_evaluated_nothing_says_how_to_measure(tiny_model_dir, problems_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "plain"
    capo_train.main(job(tiny_model_dir, problems_file, out, "--max_steps", "1", "--save_strategy", "no"))
    assert "no calibration measured during the run (give --calibration_dataset" in capsys.readouterr().out
    assert not (out / capo_train.SUMMARY_FILE).exists()
