"""The README's first screen (everything before its second heading) tells a newcomer what to use, in a fixed order,
within 40 lines, and every result number on it is rendered from committed files."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs import script

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- text: first-screen \(rendered by scripts/results_tables\.py\) -->\n(.*?)<!-- end text -->\n",
                   re.S)
# Numbers on the first screen that are not results: the paper's venue year and what the shell block types.
NOT_RESULTS = {"2026", "torch==2.13.0", "2"}


def first_screen() -> str:
    lines = (ROOT / "README.md").read_text().splitlines(keepends=True)
    second = next(i for i, line in enumerate(lines) if line.startswith("## "))
    return "".join(lines[:second])


def test_the_first_screen_fits_40_lines():
    assert len(first_screen().splitlines()) <= 40, len(first_screen().splitlines())


def test_the_first_screen_says_what_it_is_shows_the_picture_then_what_to_use_then_how_to_start_then_where_next():
    text = first_screen()
    order = [text.index("`CAPOTrainer` is a drop-in"), text.index("](docs/demo.png)"), text.index("**What to use:**"),
             text.index("- **Tiny models**"), text.index("- **A real model**"), text.index("```bash\n"),
             text.index("capo-trl demo\n"), text.index("python -m pytest"), text.index("Read next:")]
    assert order == sorted(order), order
    for link in ("docs/results/README.md", "docs/config.md", "docs/studies.md", "#drop-in-use"):
        assert f"]({link})" in text, link


def test_the_first_screens_numbers_are_rendered_from_the_committed_files():
    text = first_screen()
    block = BLOCK.search(text)
    assert block is not None, "no first-screen block (scripts/results_tables.py renders it)"
    assert block[1] == script("results_tables").render_first_screen(), "stale: run python scripts/results_tables.py"
    outside = BLOCK.sub("", text)
    numbers = {token.strip("(),.;:`") for token in re.findall(r"\S*\d\S*", outside)}
    assert numbers <= NOT_RESULTS, numbers - NOT_RESULTS
    for kind in ("- **Tiny models**", "- **A real model**"):  # one sentence each, naming both AUROCs and accuracy
        sentence = " ".join(block[1].split(kind, 1)[1].split("\n-", 1)[0].split("\n\n", 1)[0].split())
        for name in ("pooled AUROC", "per-question AUROC", "accuracy"):
            assert re.search(rf"{name} \d\.\d{{3}} against (GRPO's )?\d\.\d{{3}}|{name} [\d.]+% against", sentence), (
                kind, name, sentence)


def test_the_first_screen_holds_no_interval_p_value_or_amendment():
    text = first_screen()
    for word in ("Holm", "p =", "% interval", "amendment", "E-AURC", "dequantised", "matched scale", "relative tau"):
        assert word not in text, word
    assert not re.search(r"\[[+-]?\d", text)  # no bracketed interval


def test_the_real_models_sentence_follows_each_studys_interval_once_it_has_its_look():
    """Written before the second study's look: a study before its look is left out; at it, its verdict follows its
    interval (above 0, below, or across), and the closing sentence names a rate only where CAPO ranked better."""
    import results_evidence as evidence
    from results_first_screen import first_screen
    from capo_trl.training.defaults import RECOMMENDED

    tiny, first = evidence.STUDY_RESULTS["guess-half"], evidence.REAL_RESULT
    means = {"grpo": {"auroc": 0.7, "auroc_question": 0.6, "accuracy": 0.4},
             "capo": {"auroc": 0.75, "auroc_question": 0.62, "accuracy": 0.41}}

    def said(primary):
        second = {**first, "primary": primary, "means": means}
        return " ".join(first_screen(tiny, {"1e-3": first, "3e-4": second}, RECOMMENDED).split())
    before = " ".join(first_screen(tiny, {"1e-3": first, "3e-4": {"look": False}}, RECOMMENDED).split())
    assert "3e-4" not in before and "has not ranked answers across questions better" in before
    above = said((0.05, 0.01, 0.09))
    assert ("at learning rate 3e-4 ranked answers across questions better than GRPO (pooled AUROC 0.750 against "
            "GRPO's 0.700)") in above
    assert "better than GRPO only at learning rate 3e-4" in above
    across = said((0.05, -0.01, 0.11))
    assert "at learning rate 3e-4 was not shown to rank answers across questions differently" in across
    assert "has not ranked answers across questions better" in across and "one question" not in across
    worse = said((-0.05, -0.09, -0.01))  # the first study's verdict too: said once for both rates
    assert ("ranked answers across questions worse than GRPO at learning rate 1e-3 (pooled AUROC 0.560 against "
            "GRPO's 0.728) and at 3e-4 (0.750 against 0.700)") in worse  # the label once


def test_the_real_models_sentence_gives_the_screens_means_and_pick_never_a_verdict():
    """The screening pilot of the paper's settings is exploratory: its clause gives means, drifted runs and the pick,
    and before the pilot's look only that it runs."""
    import results_screen as evidence_screen

    arm = {"auroc": 0.8, "auroc_question": 0.7, "accuracy": 0.5, "drifted": 0}
    r = {"seeds": 3, "rate": "1e-3", "pick": "capo-paper", "reference": {"auroc": 0.75, "auroc_question": 0.65,
         "accuracy": 0.45}, "arms": {"capo-paper": arm, "capo-paper-nomask": {**arm, "drifted": 3}}}
    said = evidence_screen.screen_words(r, "3e-4")
    assert said == ("the paper's settings, in an exploratory screen (3 seeds, learning rate 1e-3): no run drifted "
                    "into answers that never end (3 of 3 without the noise mask), pooled AUROC 0.800 against GRPO's "
                    "0.750, per-question AUROC 0.700 against 0.650, accuracy 50.0% against 45.0%; picked by the "
                    "screen, now in a confirmatory study at 3e-4")
    assert "the screen picked `capo-x` for" in evidence_screen.screen_words({**r, "pick": "capo-x"}, "3e-4")
    assert evidence_screen.screen_words({**r, "pick": None}, "3e-4").endswith(
        "no setting the screen ran qualified for a confirmatory study at 3e-4")
    assert "no result yet" in evidence_screen.screen_words(None, "3e-4")


