"""The study of the screening pilot's pick is what its protocol (committed before the pilot's decision) says: the pick
the pilot's committed records give, its overrides with the learning rate 3e-4, GRPO's arm and seeds reused from the
second study, the seeds, endpoints, look, rules and deadline, and the power it states."""

from __future__ import annotations

from pathlib import Path

from capo_trl.cli.main import main
from capo_trl.harness.study import load_study
from capo_trl.harness.study_report import records, screen

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def test_the_pick_study_tests_the_pilots_pick_as_its_protocol_says():
    pilot, study, lr = (load_study(RESULTS / name) for name in ("smollm2-screen", "smollm2-pick-study",
                                                                 "smollm2-lr-study"))
    pick = screen(pilot, records(pilot))["pick"]
    arm = f"{pick}-lr3e-4"
    assert list(study.arms) == ["grpo-lr3e-4", arm] and study.kind == "confirmatory"
    grpo, chosen = lr.arms["grpo-lr3e-4"], pilot.arms[pick]
    assert (study.arms["grpo-lr3e-4"].recipe, study.arms["grpo-lr3e-4"].overrides) == (grpo.recipe, grpo.overrides)
    assert study.arms[arm].recipe == chosen.recipe
    overrides = dict(study.arms[arm].overrides)  # YAML reads 3e-4 (no dot) as text, as the second study wrote it
    assert float(overrides.pop("learning_rate")) == 3e-4 == float(grpo.overrides["learning_rate"])
    assert overrides == (
        {k: v for k, v in chosen.overrides.items() if k != "learning_rate"} | {"mask_truncated_completions": True})
    assert study.seeds == list(range(200, 213)) and (study.task, study.steps) == ("addition", 100)
    assert study.test == lr.test
    reuse = study.reuse["grpo-lr3e-4"]
    assert (reuse["folder"], reuse["arm"], reuse["seeds"]) == ("docs/results/smollm2-lr-study", "grpo-lr3e-4",
                                                               list(range(200, 212)))
    plan = study.plan
    assert plan.primary == ("auroc", arm, "grpo-lr3e-4") and plan.alternative == "two-sided"
    assert [s[0] for s in plan.secondaries] == ["auroc_question", "ece", "e_aurc", "accuracy"]
    assert [tuple(look) for look in plan.looks] == [(13, 0.05)]
    assert (plan.collapse_tokens, plan.min_finished, plan.undefined_auroc) == (30.0, 0.5, 0.5)
    assert plan.deadline.startswith("2027-02-15T00:00:00")


def test_the_pick_studys_seeds_come_from_the_power_its_protocol_states(capsys):
    assert main(["study", "plan", str(RESULTS / "smollm2-lr-study"), "--sd", "0.057", "--effect", "0.05"]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    protocol = (RESULTS / "smollm2-pick-study" / "protocol.md").read_text()
    assert said.startswith("13 seeds: ")
    power, doubled = said.split("power ")[1].split()[0], said.rsplit(": ", 1)[1].strip()
    assert f"power {power} with 13 seeds" in protocol and f"({doubled} if the SD is twice that)" in protocol


def test_the_replication_runs_the_pick_studys_arms_on_the_other_task_as_its_protocol_says():
    pick, rep = (load_study(RESULTS / name) for name in ("smollm2-pick-study", "smollm2-pick-guess-half"))
    assert rep.kind == "confirmatory" and rep.task == "addition-guess-half" and rep.steps == pick.steps == 100
    assert {a: (s.recipe, s.overrides) for a, s in rep.arms.items()} == \
        {a: (s.recipe, s.overrides) for a, s in pick.arms.items()}
    assert rep.seeds == list(range(300, 313)) and not set(rep.seeds) & set(pick.seeds) and not rep.reuse
    assert rep.test == pick.test and rep.plan.primary == pick.plan.primary
    assert rep.plan.secondaries == pick.plan.secondaries and rep.plan.alternative == "two-sided"
    assert [tuple(look) for look in rep.plan.looks] == [(13, 0.05)]
    assert (rep.plan.collapse_tokens, rep.plan.min_finished, rep.plan.undefined_auroc) == (30.0, 0.5, 0.5)
    assert rep.plan.deadline.startswith("2027-03-15T00:00:00")
    protocol = (RESULTS / "smollm2-pick-guess-half" / "protocol.md").read_text()
    assert "power 0.83 with 13 seeds at two-sided alpha 0.05" in " ".join(protocol.split())
