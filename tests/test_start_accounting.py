"""scripts/start_accounting.py: its accounting of unfinished answers, on samples whose answer is known by
construction, and both accountings of the real model's start as its page's files hold them."""

import csv
import json
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "docs" / "results" / "smollm2-start"
RECIPE = ROOT / "examples" / "recipes" / "capo-smollm2-135m-lora-cpu.yaml"


@pytest.fixture
def accounting():
    return load_script("start_accounting")


def write_samples(folder: Path, groups: list[list[tuple[float, float, bool]]]) -> None:
    """One row per (grade, score, finished); problem ids written out of order, as `capo-trl eval` may."""
    folder.mkdir(parents=True)
    with open(folder / "samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "draw", "grade", "score", "num_tokens", "finished"])
        for g in reversed(range(len(groups))):
            for d, (grade, score, finished) in enumerate(groups[g]):
                w.writerow([f"t/{g}", d, grade, score, 24 + d % 3 if finished else 32, finished])


def test_grpo_charges_unfinished_wrong_answers_and_capo_nearly_not(accounting, tmp_path):
    """Each group: 3 right (confident), 3 wrong finished (middling), 2 wrong unfinished (very unconfident).

    GRPO gives every wrong answer of a group one advantage, so unfinished ones carry 2/5 of the negative total;
    CAPO's relative tau is half the within-group SD of the scores (0.76 nats), about 0.38: a right answer's pair
    with an unfinished one (1.75 nats apart) weighs sigmoid(-1.75 / 0.38), about 0.010, against 0.34 for its pair
    with a finished wrong one (0.25 apart), so an unfinished answer's advantage is about 3% of a finished one's."""
    right, wrong, unfinished = (1.0, -0.05, True), (0.0, -0.3, True), (0.0, -1.8, False)
    group = [right] * 3 + [wrong] * 3 + [unfinished] * 2
    tied = [wrong] * 8  # no pair: left out of every mean
    shifted = [(g, s - 0.01 * i, f) for i, (g, s, f) in enumerate(group)]  # a within-group spread that varies
    write_samples(tmp_path / "t", [group, tied, shifted, group] * 2)
    report = accounting.truncation(tmp_path / "t", RECIPE, "capo")
    assert report["mixed_groups"] == 6 and report["mixed_groups_with_unfinished"] == 6
    assert (report["n/right"], report["n/wrong_finished"], report["n/wrong_unfinished"]) == (18, 18, 12)
    assert report["grpo/advantage/wrong_unfinished"] == pytest.approx(report["grpo/advantage/wrong_finished"])
    assert report["grpo/unfinished_total_per_group"] == pytest.approx(
        -2 / 5 * 3 * report["grpo/advantage/right"], rel=1e-5)  # the group sums to zero
    assert report["capo/advantage/right"] == pytest.approx(report["grpo/advantage/right"], rel=1e-5)  # matched
    ratio = report["capo/advantage/wrong_unfinished"] / report["capo/advantage/wrong_finished"]
    assert 0.02 < ratio < 0.04
    assert report["capo/unfinished_total_per_group"] == pytest.approx(
        2 * report["capo/advantage/wrong_unfinished"], rel=1e-5)
    # tied: each unfinished answer's three pairs with right answers weigh sigmoid(0), more than a finished wrong one's
    assert report["capo_tied/advantage/wrong_unfinished"] < report["capo_tied/advantage/wrong_finished"] < 0
    assert report["capo_tied/unfinished_total_per_group"] == pytest.approx(
        2 * report["capo_tied/advantage/wrong_unfinished"], rel=1e-5)


@pytest.mark.parametrize("task", ["addition", "addition-guess-half"])
def test_the_real_starts_files_are_what_it_computes(accounting, task):
    """The committed paper-mask.json and truncation.json are what the script computes from the committed samples: the
    paper's thresholds (per kind of item on the task with guessable ones) and the CAPO SmolLM2 recipe's batches under
    the embedded preset's CAPO settings (the recipe's method block when they were computed)."""
    folder = START / task
    assert accounting.thresholds(folder, task, 2.5, 1.05) == json.loads((folder / "paper-mask.json").read_text())
    # float32 sums over the batch's rows, ordered by the CPU's vector width: a few ulps apart across machines (1e-7
    # relative seen between two CPUs here); 1e-5 leaves ten times that, far below what another setting would move
    computed, committed = accounting.truncation(folder, RECIPE, "capo"), json.loads((folder / "truncation.json").read_text())
    assert computed.keys() == committed.keys()
    for key, value in committed.items():
        if isinstance(value, float):
            assert computed[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
        else:
            assert computed[key] == value, key