PICK_MEANS = {"grpo": {"auroc": 0.806, "auroc_question": 0.681, "accuracy": 0.522},
              "capo": {"auroc": 0.83, "auroc_question": 0.7, "accuracy": 0.51}}


# What the library recommends if the pick study's rule chooses the pick (the paper's settings, the guard on), and
# if it chooses the preset: each case is checked against its own, whichever RECOMMENDED holds now.
PICKED = dict(advantage_estimator="capo", tau=0.6, tau_mode="absolute", advantage_scale="paper", noise_mask=True,
              noise_mask_guard=True, ref_thresholds="fixed", ref_high=2.5, ref_low=1.05)


def pick_screen(primary, holds=True, recommended=PICKED, replication=None):
    """The first screen with the pick study at its look (written before it): a made-up result for the pick, the
    committed results for everything else (the replication: none, or the one given)."""
    import results_evidence as evidence
    import results_screen as evidence_screen
    from results_first_screen import first_screen

    pick = {**evidence.REAL_LR_RESULT, "seeds": 13, "primary": primary, "holds": holds, "means": PICK_MEANS,
            "accuracy": {"capo-paper-lr3e-4": (-0.012, -0.03, 0.006)},
            "collapsed": {"grpo-lr3e-4": 0, "capo-paper-lr3e-4": 1}}
    real = {"1e-3": evidence.REAL_RESULT, "3e-4": evidence.REAL_LR_RESULT}
    return first_screen(evidence.STUDY_RESULTS["guess-half"], real, recommended,
                        evidence_screen.SCREEN_RESULT, pick, replication)


def test_at_the_pick_studys_look_the_first_screen_gives_its_result_and_the_rules_recommendation():
    """The pick study's protocol ("Reporting"), written before its look: its confirmatory result replaces the
    screen's exploratory clause; if the primary holds above 0 the pick is what to use, as measured; otherwise the
    first line says plainly that no CAPO configuration kept calibration better than GRPO, and what did least harm."""
    from results_first_screen import what_to_use
    from capo_trl.training.defaults import EMBEDDED_METHOD

    kept = pick_screen((0.03, 0.01, 0.05))
    flat = " ".join(kept.split())
    assert flat.startswith("**What to use:** `CAPOConfig()` as it comes, the paper's settings (`tau=0.6`")
    assert ("CAPO with the paper's settings, picked by an exploratory screen, in a confirmatory study (13 seeds, "
            "learning rate 3e-4) ranked answers across questions better than GRPO: pooled AUROC 0.830 against "
            "GRPO's 0.806, per-question AUROC 0.700 against 0.681, accuracy 51.0% against 52.2%; runs that drifted "
            "into answers that never end: 1 of 13 (GRPO's: 0).") in flat
    assert "So on a real model CAPO with the paper's settings kept calibration better than GRPO" in flat
    assert "exploratory screen (3 seeds" not in flat  # the screen's means give way to the confirmatory result
    for primary, holds in (((0.01, -0.01, 0.03), False), ((-0.03, -0.05, -0.01), True)):  # the pick did least harm
        flat = " ".join(pick_screen(primary, holds).split())
        assert flat.startswith("**What to use:** no CAPO configuration kept calibration better than GRPO on a real "
                               "model; the one that did least harm there is `CAPOConfig()` as it comes, the paper's")
        assert "So in a confirmatory study on a real model no CAPO configuration has kept calibration" in flat
    preset = {**PICKED, **EMBEDDED_METHOD}  # what the library recommends if the preset did least harm
    flat = " ".join(pick_screen((-0.09, -0.12, -0.06), True, preset).split())
    assert flat.startswith("**What to use:** no CAPO configuration kept calibration better than GRPO on a real model; "
                           'the one that did least harm there is `CAPOConfig()` as it comes (`tau=0.5`, '
                           '`tau_mode="relative"`, `advantage_scale="matched"`, no noise mask).')
    assert what_to_use(preset) in flat
    for screen in (kept, pick_screen((-0.09, -0.12, -0.06), True, preset)):
        rest = first_screen().replace(BLOCK.search(first_screen())[1], screen)  # it still fits the first screen
        assert len(rest.splitlines()) <= 40, len(rest.splitlines())
        assert not re.search(r"\[[+-]?\d|Holm|p =|relative tau|matched scale", screen)


