"""The guessable-items task: exact counts, seeded and split like the arithmetic task, golds no prompt reveals."""

import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from capo_trl.data.arithmetic import arithmetic_dataset, char_tokenizer
from capo_trl.data.guessing import (
    GUESS_CHARS,
    GuessTask,
    guess_breakdown,
    guess_dataset,
    sft_completions,
)

ROOT = Path(__file__).resolve().parents[1]


def test_exact_share_seeded_order_and_the_derivable_items_are_the_arithmetic_task():
    ds = guess_dataset("validation", 40, seed=3)
    assert len(ds) == 40 and sum(ds["guessable"]) == 10
    again = guess_dataset("validation", 40, seed=3)
    assert ds.to_list() == again.to_list()
    assert guess_dataset("validation", 40, seed=4)["prompt"] != ds["prompt"]
    derivable = [r for r in ds if not r["guessable"]]
    reference = arithmetic_dataset("validation", 30, seed=3)
    assert sorted(r["prompt"] for r in derivable) == sorted(reference["prompt"])
    assert all(r["solutions"] == [r["solution"]] for r in derivable)
    assert sum(guess_dataset("test", 7, task=GuessTask(guess_fraction=0.5))["guessable"]) == 4  # round(3.5)


def test_splits_share_no_prompt():
    prompts = {split: set(guess_dataset(split, 200, seed=0)["prompt"]) for split in ("train", "validation", "test")}
    assert not prompts["train"] & prompts["validation"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["validation"] & prompts["test"]


def test_a_guessable_item_has_one_gold_among_five_consistent_answers():
    task = GuessTask()
    rows = [r for r in guess_dataset("train", 400, seed=0) if r["guessable"]]
    assert len(rows) == 100
    for r in rows:
        assert re.fullmatch(r"Compute \d+([+-]\d+)?[+-]\?\.", r["prompt"]), r["prompt"]
        h = task.hidden_value(r["prompt"])
        assert r["solution"] == r["solutions"][h] and r["solution"].endswith(f"\\boxed{{{r['answer']}}}")
        boxed = [int(re.search(r"\\boxed\{(\d+)\}", s)[1]) for s in r["solutions"]]
        step = 1 if "+?" in r["prompt"] else -1
        assert boxed == [boxed[0] + step * k for k in range(5)] and min(boxed) >= 0
        # the worked steps: every number is non-negative, the guessed step is written with its '?'
        assert "?=" in r["solution"] and all(int(x) >= 0 for x in re.findall(r"=(-?\d+)\.", r["solution"]))


def test_hidden_values_are_spread_evenly_and_depend_on_the_text_only():
    task = GuessTask()
    rows = [r for r in guess_dataset("train", 4000, seed=0) if r["guessable"]]
    counts = Counter(task.hidden_value(r["prompt"]) for r in rows)
    assert set(counts) == set(range(5))
    assert all(150 <= c <= 250 for c in counts.values()), counts  # 1000 items, 200 each expected (sd 12.6)
    assert task.hidden_value("Compute 3+?.") == GuessTask().hidden_value("Compute 3+?.")


def test_sft_completions_draw_the_hidden_value_so_the_model_learns_to_guess_uniformly():
    ds = guess_dataset("train", 2000, seed=0)
    sft = sft_completions(ds, seed=0)
    assert sft.column_names == ["prompt", "completion"] and sft["prompt"] == ds["prompt"]
    guess_rows = [(r, c) for r, c in zip(ds, sft["completion"]) if r["guessable"]]
    assert all(c[1:] in r["solutions"] for r, c in guess_rows)
    drawn = Counter(r["solutions"].index(c[1:]) for r, c in guess_rows)
    assert all(70 <= drawn[k] <= 130 for k in range(5)), drawn  # 500 rows, 100 each expected (sd 8.9)
    gold_share = sum(c[1:] == r["solution"] for r, c in guess_rows) / len(guess_rows)
    assert 0.12 <= gold_share <= 0.28, gold_share  # the gold is shown no more often than chance
    assert all(c == " " + r["solution"] for r, c in zip(ds, sft["completion"]) if not r["guessable"])
    assert sft_completions(ds, seed=0)["completion"] == sft["completion"]


def test_the_tokenizer_of_the_task_spells_every_prompt_and_solution():
    tok = char_tokenizer(GUESS_CHARS)
    for r in guess_dataset("test", 40, seed=0):
        for text in (r["prompt"], r["solution"]):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids and tok.decode(ids) == text


def test_guess_breakdown_counts_accuracy_score_and_the_modal_share():
    rows = [{"guessable": True}, {"guessable": False}]
    samples = [{"grade": g, "score": s, "extracted": e} for g, s, e in [
        (1.0, -0.1, "5"), (0.0, -0.3, "5"), (0.0, -0.2, "6"), (0.0, -0.2, "7"),  # a guessable item
        (1.0, -0.05, "9"), (1.0, -0.05, "9"), (0.0, -0.5, "8"), (None, -1.0, None)]]  # one ungraded sample
    out = guess_breakdown(samples, rows, n=4)
    assert out["guessable/problems"] == 1 and out["derivable/problems"] == 1
    assert out["guessable/accuracy"] == 0.25 and out["guessable/modal_share"] == 0.5
    assert out["derivable/accuracy"] == pytest.approx(2 / 3) and out["derivable/mean_score"] == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="3 samples for 2 problems"):
        guess_breakdown(samples[:3], rows, n=4)


