"""The pre-registered analysis (harness/confirmatory.py) with the plans the studies' files fix (study.yaml): the
paired tests against hand-computed values, the looks and the stopping rule on synthetic study folders, and the copy
of runs under arm names."""

import dataclasses
import datetime
import json
import math
from pathlib import Path

import numpy as np
import pytest

from capo_trl.harness import confirmatory as cf
from capo_trl.harness.paired import holm, paired_test, sign_flip_p
from capo_trl.harness.study import load_study

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def committed(name: str, folder: Path | None = None):
    """A committed study's file (docs/results/<name>/study.yaml), its records read from ``folder`` when given."""
    study = load_study(RESULTS / name)
    return study if folder is None else dataclasses.replace(study, folder=folder)


PLAN = committed("guess-half-mask-study").plan
REDRAW = committed("guess-redraw-study").plan
REAL_STUDY = committed("smollm2-study").plan
REAL_LR_STUDY = committed("smollm2-lr-study").plan
KEYS = ("auroc", "accuracy", "guessable/modal_share", "mean_tokens", *PLAN.descriptive)


def test_paired_test_by_hand():
    """d = 1, 2, 3: t = 2 / (1 / sqrt 3) with 2 df, p = 1 - 2 * t / (2 sqrt(t^2 + 2)) (the t(2) cdf in closed
    form); of the 8 sign patterns exactly 2 (+++, ---) reach |mean| >= 2, so the exact sign-flip p is 1/4."""
    got = paired_test([1.0, 2.0, 3.0])
    t = 2 * math.sqrt(3)
    assert got["mean"] == pytest.approx(2.0) and got["sd"] == pytest.approx(1.0)
    assert got["p"] == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    assert got["flip_p"] == pytest.approx(0.25, abs=1e-12)
    assert (got["n"], got["favour"]) == (3, 3)


def test_a_one_sided_paired_test_by_hand():
    """d = 1, 2, 3 tested one-sided: the t p halves in the direction of the mean and is 1 minus that against it;
    of the 8 sign patterns only +++ reaches mean >= 2 (1/8); the one-sided 95% bound is the mean minus t(0.95, 2)
    standard errors, the other bound infinite."""
    from scipy import stats

    two, up, down = paired_test([1.0, 2.0, 3.0]), paired_test([1.0, 2.0, 3.0], alternative="greater"), \
        paired_test([1.0, 2.0, 3.0], alternative="less")
    assert up["p"] == pytest.approx(two["p"] / 2, rel=1e-9) and down["p"] == pytest.approx(1 - two["p"] / 2, rel=1e-9)
    assert up["flip_p"] == pytest.approx(1 / 8, abs=1e-12) and down["flip_p"] == pytest.approx(1.0, abs=1e-12)
    assert up["low"] == pytest.approx(2 - stats.t.ppf(0.95, 2) / math.sqrt(3), rel=1e-9) and up["high"] == math.inf
    assert down["low"] == -math.inf


def test_one_sided_power_by_hand():
    """The noncentral t's tail beyond t(1 - alpha): above the two-sided test's power, and its seeds for power 0.8
    are those `capo-trl study plan --one_sided` prints."""
    from scipy import stats

    from capo_trl.harness.paired import t_power

    shift = 0.05 / 0.057 * math.sqrt(10)
    assert t_power(0.05, 0.057, 10, one_sided=True) == pytest.approx(stats.nct.sf(stats.t.ppf(0.95, 9), 9, shift))
    assert t_power(0.05, 0.057, 10, one_sided=True) > t_power(0.05, 0.057, 10)
    assert min(n for n in range(2, 30) if t_power(0.05, 0.057, n, one_sided=True) >= 0.8) == 10


def test_sign_flips_beyond_the_exact_limit_are_random_but_reproducible():
    d = np.ones(20)  # exact p would be 2 / 2^20
    first = sign_flip_p(d)
    assert first == sign_flip_p(d) and first < 1e-4


def test_holm_by_hand():
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})


