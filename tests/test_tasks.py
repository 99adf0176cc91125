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
    """The shipped tiny models; the real model's tasks are checked where it is fetched (test_real_model.py)."""
    for task in (t for t in TASKS.values() if not isinstance(t.model_dir, str)):
        tokenizer = AutoTokenizer.from_pretrained(task.model_path())
        for split in ("train", "validation", "test"):
            prompts = list(task.dataset(split, 40)["prompt"])
            assert len(set(prompts)) == 40, (task.name, split)
            ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
            # a character the tokenizer lacks is dropped silently (the arithmetic model's drops '?')
            assert tokenizer.batch_decode(ids) == prompts, task.name
    assert get_task("guess").model_dir == get_task("guess-half").model_dir  # one start model for both mixes


@pytest.mark.parametrize("name, share", [("guess", 0.25), ("guess-half", 0.5), ("arithmetic", 0.0),
                                         ("addition", 0.0), ("addition-guess-half", 0.5)])
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
        make_prompt = data.prompt_template(get_task(name).template)  # raw: the bare problem; the chat tasks' chat
        assert list(test["prompt"]) == [make_prompt(p) for p in rows["prompt"]]
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


def test_the_demo_says_what_the_real_models_study_found():
    """The demo prints the real model's result from a constant (it runs without docs/results/): that constant is
    what the protocol's analysis of the committed files gives, and the demo says it on every task, as another
    model's."""
    from pathlib import Path

    import results_evidence as evidence
    import results_screen as evidence_screen
    import results_verdict as evidence_verdict
    from capo_trl.harness.demo import demo_budget
    from capo_trl.harness.demo import evidence as said

    from capo_trl.harness.study import load_study

    results = Path(__file__).resolve().parents[1] / "docs" / "results"
    r = evidence.measure_real(load_study(results / "smollm2-study"))
    assert r["look"] and evidence.REAL_RESULT == r
    second = evidence.measure_real(load_study(results / "smollm2-lr-study"))
    assert evidence.REAL_LR_RESULT == (second if second["look"] else None)  # filled in at its look, not before
    tail = evidence.real_lr_words(second) if second["look"] and second["holds"] else ""
    screen = evidence_screen.measure_screen(load_study(results / "smollm2-screen"))
    assert evidence_screen.SCREEN_RESULT == screen  # filled in at the pilot's look (every run finished), not before
    pick = evidence.measure_real(load_study(results / "smollm2-pick-study"))
    tail += "\n" + evidence_screen.screen_paragraph(screen, "3e-4", looked=pick["look"])
    assert evidence.PICK_RESULT == (pick if pick["look"] else None)  # filled in at its look, not before
    replication = evidence.measure_real(load_study(results / "smollm2-pick-guess-half"))
    assert evidence.REPLICATION_RESULT == (replication if replication["look"] else None)
    if pick["look"]:  # with the replication's words from its look
        tail += "\n" + evidence_verdict.pick_paragraphs(pick, second, screen["pick"], replication)
    for task in ("guess-half", "arithmetic", "guess"):
        text = said(demo_budget(task))
        assert text.endswith(evidence.real_words(r) + ("\n" + tail if tail else ""))
        assert "On a real model, not this demo's" in text


def test_from_the_pick_studys_look_the_demo_prints_its_words_and_the_recommendation():
    """Written before that look: with the pick study's result in its constant, the demo's words end with every
    endpoint of it and the recommendation its protocol's rule gives (the same paragraphs as the study's page), then
    the replication's from its look (scripts/results_demo.py writes them into the file the demo reads)."""
    import results_demo
    import results_evidence as evidence
    import results_screen as evidence_screen
    import results_verdict as evidence_verdict

    pick = {**evidence.REAL_LR_RESULT, "seeds": 13, "primary": (-0.09, -0.12, -0.06),
            "accuracy": {"capo-paper-lr3e-4": (-0.01, -0.03, 0.01)},
            "collapsed": {"grpo-lr3e-4": 0, "capo-paper-lr3e-4": 0}, "start": None}
    screen = evidence_screen.SCREEN_RESULT
    first = (evidence.REAL_RESULT, evidence.REAL_LR_RESULT, screen)
    before = results_demo.real_words(*first, None, None)
    text = results_demo.real_words(*first, pick, None)
    added = evidence_verdict.pick_paragraphs(pick, evidence.REAL_LR_RESULT, screen["pick"])
    assert text == before.replace(evidence_screen.screen_paragraph(screen, "3e-4"),
                                  evidence_screen.screen_paragraph(screen, "3e-4", looked=True)) + "\n" + added
    assert "picked by the screen for the confirmatory study at 3e-4" in " ".join(text.split())
    assert "No CAPO configuration kept calibration better than GRPO on the real model. What did least harm: " + (
        evidence_verdict.PRESET_LABEL) in " ".join(added.split())  # -0.09 is below the preset's -0.070
    assert "exact sign-flip p" in added and "Holm p" in added
    # the study runner keeps no start model record: the words then skip "before RL" rather than print nan
    assert "nan" not in added and "pooled AUROC went to 0.806 on average under GRPO" in " ".join(added.split())
    replication = {**pick, "primary": (0.01, -0.02, 0.04), "holds": False}
    again = results_demo.real_words(*first, pick, replication)
    assert again == text + "\n" + evidence.replication_words(replication, "capo-paper")
    assert "On `addition-guess-half`" in again.split(added)[1]


