"""capo_trl.harness.testbed: the paired analysis of the pre-registered comparison, and the mask tally of a real run."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    from capo_trl.harness import testbed

    return testbed


def _record(script, auroc, accuracy, mask=None, e_aurc=0.10):
    rec = {k: 0.5 for k in ("auroc", *script.SECONDARY)}
    return {**rec, "auroc": auroc, "accuracy": accuracy, "e_aurc": e_aurc, "mask": mask or {}}


def test_paired_differences_use_complete_seeds_only(script, tmp_path):
    config = {"task": "guess-half", "methods": ["grpo", "capo"], "seeds": [0, 1, 2], "pilot_seeds": [0, 1],
              "steps": 10, "test_problems": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "start.json").write_text(json.dumps(_record(script, 0.90, 0.40, e_aurc=0.05)))
    grpo = {0: 0.70, 1: 0.80, 2: 0.60}
    capo = {0: 0.85, 1: 0.86}  # seed 2 unfinished: left out of every paired number
    for method, values in (("grpo", grpo), ("capo", capo)):
        (tmp_path / method).mkdir()
        for seed, auroc in values.items():
            mask = {"guessable/correct/dropped": 3, "guessable/correct/kept": 1, "derivable/correct/kept": 9,
                    "derivable/correct/dropped": 1} if method == "capo" else {}
            (tmp_path / method / f"seed{seed}.json").write_text(json.dumps(_record(script, auroc, 0.5, mask)))
    summary = script.report(tmp_path)
    assert summary["complete_seeds"] == [0, 1]
    diff = summary["paired_vs_grpo"]["capo"]["auroc"]
    assert diff["per_seed"] == pytest.approx([0.15, 0.06])
    mean, sd = 0.105, math.sqrt(((0.15 - 0.105) ** 2 + (0.06 - 0.105) ** 2) / 1)
    half = 12.7062047 * sd / math.sqrt(2)  # t(0.975, df=1)
    assert diff["mean"] == pytest.approx(mean) and diff["low"] == pytest.approx(mean - half, rel=1e-6)
    assert summary["arms"]["grpo"]["auroc"] == pytest.approx(0.75)  # seeds 0 and 1, not seed 2
    assert summary["pilot"]["per_seed"].keys() == {0, 1} and summary["pilot"]["test_bed"] is True  # grpo degraded
    assert summary["mask"]["capo"] == {"guessable/correct/dropped": 6, "guessable/correct/kept": 2,
                                       "derivable/correct/kept": 18, "derivable/correct/dropped": 2}
    table = (tmp_path / "compare.md").read_text()
    assert "| capo | 6 | 8 | 2 | 20 |" in table  # lucky guesses dropped of correct guessable; true answers
    assert table.count("| grpo |") == 2  # the means and the per-seed rows: an arm without the mask has no mask row


def test_the_tally_counts_what_the_mask_kept_and_dropped_in_a_real_run(script, tmp_path):
    from capo_trl.harness import runs
    from capo_trl.harness.presets import PRESETS, Budget
    from capo_trl.data.tasks import get_task

    budget = Budget(steps=2, prompts_per_step=4, num_generations=4, train_problems=16, val_every=2,
                    val_problems=4, val_samples=2, test_problems=4, test_samples=2, task="guess-half",
                    progress=False)
    counts: Counter = Counter()
    runs.train_method(PRESETS["grpo-mask"], 0, budget, tmp_path / "run", get_task("guess-half").dataset,
                      on_trainer=lambda trainer: script.tally_mask(trainer, counts))
    assert sum(counts.values()) == 2 * 4 * 4  # every training completion of both steps, once
    kinds = {key.split("/")[0] for key in counts}
    assert kinds <= {"guessable", "derivable"}
    verdicts = {key.split("/")[2] for key in counts}
    assert verdicts <= {"kept", "dropped", "unmasked"} and verdicts & {"kept", "dropped"}  # thresholds were measured