def write_study(folder, seeds_done, effect=0.1, noise=0.02, drop=()):
    """A study folder as the runner writes it: every arm's seed files for ``seeds_done``; ``drop``: (arm, seed)
    runs not finished."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"methods": list(PLAN.arms.values()), "seeds": list(range(24))}))
    (folder / "start.json").write_text(json.dumps({k: 0.5 for k in KEYS}))
    for s in seeds_done:
        rng = np.random.default_rng(s)
        base = 0.70 + rng.normal(0, 0.05)
        for arm in PLAN.arms:
            if (arm, s) in drop:
                continue
            rec = {k: float(rng.uniform(0.2, 0.6)) for k in KEYS}
            rec["auroc"] = base + (effect if arm != "grpo" else 0.0) + rng.normal(0, noise)
            rec["mean_tokens"] = 40.0 if (arm, s) == ("grpo", 0) else 20.0
            rec["mask"] = ({"guessable/correct/dropped": 1, "guessable/correct/kept": 3, "derivable/wrong/kept": 2}
                           if arm.startswith("capo-") and arm != "capo-nomask" else {})
            (folder / arm).mkdir(exist_ok=True)
            (folder / arm / f"seed{s}.json").write_text(json.dumps(rec))
    return folder


def test_before_the_first_look_nothing_is_computed(tmp_path):
    a = cf.analyse(write_study(tmp_path, range(11)), PLAN)
    assert a["look"] is None and "primary" not in a
    text = cf.render(a, PLAN)
    assert "No look yet" in text and "auroc" not in text


def test_the_interim_look_uses_the_first_twelve_complete_seeds_and_stops_for_efficacy(tmp_path):
    folder = write_study(tmp_path, [*range(12), 13, 14], drop={("capo-fixed", 13)})
    a = cf.analyse(folder, PLAN)
    look = a["look"]
    assert (look["name"], look["alpha"], look["seeds"]) == ("interim", 0.005, list(range(12)))
    assert look["incomplete_seeds"] == [13, 14] and look["stop"] and look["reason"] == "efficacy"
    assert a["primary"]["holds"] and a["primary"]["confidence"] == pytest.approx(0.995)
    assert a["confirmatory_secondaries"] and a["collapse"]["grpo"] == [0]
    assert a["mask"]["capo-fixed"] == {"lucky guesses": 0.25, "true answers": pytest.approx(math.nan, nan_ok=True),
                                       "wrong answers": 0.0}
    assert "stopped for efficacy at the interim look" in cf.render(a, PLAN)


def test_a_stop_at_the_interim_look_stands_when_later_runs_finish(tmp_path):
    """Runs that finish after the study stopped (a runner killed a little late) never open the final look."""
    a = cf.analyse(write_study(tmp_path, range(24)), PLAN)
    assert (a["look"]["name"], a["look"]["reason"], a["look"]["seeds"]) == ("interim", "efficacy", list(range(12)))
    assert a["look"]["incomplete_seeds"] == list(range(12, 24))


def test_no_effect_goes_on_to_the_final_look_at_alpha_0_047(tmp_path):
    a = cf.analyse(write_study(tmp_path, range(12), effect=0.0), PLAN)
    assert not a["look"]["stop"] and not a["primary"]["holds"] and not a["confirmatory_secondaries"]
    assert not any(c["rejected"] for c in a["secondary"])
    assert "exploratory" in cf.render(a, PLAN)
    b = cf.analyse(write_study(tmp_path / "full", range(24), effect=0.0), PLAN)
    assert (b["look"]["name"], b["look"]["alpha"], len(b["look"]["seeds"])) == ("final", 0.047, 24)
    assert b["primary"]["confidence"] == pytest.approx(0.953)


def test_closing_at_the_deadline_makes_the_last_look_final(tmp_path):
    folder = write_study(tmp_path, range(14), effect=0.0)
    with pytest.raises(ValueError, match="the deadline is 2026-12-20"):
        cf.close(folder, PLAN, now=datetime.datetime(2026, 12, 19, tzinfo=datetime.timezone.utc))
    cf.close(folder, PLAN, now=datetime.datetime(2026, 12, 20, 1, tzinfo=datetime.timezone.utc))
    a = cf.analyse(folder, PLAN)
    assert (a["look"]["name"], a["look"]["alpha"], a["look"]["seeds"]) == ("final", 0.047, list(range(14)))


def test_collect_copies_runs_under_arm_names_once(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "config.json").write_text(json.dumps({"methods": list(PLAN.arms.values()), "seeds": [0]}))
    for label in PLAN.arms.values():
        (runs / label).mkdir()
        (runs / label / "seed0.json").write_text("{}")
    into = tmp_path / "study"
    assert sorted(cf.collect(runs, into, PLAN)) == sorted(["config.json", *(f"{a}/seed0.json" for a in PLAN.arms)])
    assert cf.collect(runs, into, PLAN) == []
    (runs / "config.json").write_text(json.dumps({"methods": ["grpo"], "seeds": [0]}))
    with pytest.raises(ValueError, match="the plan's arms are"):
        cf.collect(runs, into, PLAN)


def test_restore_puts_committed_runs_back_under_their_labels_once(tmp_path):
    """A fresh machine resumes the study: restore is collect's inverse, and the runner then reuses every run."""
    study = write_study(tmp_path / "study", [0, 1], drop={("capo-fixed", 1)})
    runs = tmp_path / "runs"
    moved = cf.restore(study, runs, PLAN)
    assert len(moved) == 2 + 2 * len(PLAN.arms) - 1
    for arm, label in PLAN.arms.items():
        for s in (0, 1):
            restored = runs / label / f"seed{s}.json"
            assert restored.is_file() == ((arm, s) != ("capo-fixed", 1))
            if restored.is_file():
                assert restored.read_bytes() == (study / arm / f"seed{s}.json").read_bytes()
    assert cf.restore(study, runs, PLAN) == []
    assert cf.collect(runs, tmp_path / "again", PLAN) and cf.load(tmp_path / "again", PLAN)[1] == cf.load(study, PLAN)[1]