def test_bad_settings_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="guess_fraction"):
        GuessTask(guess_fraction=1.5)
    with pytest.raises(ValueError, match="hidden_max"):
        GuessTask(hidden_max=10)
    with pytest.raises(ValueError, match="split='dev'"):
        guess_dataset("dev", 4)


def test_pretrain_tiny_has_a_guess_task_with_its_own_tokenizer_and_package_directory():
    spec = importlib.util.spec_from_file_location("pretrain_tiny", ROOT / "scripts" / "pretrain_tiny.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    chars, dataset, asset = script.TASKS["guess"]
    assert chars == GUESS_CHARS and dataset is guess_dataset and asset.name == "guess-tiny"
    assert script.TASKS["arithmetic"][2] == script.PACKAGE_ASSET and script.PACKAGE_ASSET.name == "arith-tiny"
    guess_tok, arith_tok = script.build_tokenizer("guess"), script.build_tokenizer()
    assert len(guess_tok) == len(arith_tok) + 1 and "?" in guess_tok.get_vocab() and "?" not in arith_tok.get_vocab()


def test_the_pilot_applies_the_pre_registered_criterion():
    from capo_trl.harness import pilot

    start = {"accuracy": 0.40, "auroc": 0.90, "auroc_question": 0.75, "ece": 0.50, "e_aurc": 0.040}
    degraded = {"accuracy": 0.42, "auroc": 0.87, "auroc_question": 0.76, "ece": 0.45, "e_aurc": 0.050}
    result = pilot.verdict(start, {0: degraded, 1: {**degraded, "e_aurc": 0.0499}})
    assert result["per_seed"][0] == {"accuracy_rises": True, "auroc_falls": True, "e_aurc_rises": True,
                                     "ece_rises": False, "auroc_question_falls": False, "required_met": True}
    assert result["per_seed"][1]["e_aurc_rises"] is False and result["test_bed"] is False  # one seed short
    assert pilot.verdict(start, {0: degraded, 1: degraded, 2: degraded})["test_bed"] is True
    assert pilot.verdict(start, {0: {**degraded, "accuracy": 0.419}})["test_bed"] is False


def test_redraw_reward_draws_a_gold_per_sample_and_keeps_derivable_golds():
    from types import SimpleNamespace

    from capo_trl.rewards import redraw_reward

    rows = guess_dataset("train", 40, task=GuessTask(guess_fraction=0.5))
    guess = next(r for r in rows if r["guessable"])
    derived = next(r for r in rows if not r["guessable"])
    answers = [re.search(r"\\boxed\{(-?\d+)\}", s)[1] for s in guess["solutions"]]
    n = 500
    state = SimpleNamespace(global_step=3)

    def reward(row, completion, step=state):
        return redraw_reward([completion] * n, solutions=[row["solutions"]] * n, guessable=[row["guessable"]] * n,
                             prompts=[row["prompt"]] * n, trainer_state=step, answer=[row["answer"]] * n)

    # a derivable item: its one gold, whatever the position
    assert reward(derived, f"\\boxed{{{derived['answer']}}}") == [1.0] * n
    # a guessable item: each possible answer is right about 1 time in 5, and exactly one is right at each position
    grades = [reward(guess, f"\\boxed{{{a}}}") for a in answers]
    assert [sum(col) for col in zip(*grades)] == [1.0] * n
    shares = [sum(g) / n for g in grades]
    assert all(0.14 < s < 0.26 for s in shares), shares  # binomial(500, 0.2): 3.4 sd either side
    # deterministic for a step (a resumed run draws the same), different at another step
    assert reward(guess, f"\\boxed{{{answers[0]}}}") == grades[0]
    assert reward(guess, f"\\boxed{{{answers[0]}}}", SimpleNamespace(global_step=4)) != grades[0]


def test_the_redraw_task_trains_with_its_own_reward_and_evaluates_the_gold():
    from capo_trl.rewards import redraw_reward
    from capo_trl.harness.presets import Budget
    from capo_trl.harness.runs import _reward
    from capo_trl.rewards import math_accuracy_reward
    from capo_trl.data.tasks import TASKS

    assert _reward(Budget(task="guess-redraw")) is redraw_reward
    assert _reward(Budget(task="guess-half")) is math_accuracy_reward
    redraw, half = TASKS["guess-redraw"], TASKS["guess-half"]
    assert redraw.model_dir == half.model_dir
    assert redraw.dataset("test", 20).to_list() == half.dataset("test", 20).to_list()


def test_the_test_bed_drivers_train_with_the_tasks_own_reward(monkeypatch, tmp_path):
    from argparse import Namespace

    from capo_trl.harness import pilot, runs, testbed
    from capo_trl.rewards import redraw_reward

    args = Namespace(task="guess-redraw", steps=1, val_every=1, test_problems=4, model="unused")
    assert runs._reward(pilot.pilot_budget(args)) is redraw_reward

    class Trained(Exception):
        pass

    def train_method(overrides, seed, budget, *rest, **kwargs):
        assert runs._reward(budget) is redraw_reward
        raise Trained

    monkeypatch.setattr(runs, "train_method", train_method)
    with pytest.raises(Trained):
        testbed.train_record("guess-redraw", 1, 1, 4, str(tmp_path), "grpo", {"advantage_estimator": "grpo"}, 0)