# A made-up replication at its look, with the longest numbers it can print (two-digit accuracies and drift counts)
REPLICATED = {"look": True, "seeds": 13, "holds": False, "primary": (0.01, -0.01, 0.03),
              "means": {"grpo": {"auroc": 0.701, "auroc_question": 0.612, "accuracy": 0.301},
                        "capo": {"auroc": 0.733, "auroc_question": 0.64, "accuracy": 0.299}},
              "accuracy": {"capo-paper-lr3e-4": (-0.002, -0.02, 0.016)},
              "collapsed": {"grpo-lr3e-4": 10, "capo-paper-lr3e-4": 12}}


def test_from_the_replications_look_its_result_stands_beside_the_pick_studys_and_never_contradicts_it():
    """The replication's protocol ("Reporting"), its words written before its look: after the pick study's clause,
    its verdict, pooled AUROC, accuracy and drifted runs. Where its primary holds above 0 and the pick study's did
    not, the first and last lines say so (one confirmatory study of two) rather than that nothing kept calibration
    better; otherwise they stay the pick study's. Every case still fits the first screen."""
    import results_evidence as evidence

    not_kept = (0.006, -0.008, 0.02)  # the pick study's committed verdict: no difference shown
    assert pick_screen(not_kept, False, replication={"look": False}) == pick_screen(not_kept, False)
    clause = ("replicated where half the items hide an operand, it {}: pooled AUROC 0.733 against 0.701, accuracy "
              "29.9% against 30.1%, drifted 12 of 13 (GRPO's: 10). CAPO as on the tiny models")
    for primary, holds, said in (((0.01, -0.01, 0.03), False, "was not shown to rank answers across questions "
                                  "differently from GRPO"),
                                 ((-0.03, -0.05, -0.01), True, "ranked answers across questions worse than GRPO"),
                                 ((0.03, 0.01, 0.05), True, "ranked answers across questions better than GRPO")):
        screen = pick_screen(not_kept, False, replication={**REPLICATED, "primary": primary, "holds": holds})
        flat = " ".join(screen.split())
        assert "1 of 13 (GRPO's: 0); " + clause.format(said) in flat, flat  # pick_screen's made-up drift
        if primary[1] > 0:
            assert flat.startswith("**What to use:** `CAPOConfig()` as it comes, the paper's settings (`tau=0.6`")
            assert ("On a real model CAPO with the paper's settings kept calibration better than GRPO in one "
                    "confirmatory study of two.") in flat and "no CAPO configuration" not in flat
            assert "So on a real model CAPO kept calibration better than GRPO in one confirmatory study of two:" in flat
        else:
            assert flat.startswith("**What to use:** no CAPO configuration kept calibration better than GRPO on a real "
                                   "model; the one that did least harm there is `CAPOConfig()` as it comes")
            assert "So in a confirmatory study on a real model no CAPO configuration has kept" in flat
        rest = first_screen().replace(BLOCK.search(first_screen())[1], screen)
        assert len(rest.splitlines()) <= 40, len(rest.splitlines())
        assert not re.search(r"\[[+-]?\d|Holm|p =|relative tau|matched scale", screen)
    kept = " ".join(pick_screen((0.03, 0.01, 0.05), replication=REPLICATED).split())  # the pick study's own words
    assert "So on a real model CAPO with the paper's settings kept calibration better than GRPO in a confirmatory" in kept
    assert "drifted 12 of 13 (GRPO's: 10)" in kept
    assert evidence.REPLICATION_RESULT is None or evidence.REPLICATION_RESULT["look"]  # set only at its look