def test_the_plan_is_the_protocols_command():
    """The arms the analysis expects are the method specifications the protocol's command runs, and the ones its
    config.json recorded."""
    protocol = (RESULTS / "guess-half-mask-study/protocol.md").read_text()
    fixed = "ref_thresholds=fixed:ref_high=1.0336:ref_low=1.0563"
    for label in PLAN.arms.values():
        assert label.replace(fixed, "$M") in protocol or label in protocol, label
    assert cf.check_config(RESULTS / "guess-half-mask-study", PLAN)["seeds"] == list(range(24))
    assert PLAN.looks == ((12, 0.005), (24, 0.047)) and PLAN.collapse_tokens == 36 and PLAN.undefined_auroc is None


def test_a_single_look_without_secondaries_is_final_at_its_seeds(tmp_path):
    """The replication on guess-redraw: one look at 12 seeds, alpha 0.05, the primary and its sign-flip test only."""
    plan = REDRAW
    folder = tmp_path / "redraw"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"methods": list(plan.arms.values()), "seeds": list(range(12))}))
    (folder / "start.json").write_text(json.dumps({k: 0.5 for k in KEYS}))
    for s in range(12):
        for arm in plan.arms:
            rec = {k: 0.4 for k in KEYS} | {"auroc": 0.7 + 0.01 * s + (0.05 + 0.001 * s if arm == "capo-nomask" else 0),
                                             "mean_tokens": 28.0, "mask": {}}
            (folder / arm).mkdir(exist_ok=True)
            (folder / arm / f"seed{s}.json").write_text(json.dumps(rec))
        a = cf.analyse(folder, plan)
        assert (a["look"] is None) == (s < 11)  # nothing is computed before the twelfth complete seed
    assert (a["look"]["name"], a["look"]["alpha"], a["look"]["seeds"]) == ("final", 0.05, list(range(12)))
    assert a["primary"]["holds"] and a["primary"]["favour"] == 12 and a["primary"]["flip_p"] == pytest.approx(2 / 4096)
    assert a["secondary"] == [] and a["mask"] == {}
    text = cf.render(a, plan)
    assert "capo-nomask - grpo (primary)" in text and "Secondary" not in text and "final look" in text


@pytest.mark.parametrize("alternative, holds", [("greater", True), ("less", False), ("two-sided", True)])
def test_a_one_sided_primary_holds_only_in_its_direction(tmp_path, alternative, holds):
    """A study file's primary with ``alternative`` is tested one-sided: the same records hold for greater, not for
    less, and the page says how the primary was tested."""
    plan = dataclasses.replace(REDRAW, alternative=alternative)
    folder = tmp_path / "redraw"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"methods": list(plan.arms.values()), "seeds": list(range(12))}))
    for s in range(12):
        for arm in plan.arms:
            rec = {k: 0.4 for k in KEYS} | {"auroc": 0.7 + (0.02 + 0.01 * (s % 3) if arm == "capo-nomask" else 0),
                                             "mean_tokens": 28.0, "mask": {}}
            (folder / arm).mkdir(exist_ok=True)
            (folder / arm / f"seed{s}.json").write_text(json.dumps(rec))
    a = cf.analyse(folder, plan)
    assert a["primary"]["holds"] == holds and a["primary"]["alternative"] == alternative
    text = cf.render(a, plan)
    sides = {"greater": "one-sided (capo-nomask - grpo > 0) alpha 0.05", "less": "one-sided (capo-nomask - grpo < 0) "
             "alpha 0.05", "two-sided": "two-sided alpha 0.05"}[alternative]
    assert sides in text and ("one-sided t interval" in text) == (alternative != "two-sided")


def test_a_study_files_primary_may_be_one_sided(tmp_path):
    import yaml

    from capo_trl.errors import UsageError

    source = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/studies/tiny/study.yaml").read_text())
    root = tmp_path / "project"
    (root / "examples" / "recipes").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    for name in ("grpo-arith-tiny-cpu.yaml", "capo-arith-tiny-cpu.yaml"):
        text = (Path(__file__).resolve().parents[1] / "examples" / "recipes" / name).read_text()
        (root / "examples" / "recipes" / name).write_text(text)
    for side, ok in (("greater", True), ("less", True), ("above", False)):
        source["primary"] = {"endpoint": "auroc", "arm": "capo", "minus": "grpo", "alternative": side}
        (root / "study.yaml").write_text(yaml.safe_dump(source))
        if ok:
            assert load_study(root).plan.alternative == side
        else:
            with pytest.raises(UsageError, match=r"primary.alternative = 'above'; use greater .* or less"):
                load_study(root)
    source["secondaries"] = [{"endpoint": "accuracy", "arm": "capo", "minus": "grpo", "alternative": "less"}]
    (root / "study.yaml").write_text(yaml.safe_dump(source))
    with pytest.raises(UsageError, match=r"secondaries\[0\] must be \{endpoint: E, arm: A, minus: B\}"):
        load_study(root)


def test_the_redraw_plan_is_its_protocols_command():
    protocol = (RESULTS / "guess-redraw-pilot/protocol.md").read_text()
    assert f"--methods {','.join(REDRAW.arms.values())} \\\n  --seeds $(seq 0 11)" in protocol
    assert REDRAW.looks == ((12, 0.05),) and REDRAW.secondaries == ()