def test_the_demo_says_what_the_committed_confirmatory_study_says():
    from pathlib import Path

    from capo_trl.harness.demo import demo_budget, evidence
    from results_evidence import STUDY_RESULTS, measure, study_words
    from capo_trl.harness.study import load_study
    from capo_trl.harness.study_report import analysis

    results = Path(__file__).resolve().parents[1] / "docs" / "results"
    a = analysis(load_study(results / "guess-half-mask-study"))
    assert a["look"]["stop"] and a["primary"]["holds"]
    study_of_task = {"guess-half": "guess-half-mask-study", "guess-redraw": "guess-redraw-study"}
    assert study_of_task.keys() == STUDY_RESULTS.keys()
    for task, folder in study_of_task.items():  # every number the demo prints, against the committed run files
        assert STUDY_RESULTS[task] == measure(load_study(results / folder)), task
    half, redraw = evidence(demo_budget("guess-half")), evidence(demo_budget("guess-redraw"))
    assert study_words("guess-half") in half and study_words("guess-redraw") in redraw  # the pages' rendering
    half, redraw = " ".join(half.split()), " ".join(redraw.split())
    assert "+0.114 [+0.019, +0.209]" in half and "Holm p = 0.2791" in half
    # every pre-registered endpoint, against GRPO, with its 95% interval (the table, from the files)
    for row in ("| pooled AUROC | +0.114 [+0.054, +0.174] | 0 of 12 |",
                "| per-question AUROC | -0.016 [-0.057, +0.025] | 5 of 12 |",
                "| E-AURC (lower is better) | -0.100 [-0.156, -0.045] | 12 of 12 |",
                "| ECE (lower is better) | -0.009 [-0.021, +0.003] | 9 of 12 |",
                "| accuracy | -0.024 [-0.036, -0.013] | 12 of 12 |"):
        assert row in half, row
    assert "| per-question AUROC | -0.051 [-0.082, -0.020] | 10 of 12 |" in redraw
    # each task its own evidence: guess-redraw's study, not guess-half's; none on guess; nothing lost on arithmetic
    tiny_redraw = redraw.split("On a real model, not this demo's")[0]  # the real model's words come after, apart
    assert "Holm" not in tiny_redraw and "+0.114" not in tiny_redraw
    assert "+0.114" not in evidence(demo_budget("guess")) and "not a test bed" in evidence(demo_budget("guess"))
    assert "GRPO does not lose calibration" in evidence(demo_budget("arithmetic"))
    # "chosen in a pilot" only where the pilot's budget ran
    assert "chosen in an exploratory pilot" in half
    assert "chosen in an exploratory pilot" not in evidence(demo_budget("guess-half", steps=20))
    assert "chosen in an exploratory pilot" not in evidence(demo_budget("guess-half", learning_rate=2e-4))
    assert "chosen in an exploratory pilot" not in redraw and "was not tested for showing it" in redraw



def test_a_p_value_too_small_for_four_decimals_is_printed_as_a_bound():
    """Fixed before the looks that may need it: a p below 0.0001 reads "p < 0.0001", never "p = 0.0000"."""
    import results_evidence as evidence

    assert evidence._pv(0.0012) == "= 0.0012" and evidence._pv(0.0001) == "= 0.0001"
    assert evidence._pv(0.00004) == "< 0.0001" and evidence._pv(0.0) == "< 0.0001"
