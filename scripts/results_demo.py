"""What `capo-trl demo` says after a run, written from the committed studies into the data file the package ships
(``src/capo_trl/assets/committed_studies.json``): an installed wheel has no docs/results/, so the demo reads its
numbers and words from that file, and ``tests/test_demo.py`` holds the file equal to what this script renders.

    python scripts/results_demo.py           # rewrite the file (python scripts/results_tables.py does too)
    python scripts/results_demo.py --check   # exit 1 if it is stale
"""

from __future__ import annotations

import json
import sys

import results_evidence as evidence
import results_screen as screen_words
import results_verdict as verdict
from results_common import RESULTS, ROOT

DATA = ROOT / "src" / "capo_trl" / "assets" / "committed_studies.json"
SHOWN = ("auroc", "auroc_question", "accuracy")  # capo_trl.evaluation.plots.DEMO_PANELS: what the demo draws

# What the evidence says on the embedded tasks with no confirmatory study of their own (docs/results/).
WORDS = {"arithmetic": """
What the evidence on this task says: on arithmetic GRPO does not lose calibration, so there is nothing for CAPO
to repair. RL raises accuracy and pooled AUROC over the start model whatever the method; per-question AUROC moves
by a few hundredths either way from seed to seed. In a pre-registered comparison (6 seeds, 600 steps, 1,024 test
problems) CAPO with the noise mask (the default then) had per-question AUROC 0.023 below GRPO's (95% interval
-0.049 to +0.003), with 6.5 points less accuracy and higher ECE (docs/results/: the powered comparison). Without the
mask one seed in five collapsed into long, improbable endings, with it none did: if mean length climbs, turn it
on (capo-trl compare --methods grpo,capo,capo-mask). Where GRPO does lose calibration: capo-trl demo (its
default task, guess-half).""",
         "guess": """
What the evidence on this task says (a quarter of the items can only be guessed): in three pre-registered
pilots (300, 600 and 1,000 steps, 3 seeds each) GRPO lost pooled AUROC on 2 of 3 seeds at most, so `guess` is
not a test bed, and no study compared GRPO and CAPO on it (docs/results/: the test-bed pilots). Where GRPO does lose
calibration: capo-trl demo (its default task, guess-half) and capo-trl demo --task guess-redraw.""",
         }


def real_words(real: dict, real_lr: dict | None, screen: dict, pick: dict | None, replication: dict | None) -> str:
    """The real model's studies in words, as the demo prints them after any task: the first study; the second only
    if its primary holds (its protocol's rule); the screening pilot (exploratory); from its look the study of the
    pilot's pick with the recommendation that follows, and its replication from its own look."""
    text = evidence.real_words(real)
    if real_lr is not None and real_lr["holds"]:
        text += "\n" + evidence.real_lr_words(real_lr)
    text += "\n" + screen_words.screen_paragraph(screen, "3e-4", looked=pick is not None)
    if pick is not None:
        text += "\n" + verdict.pick_paragraphs(pick, real_lr, screen["pick"], replication)
    return text


def _study_of(task: str):
    """The committed confirmatory study of ``task`` whose look stopped it, its records and look; None if none."""
    from capo_trl.harness import confirmatory
    from capo_trl.harness.study import load_study
    from capo_trl.harness.study_report import records

    for path in sorted(RESULTS.glob("*/study.yaml")):
        study = load_study(path.parent)
        if study.kind != "confirmatory" or study.task != task or any(a.preset is None for a in study.arms.values()):
            continue
        runs = records(study)
        look = confirmatory.analyse(study.folder, study.plan, ({"seeds": study.seeds}, runs))["look"]
        if look is not None and look["stop"]:
            return study, runs, look
    return None


def _spread(values: list) -> dict:
    from capo_trl.harness.paired import paired_interval

    mean, low, high = paired_interval(values, 0.95)
    return {"values": values, "mean": mean, "low": low, "high": high}


def committed_study(task: str) -> dict:
    """The study of ``task`` the demo sets its run against: each arm's method (its preset's fields) and every
    :data:`SHOWN` endpoint on each seed of the look that ended it, with their mean and 95% t interval; the start
    model's; its budget."""
    from capo_trl.harness.presets import parse_methods

    study, runs, look = _study_of(task)
    seeds = look["seeds"]
    arms = {arm: {"method": parse_methods(spec.preset)[0][1],
                  **{key: _spread([runs[arm][s][key] for s in seeds]) for key in SHOWN}}
            for arm, spec in study.arms.items()}
    start = json.loads((study.folder / "start.json").read_text())
    return {"folder": f"docs/results/{study.name}/", "seeds": len(seeds), "steps": study.steps,
            "test_problems": study.budget["test_problems"], "start": {key: start[key] for key in SHOWN},
            "arms": arms}


def render() -> dict:
    tasks = {task: {"words": text} for task, text in WORDS.items()}
    for task in evidence.STUDY_RESULTS:
        tasks[task] = {"words": evidence.study_words(task), "study": committed_study(task)}
    return {"about": "Written by scripts/results_demo.py from docs/results/ (tests/test_demo.py holds it equal to "
                     "the records): what capo-trl demo prints after a run.",
            "tasks": tasks,
            "real": real_words(evidence.REAL_RESULT, evidence.REAL_LR_RESULT, screen_words.SCREEN_RESULT,
                               evidence.PICK_RESULT, evidence.REPLICATION_RESULT)}


def text() -> str:
    return json.dumps(render(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    new = text()
    if "--check" in argv:
        if DATA.read_text() != new:
            print(f"{DATA.relative_to(ROOT)} is stale: run python scripts/results_demo.py")
            return 1
        return 0
    DATA.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