def test_a_plain_task_has_no_guessable_means_and_a_run_that_never_finishes_collapsed(tmp_path):
    """A real model's plan: a plain task has no guessable items (those means are nan, not an error), and a run
    whose samples mostly never finish collapsed even when their mean length is under the token limit."""
    arms = ("grpo", "capo-nomask", "capo-mask-paper", "capo-mask-measured")
    plan = cf.Plan(arms={a: a for a in arms}, primary=("auroc", "capo-nomask", "grpo"), looks=((12, 0.05),),
                   secondaries=(("auroc_question", "capo-nomask", "grpo"), ("ece", "capo-nomask", "grpo"),
                                ("e_aurc", "capo-nomask", "grpo"), ("auroc", "capo-mask-paper", "capo-nomask"),
                                ("auroc", "capo-mask-measured", "capo-nomask")),
                   deadline="2027-01-01T00:00:00+00:00", collapse_tokens=30.0, min_finished=0.5,
                   descriptive=("auroc_question", "ece", "e_aurc", "finished_frac", "derivable/accuracy"))
    seeds = list(range(100, 112))
    (tmp_path / "config.json").write_text(json.dumps({"methods": list(plan.arms.values()), "seeds": seeds}))
    keys = ("auroc", "accuracy", "auroc_question", "ece", "e_aurc", "mean_tokens", "finished_frac", "derivable/accuracy")
    (tmp_path / "start.json").write_text(json.dumps({k: 0.5 for k in keys}))
    for s in seeds:
        for i, arm in enumerate(plan.arms):
            rng = np.random.default_rng(10 * s + i)
            rec = {k: 0.5 + rng.uniform(0, 0.02) for k in keys} | {"auroc": 0.75 + 0.04 * (arm == "capo-nomask") + rng.normal(0, 0.01),
                                            "mean_tokens": 24.0, "finished_frac": 0.3 if (arm, s) == ("grpo", 103) else 0.99,
                                            "mask": {}}
            (tmp_path / arm).mkdir(exist_ok=True)
            (tmp_path / arm / f"seed{s}.json").write_text(json.dumps(rec))
    a = cf.analyse(tmp_path, plan)
    assert (a["look"]["name"], a["look"]["seeds"]) == ("final", seeds) and a["primary"]["holds"]
    assert a["collapse"] == {"grpo": [103], "capo-nomask": [], "capo-mask-paper": [], "capo-mask-measured": []}
    assert math.isnan(a["means"]["grpo"]["guessable/modal_share"]) and 0.5 <= a["means"]["grpo"]["derivable/accuracy"] < 0.52
    assert [c["endpoint"] for c in a["secondary"]] == ["auroc_question", "ece", "e_aurc", "auroc", "auroc"]
    assert "or less than 0.5 of its samples finished" in cf.render(a, plan)


def test_the_real_model_study_runs_what_its_protocol_says():
    """Its study.yaml runs the plan's arms on its seeds with the flags the protocol names, and the committed
    config.json is what its runner wrote from them."""
    study = committed("smollm2-study")
    plan, protocol = study.plan, (RESULTS / "smollm2-study/protocol.md").read_text()
    assert study.seeds == list(range(100, 112)) and plan.looks == ((12, 0.05),)
    assert (plan.collapse_tokens, plan.min_finished, plan.undefined_auroc) == (30.0, 0.5, 0.5)
    assert "2026-12-31 00:00 UTC" in protocol and plan.deadline.startswith("2026-12-31T00:00:00")
    for arm in study.arms.values():
        flags = arm.flags()
        assert flags[:2] == ["--mask_truncated_completions", "true"]
        assert " ".join(flags[2:]) in protocol.replace("\n   ", " "), arm.name
    config = json.loads((RESULTS / "smollm2-study/config.json").read_text())
    assert config["methods"] == list(plan.arms.values()) and config["seeds"] == study.seeds
    assert {a: v["flags"] for a, v in config["arms"].items()} == {a: arm.flags() for a, arm in study.arms.items()}
    assert {a: v["recipe"] for a, v in config["arms"].items()} == {a: arm.recipe for a, arm in study.arms.items()}


