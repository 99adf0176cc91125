"""The embedded tasks by name (`--task`, the data registry, `capo-trl train` without a model)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from capo_trl.data import benchmarks as data
from capo_trl.cli import train as capo_train
from capo_trl.cli.main import main
from capo_trl.errors import UsageError
from capo_trl.harness import runs
from capo_trl.harness.presets import Budget, check_budget
from capo_trl.data.tasks import TASKS, get_task


def test_every_task_has_its_start_model_and_the_model_can_read_its_prompts():
    for task in TASKS.values():
        tokenizer = AutoTokenizer.from_pretrained(task.model_path())
        for split in ("train", "validation", "test"):
            prompts = list(task.dataset(split, 40)["prompt"])
            assert len(set(prompts)) == 40, (task.name, split)
            ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
            # a character the tokenizer lacks is dropped silently (the arithmetic model's drops '?')
            assert tokenizer.batch_decode(ids) == prompts, task.name
    assert get_task("guess").model_dir == get_task("guess-half").model_dir  # one start model for both mixes


@pytest.mark.parametrize("name, share", [("guess", 0.25), ("guess-half", 0.5), ("arithmetic", 0.0)])
def test_the_guessable_share_of_each_split_is_exact(name, share):
    for split in ("train", "test"):
        rows = get_task(name).dataset(split, 200)
        flags = list(rows["guessable"]) if "guessable" in rows.column_names else [False] * len(rows)
        assert sum(flags) == round(share * 200), (name, split)
        assert all(("?" in p) == f for p, f in zip(list(rows["prompt"]), flags))


def test_unknown_task_is_named_with_a_suggestion():
    with pytest.raises(UsageError, match=r"--task: unknown task 'guesss'; did you mean 'guess'"):
        get_task("guesss")
    with pytest.raises(UsageError, match="--task"):
        check_budget(Budget(task="nope"))


def test_the_registry_serves_each_task_with_its_splits():
    for name in TASKS:
        assert data.embedded_task(name) == name and data.dataset_kind(name) == "registry"
        test = data.load_benchmark(name, split="test", limit=12)
        rows = get_task(name).dataset("test", 12)
        assert list(test["prompt"]) == list(rows["prompt"])  # raw template: the bare problem
        assert list(test["answer"]) == list(rows["answer"])
    assert data.embedded_task("math500") is None


def test_a_budget_takes_its_data_and_start_model_from_its_task():
    budget = Budget(task="guess-half")
    assert runs.start_model(budget) == get_task("guess-half").model_path()
    assert runs.start_model(Budget(task="guess-half", model="/some/model")) == "/some/model"
    assert runs.start_model(Budget()) == get_task("arithmetic").model_path()


def test_train_without_a_model_trains_an_embedded_task_on_its_train_split(capsys):
    script_args, training_args, model_args = capo_train.parse_args(["--dataset_name", "guess-half"])
    assert "guess-half task" in capsys.readouterr().err
    assert script_args.dataset_limit == Budget().train_problems  # what the demo trains on, for every embedded task
    rows = capo_train.load_problems(script_args, script_args.dataset_train_split, 20)
    assert list(rows["prompt"]) == list(get_task("guess-half").dataset("train", 20)["prompt"])


def test_demo_refuses_an_unknown_task_in_one_line(capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("work started before the bad input was caught")

    monkeypatch.setattr(runs, "evaluate_test", fail)
    monkeypatch.setattr(runs, "train_method", fail)
    for command in ("demo", "compare"):
        extra = ["--out", "unused"] if command == "compare" else []
        assert main([command, "--task", "guess-hlaf", "--no_progress", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"capo-trl {command}: ")
        assert "--task: unknown task 'guess-hlaf'; did you mean 'guess-half'?" in err


def test_the_demo_says_what_the_committed_test_bed_comparison_says():
    import importlib.util
    import json
    from pathlib import Path

    from capo_trl.harness.demo import TESTBED, testbed_evidence

    root = Path(__file__).resolve().parents[1]
    summary = json.loads((root / "docs" / "results" / "guess-half-comparison" / "summary.json").read_text())
    paired = summary["paired_vs_grpo"]

    def diff(arm, key="auroc"):
        d = paired[arm][key]
        return tuple(round(d[k], 3) for k in ("mean", "low", "high"))

    mask = summary["mask"]["capo"]

    def dropped(kind, cls):
        gone = mask.get(f"{kind}/{cls}/dropped", 0)
        return round(gone / (gone + mask.get(f"{kind}/{cls}/kept", 0)), 2)

    wrong = [(v, k.endswith("/dropped")) for k, v in mask.items() if "/wrong/" in k]
    measured = {
        "seeds": len(summary["complete_seeds"]), "start": round(summary["start"]["auroc"], 3),
        "grpo": round(summary["arms"]["grpo"]["auroc"], 3),
        "grpo_lost": sum(v["required_met"] for v in summary["reference_all_seeds"]["per_seed"].values()),
        "capo": diff("capo"), "nomask": diff("capo-nomask"), "grpo_mask": diff("grpo-mask"),
        "paper": diff("capo-paper"), "nomask_accuracy": diff("capo-nomask", "accuracy"),
        "lucky": dropped("guessable", "correct"), "true": dropped("derivable", "correct"),
        "wrong": round(sum(v for v, gone in wrong if gone) / sum(v for v, _ in wrong), 2),
    }
    # The re-analysis (sign-flip p, leave-one-out, capo - capo-nomask) as scripts/results_tables.py computes it.
    spec = importlib.util.spec_from_file_location("results_tables", root / "scripts" / "results_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    facts = tables.testbed_facts()
    nomask, contrast = facts["nomask"], facts["mask_vs_nomask"]["auroc"]
    measured |= {"nomask_p": round(nomask["p"], 3), "nomask_favour": nomask["favour"],
                 "nomask_flip_p": round(nomask["flip_p"], 4), "nomask_fragile": tuple(facts["fragile"]),
                 "mask_vs_nomask": tuple(round(contrast[k], 3) for k in ("mean", "low", "high"))}
    assert TESTBED == measured
    text = testbed_evidence()
    assert f"{TESTBED['start']:.3f}" in text and f"{TESTBED['capo'][1]:+.3f}" in text
    assert "suggestive, not shown" in text and "Nor is it shown that removing the mask" in text
    assert f"p = {facts['nomask']['flip_p']:.4f}" in text