def test_the_real_model_second_study_runs_what_its_protocol_says(capsys):
    """Its study.yaml runs the learning-rate pilot's two arms on new seeds, the committed config.json is what its
    runner wrote from them, and `capo-trl study plan` with the SD of the pilot's committed records (the protocol's
    rule) gives the protocol's power numbers."""
    import statistics

    from capo_trl.cli.main import main
    from capo_trl.harness.study_report import records

    study, pilot = committed("smollm2-lr-study"), committed("smollm2-lr")
    plan, protocol = study.plan, (RESULTS / "smollm2-lr-study/protocol.md").read_text()
    assert study.arms == pilot.arms and study.seeds == list(range(200, 212)) and not set(study.seeds) & set(range(100, 112))
    assert plan.primary == ("auroc", "capo-nomask-lr3e-4", "grpo-lr3e-4") and plan.looks == ((12, 0.05),)
    assert [e for e, *_ in plan.secondaries] == ["auroc_question", "ece", "e_aurc"]
    assert (plan.collapse_tokens, plan.min_finished, plan.undefined_auroc) == (30.0, 0.5, 0.5)
    assert "2027-01-15 00:00 UTC" in protocol and plan.deadline.startswith("2027-01-15T00:00:00")
    for arm in study.arms.values():
        flags = arm.flags()
        assert f"`{arm.recipe}` `{' '.join(flags[:2])}\n   {' '.join(flags[2:])}`" in protocol, arm.name
    config = json.loads((RESULTS / "smollm2-lr-study/config.json").read_text())
    assert config["methods"] == list(plan.arms.values()) and config["seeds"] == study.seeds
    assert {a: v["flags"] for a, v in config["arms"].items()} == {a: arm.flags() for a, arm in study.arms.items()}
    assert (RESULTS / "smollm2-lr-study/start.json").read_text() == (RESULTS / "smollm2-study/start.json").read_text()
    auroc = {arm: [r["auroc"] for _, r in sorted(by_seed.items())] for arm, by_seed in records(pilot).items()}
    diffs = [c - g for g, c in zip(auroc["grpo-lr3e-4"], auroc["capo-nomask-lr3e-4"])]
    sd = max(statistics.stdev(diffs), statistics.stdev(auroc["grpo-lr3e-4"]) * 2 ** 0.5)
    assert f"is {sd:.3f}" in protocol
    assert main(["study", "plan", str(RESULTS / "smollm2-lr-study"), "--sd", repr(sd), "--effect", "0.05",
                 "--max_seeds", "24"]) == 0
    said, cost = capsys.readouterr().out.splitlines()
    power, doubled = said.split("power ")[1].split()[0], said.rsplit(": ", 1)[1].strip()
    assert said.startswith("12 seeds: ") and f"power {power} with 12 seeds" in protocol
    assert f"the power is {doubled}" in protocol


def test_the_second_study_analysis_runs_on_its_records(tmp_path):
    """Records as its runner wrote them (its committed config and start) reach the final look: the
    primary, the three secondaries, and the collapse rule; a run lacking a seed's partner is left out."""

    plan = REAL_LR_STUDY
    for name in ("config.json", "start.json"):
        (tmp_path / name).write_text((RESULTS / "smollm2-lr-study" / name).read_text())
    keys = ("auroc", "accuracy", "mean_tokens", "finished_frac", *plan.descriptive)
    for s in range(200, 212):
        rng = np.random.default_rng(s)
        for arm, shift in zip(plan.arms, (0.0, -0.06)):
            rec = {k: float(rng.uniform(0.2, 0.6)) for k in keys}
            rec.update(auroc=0.8 + shift + rng.normal(0, 0.01), mean_tokens=31.0 if (arm, s) == (_C, 205) else 23.5,
                       finished_frac=0.97, mask={})
            (tmp_path / arm).mkdir(exist_ok=True)
            (tmp_path / arm / f"seed{s}.json").write_text(json.dumps(rec))
    a = cf.analyse(tmp_path, plan)
    assert a["look"]["name"] == "final" and a["look"]["seeds"] == list(range(200, 212)) and a["primary"]["holds"]
    assert a["primary"]["high"] < 0 and [c["endpoint"] for c in a["secondary"]] == ["auroc_question", "ece", "e_aurc"]
    assert a["collapse"] == {"grpo-lr3e-4": [], _C: [205]}
    assert "capo-nomask-lr3e-4 - grpo-lr3e-4 (primary)" in cf.render(a, plan)


_G, _C = "grpo-lr3e-4", "capo-nomask-lr3e-4"


@pytest.mark.parametrize("effect, verdict", [
    (-0.06, "so CAPO without the noise mask ranked answers worse than GRPO there"),
    (0.0, "so no difference between CAPO without the noise mask and GRPO was shown there")])
def test_the_second_studys_words_are_fixed_before_its_look(tmp_path, effect, verdict):
    """The README's words for the second study: before its look no result and no count (a finished run then changes
    only the study's own page); at it the verdict its interval supports, every endpoint, and its own undefined rule."""

    import results_evidence as evidence
    from capo_trl.harness.study_report import analysis

    study = committed("smollm2-lr-study", tmp_path)
    plan = study.plan
    (tmp_path / "start.json").write_text((RESULTS / "smollm2-lr-study" / "start.json").read_text())
    keys = ("auroc", "accuracy", "mean_tokens", "finished_frac", *plan.descriptive)

    def write(seeds):
        for s in seeds:
            rng = np.random.default_rng(s)
            base = 0.75 + rng.normal(0, 0.03)
            for arm, shift in zip(plan.arms, (0.0, effect)):
                rec = {k: float(rng.uniform(0.2, 0.6)) for k in keys}
                rec.update(auroc=base + shift + rng.normal(0, 0.01), mean_tokens=23.5, finished_frac=0.97, mask={})
                (tmp_path / arm).mkdir(exist_ok=True)
                (tmp_path / arm / f"seed{s}.json").write_text(json.dumps(rec))

    write(range(200, 211))
    pending = evidence.real_lr_words(evidence.measure_real(study))
    assert pending == evidence.real_lr_words(evidence.measure_real(study) | {"finished": {}})
    assert "No result yet: its one analysis comes at 12 complete seeds." in " ".join(pending.split())
    assert "AUROC" not in pending and "11" not in pending
    write([211])
    r = evidence.measure_real(study)
    a = analysis(study)
    assert r["primary"] == tuple(round(a["primary"][k], 3) for k in ("mean", "low", "high"))
    assert (r["grpo"], r["nomask"]) == (round(a["means"][_G]["auroc"], 3), round(a["means"][_C]["auroc"], 3))
    text = " ".join(evidence.real_lr_words(r).split())
    assert text.startswith("At learning rate 3e-4, on the same model and task: in a second pre-registered study at its "
                           "final look with 12 complete seeds") and verdict in text
    assert text.count("Holm p = ") == 3 and f"Collapsed runs of 12: {_G} 0, {_C} 0." in text
    rec = json.loads((tmp_path / _C / "seed203.json").read_text())
    (tmp_path / _C / "seed203.json").write_text(json.dumps({**rec, "auroc": None}))
    text = " ".join(evidence.real_lr_words(evidence.measure_real(study)).split())
    assert f"counted as 0.5, as its protocol says, for {_C} seed 203; leaving those seeds out" in text


@pytest.mark.parametrize("effect, verdict", [
    (0.06, "so CAPO with the paper's settings kept pooled AUROC better than GRPO there"),
    (-0.06, "so CAPO with the paper's settings ranked answers worse than GRPO there"),
    (0.0, "so no difference between CAPO with the paper's settings and GRPO was shown there")])
def test_the_pick_studys_words_are_fixed_before_its_look(tmp_path, effect, verdict):
    """The words for the study of the screening pilot's pick, written before its look (a confirmatory study's
    records, here the second study's layout): no result and no count before the look; at it the verdict its interval
    supports, naming the pick's settings, and every secondary with its Holm p."""
    import results_evidence as evidence

    study = committed("smollm2-lr-study", tmp_path)
    (tmp_path / "start.json").write_text((RESULTS / "smollm2-lr-study" / "start.json").read_text())
    keys = ("auroc", "accuracy", "mean_tokens", "finished_frac", *study.plan.descriptive)
    for s in range(200, 212):
        rng = np.random.default_rng(s)
        base = 0.75 + rng.normal(0, 0.03)
        for arm, shift in zip(study.plan.arms, (0.0, effect)):
            rec = {k: float(rng.uniform(0.2, 0.6)) for k in keys}
            rec.update(auroc=base + shift + rng.normal(0, 0.01), mean_tokens=23.5, finished_frac=0.97, mask={})
            (tmp_path / arm).mkdir(exist_ok=True)
            (tmp_path / arm / f"seed{s}.json").write_text(json.dumps(rec))
        if s == 210:
            pending = " ".join(evidence.pick_words(evidence.measure_real(study), "capo-paper").split())
            assert pending == ("A confirmatory study of the screen's pick, CAPO with the paper's settings, against "
                               "GRPO at learning rate 3e-4 on the same model and task (its protocol committed before "
                               "its runs and before the screen's decision) has no result yet: its one analysis comes "
                               "at 12 complete seeds.")
            assert " ".join(evidence.replication_words(evidence.measure_real(study), "capo-paper").split()).endswith(
                "has no result yet: its one analysis comes at 12 complete seeds.")
    text = " ".join(evidence.pick_words(evidence.measure_real(study), "capo-paper").split())
    assert text.startswith("At learning rate 3e-4, on the same model and task: in a pre-registered study of the "
                           "screening pilot's pick at its final look with 12 complete seeds") and verdict in text
    assert text.count("Holm p = ") == 3 and "under CAPO with the paper's settings: " in text
    again = " ".join(evidence.replication_words(evidence.measure_real(study), "capo-paper").split())
    assert again.startswith("On `addition-guess-half` (half the items hide an operand), at learning rate 3e-4: in a "
                            "pre-registered replication of the pick's study at its final look") and verdict in again


def test_the_runner_keeps_the_record_the_second_studys_analysis_reads(tmp_path, monkeypatch):
    """`capo-trl study run` (cli/study_run.py) with the second study's arm, flags and log keys (its study.yaml, less
    the frozen commit and cannot_run that keep today's runner from it) trains the arm's recipe with its flags on its
    task, seed and steps, and writes ``<arm>/seed<k>.json`` with the keys the analysis reads (training and test
    stubbed)."""
    from capo_trl.cli import study_run

    study = dataclasses.replace(committed("smollm2-lr-study", tmp_path / "out"), cannot_run=None, frozen_commit=None)
    arm = study.arms["capo-nomask-lr3e-4"]
    calls = []

    def fake_train_and_test(study_, arm_, seed, run, log, times):
        calls.append(study_run._train_args(study_, arm_, seed, run))
        (run / "checkpoint-100").mkdir(parents=True)
        state = {"global_step": 100, "log_history": [{"step": 5, "reward": 0.3, "entropy": 0.1, "other": 1.0}]}
        (run / "checkpoint-100" / "trainer_state.json").write_text(json.dumps(state))
        (run / "test").mkdir()
        (run / "test" / "report.json").write_text("{}")
        times.update(train_s=[1], test_s=2)

    monkeypatch.setattr(study_run, "_train_and_test", fake_train_and_test)
    monkeypatch.setattr(study_run, "record_of", lambda report, samples, task, n: {"auroc": 0.8, "mean_tokens": 23.0})
    path = study_run.run_one(study, "capo-nomask-lr3e-4", 203, tmp_path / "runs")
    assert path == tmp_path / "out" / "capo-nomask-lr3e-4" / "seed203.json"
    (args,) = calls
    assert args[:9] == ["train", "--config", arm.recipe, "--dataset_name", "addition", "--seed", "203", "--max_steps",
                        "100"] and args[-4:] == arm.flags()[-4:] == ["--mask_truncated_completions", "true",
                                                                     "--learning_rate", "3e-4"]
    rec = json.loads(path.read_text())
    assert rec["auroc"] == 0.8 and rec["flags"][-2:] == ["--learning_rate", "3e-4"] and rec["recipe"] == arm.recipe
    assert (rec["arm"], rec["seed"], rec["global_step"], rec["train"]) == \
        ("capo-nomask-lr3e-4", 203, 100, [{"step": 5, "reward": 0.3, "entropy": 0.1}])


def write_real_study(folder, seeds_done, effect, noise=0.01):
    """The real study's folder as its runner wrote it (its config and start copied), with synthetic runs: ``effect``
    added to capo-nomask's pooled AUROC over GRPO's, the mask arms 0.02 below capo-nomask; returns the study, its
    file the committed one."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "start.json"):
        (folder / name).write_text((RESULTS / "smollm2-study" / name).read_text())
    keys = ("auroc", "accuracy", "mean_tokens", "finished_frac", *REAL_STUDY.descriptive)
    shift = {"grpo": 0.0, "capo-nomask": effect, "capo-mask-paper": effect - 0.02, "capo-mask-measured": effect - 0.02}
    for s in seeds_done:
        rng = np.random.default_rng(s)
        base = 0.72 + rng.normal(0, 0.03)
        for arm in REAL_STUDY.arms:
            rec = {k: float(rng.uniform(0.2, 0.6)) for k in keys}
            rec.update(auroc=base + shift[arm] + rng.normal(0, noise), mean_tokens=23.5, finished_frac=0.97, mask={})
            (folder / arm).mkdir(exist_ok=True)
            (folder / arm / f"seed{s}.json").write_text(json.dumps(rec))
    return committed("smollm2-study", folder)


@pytest.mark.parametrize("effect, verdict, kind", [
    (0.05, "so CAPO without the noise mask kept pooled AUROC better than GRPO there", "(confirmatory)"),
    (-0.05, "so CAPO without the noise mask ranked answers worse than GRPO there", "(confirmatory)"),
    (0.0, "so no difference between CAPO without the noise mask and GRPO was shown there",
     "(exploratory, since the primary does not hold)")])
def test_the_real_study_words_follow_the_interval(tmp_path, effect, verdict, kind):
    """The words the README renders for the real model, fixed before the study's look: none before it; at it the
    verdict the primary's p and interval support, and every pre-registered endpoint."""
    import results_evidence as evidence

    study = write_real_study(tmp_path / "smollm2-study", range(100, 111), effect)
    folder = study.folder
    pending = evidence.measure_real(study)  # 11 complete seeds: no look, no endpoint, only the safety reading
    assert pending == {"look": False, "planned": 12, "finished": dict.fromkeys(REAL_STUDY.arms, 11),
                       "collapsed": dict.fromkeys(REAL_STUDY.arms, 0), "rule": (30.0, 0.5)}
    words = " ".join(evidence.real_words(pending).split())
    assert words.startswith("On a real model, SmolLM2-135M-Instruct") and "no calibration result for CAPO" in words
    assert "analysis at 12 complete seeds" in words and "AUROC" not in words.split("Its safety reading")[1]
    write_real_study(folder, [111], effect)
    r = evidence.measure_real(study)
    a = cf.analyse(folder, REAL_STUDY)
    assert r["primary"] == tuple(round(a["primary"][k], 3) for k in ("mean", "low", "high"))
    assert r["holds"] == (a["primary"]["p"] < 0.05) and r["seeds"] == 12 and r["stopped"] == "at its final look"
    text = " ".join(evidence.real_words(r).split())
    assert verdict in text and kind in text and "12 complete seeds" in text
    assert [e for e, *_ in r["secondary"]] == ["auroc_question", "ece", "e_aurc", "auroc", "auroc"]
    for endpoint, arm, minus, *_ in r["secondary"]:
        assert f"{evidence.ENDPOINTS[endpoint]}, {arm} minus {minus}: " in text
    assert text.count("Holm p = ") == 5 and "Collapsed runs of 12: grpo 0, capo-nomask 0" in text


def test_the_recommendations_mask_line_says_what_the_real_study_found(tmp_path):
    """The recommendation's mask line gives each mask arm against CAPO without it with its Holm p, says which
    differences were not shown, calls them exploratory when the primary does not hold, and counts collapses."""
    import results_evidence as evidence

    study = write_real_study(tmp_path / "smollm2-study", range(100, 112), 0.0, noise=0.001)
    folder = study.folder
    rec = json.loads((folder / "capo-mask-paper" / "seed105.json").read_text())
    (folder / "capo-mask-paper" / "seed105.json").write_text(json.dumps({**rec, "mean_tokens": 31.0}))
    r = evidence.measure_real(study)
    paper, measured = ([c for c in r["secondary"] if c[0] == "auroc" and c[1] == arm][0]
                       for arm in ("capo-mask-paper", "capo-mask-measured"))
    text = " ".join(evidence.real_mask_words(r, "smollm2-study").split())
    assert not r["holds"] and "exploratory since the study's primary does not hold" in text
    assert f"{paper[3]:+.3f} [{paper[4]:+.3f}, {paper[5]:+.3f}] (Holm p {evidence._pv(paper[6])}) with the paper's" in text
    assert paper[6] < 0.05 and measured[6] < 0.05  # 0.02 below, seed noise 0.001: shown
    assert "1 of 12 with the paper's thresholds, 0 with the measured ones, 0 without the mask, 0 under GRPO" in text
    r["secondary"] = [(*c[:6], 0.2) for c in r["secondary"]]
    assert " ".join(evidence.real_mask_words(r, "smollm2-study").split()).count("no difference shown") == 2


def test_the_real_study_safety_reading_counts_every_finished_run(tmp_path):
    """Before the look the README gives the protocol's collapse count over every finished run (complete seed or
    not) and nothing else: a run collapses at 30 mean tokens or more, or under half of its answers ending."""
    import results_evidence as evidence

    study = write_real_study(tmp_path / "smollm2-study", [100, 101], 0.0)
    folder = study.folder
    for arm, seed, change in (("capo-nomask", 100, {"mean_tokens": 30.0}), ("capo-nomask", 101, {"mean_tokens": 29.9}),
                              ("capo-mask-paper", 101, {"finished_frac": 0.49})):
        rec = json.loads((folder / arm / f"seed{seed}.json").read_text())
        (folder / arm / f"seed{seed}.json").write_text(json.dumps({**rec, **change}))
    (folder / "grpo" / "seed101.json").unlink()
    r = evidence.measure_real(study)
    assert r["finished"] == {"grpo": 1, "capo-nomask": 2, "capo-mask-paper": 2, "capo-mask-measured": 2}
    assert r["collapsed"] == {"grpo": 0, "capo-nomask": 1, "capo-mask-paper": 1, "capo-mask-measured": 0}
    words = " ".join(evidence.real_words(r).split())
    assert words.endswith("of those finished: grpo 0 of 1, capo-nomask 1 of 2, capo-mask-paper 1 of 2, "
                          "capo-mask-measured 0 of 2.")
    empty = {**r, "finished": dict.fromkeys(r["finished"], 0), "collapsed": dict.fromkeys(r["finished"], 0)}
    assert "safety reading" not in evidence.real_words(empty)


def test_an_undefined_auroc_counts_as_the_amendment_says(tmp_path):
    """A run whose answers are all wrong has no AUROC (None in its record): the real study counts it as 0.5
    (amendment 1), lists it, and gives the primary again without its seed; a plan that does not say refuses."""
    import results_evidence as evidence

    study = write_real_study(tmp_path / "smollm2-study", range(100, 112), 0.03)
    folder = study.folder
    rec = json.loads((folder / "capo-nomask" / "seed101.json").read_text())
    rec.update(auroc=None, auroc_question=None, accuracy=0.0)
    (folder / "capo-nomask" / "seed101.json").write_text(json.dumps(rec))
    a = cf.analyse(folder, REAL_STUDY)
    assert a["undefined"] == [("capo-nomask", 101, "auroc"), ("capo-nomask", 101, "auroc_question")]
    assert a["primary"]["diffs"][1] == pytest.approx(0.5 - json.loads((folder / "grpo/seed101.json").read_text())["auroc"])
    d = a["defined_only"]
    assert d["n"] == 11 and d["diffs"] == [x for i, x in enumerate(a["primary"]["diffs"]) if i != 1]
    text = cf.render(a, REAL_STUDY)
    assert "counted as 0.5" in text and "`capo-nomask` seed 101 (auroc)" in text and "on the 11 seeds" in text
    words = " ".join(evidence.real_words(evidence.measure_real(study)).split())
    assert "counted as 0.5, as the protocol's amendment says, for capo-nomask seed 101; leaving those seeds" in words
    assert "on 11 seeds" in words
    strict = dataclasses.replace(REAL_STUDY, undefined_auroc=None)
    with pytest.raises(ValueError, match=r"undefined AUROC .*capo-nomask.*101.*Plan.undefined_auroc"):
        cf.analyse(folder, strict)
