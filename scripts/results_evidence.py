"""What the committed confirmatory studies found, in words: the one rendering that the README, docs/concepts.md,
the results index and ``capo-trl demo`` print.

The demo runs from an installed package, without docs/results/, so each study's numbers are kept here
(:data:`STUDY_RESULTS`), rounded as they are printed; :func:`measure` computes the same dict from a study's
committed run files with the analysis its ``study.yaml`` fixes (:mod:`capo_trl.harness.confirmatory`),
``tests/test_tasks.py`` checks the two are equal, and ``scripts/results_tables.py`` renders the pages' blocks from
:func:`measure`. Which study each page cites is the renderer's to say: nothing here names a study's folder.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING

from results_screen import PICK_LABELS

if TYPE_CHECKING:
    from capo_trl.harness.study import Study

# Every endpoint the protocols fix (primary, safety, descriptive), as the tables name them; E-AURC and ECE: lower
# is better. Each contrast is CAPO without the mask minus GRPO, paired by seed, 95% t interval.
ENDPOINTS = {"auroc": "pooled AUROC", "auroc_question": "per-question AUROC", "e_aurc": "E-AURC (lower is better)",
             "ece": "ECE (lower is better)", "accuracy": "accuracy"}
# The test bed's secondary contrasts (pooled AUROC against CAPO without the mask), by short name.
MASK_ARMS = {"both": "capo-fixed", "correct": "capo-mask-correct", "wrong": "capo-mask-wrong",
             "unmasked": "capo-fixed-unmasked"}

# What each study found, rounded as printed: tests/test_tasks.py checks every number against measure() of the
# committed files. Per endpoint: (mean, low, high, seeds where CAPO was lower); "primary": at the look's level.
STUDY_RESULTS = {
    "guess-half": {
        "seeds": 12, "level": 0.995, "start": 0.884, "grpo": 0.764,
        "nomask": 0.878, "primary": (0.114, 0.019, 0.209), "p": 0.0015, "flip_p": 0.0005, "favour": 12,
        "collapsed": 0, "stopped": "stopped for efficacy at its interim look",
        "endpoints": {"auroc": (0.114, 0.054, 0.174, 0), "auroc_question": (-0.016, -0.057, 0.025, 5),
                      "e_aurc": (-0.1, -0.156, -0.045, 12), "ece": (-0.009, -0.021, 0.003, 9),
                      "accuracy": (-0.024, -0.036, -0.013, 12)},
        "means": {"grpo": {"auroc": 0.764, "auroc_question": 0.655, "accuracy": 0.422},
                  "capo": {"auroc": 0.878, "auroc_question": 0.639, "accuracy": 0.398}},
        "mask": {"both": (-0.116, -0.188, -0.043, 0.0147), "correct": (-0.191, -0.27, -0.112, 0.001),
                 "wrong": (-0.024, -0.07, 0.022, 0.2791), "unmasked": (-0.09, -0.156, -0.025, 0.0225)},
    },
    "guess-redraw": {
        "seeds": 12, "level": 0.95, "start": 0.884, "grpo": 0.768, "nomask": 0.901,
        "primary": (0.132, 0.086, 0.178), "p": 0.0001, "flip_p": 0.0005, "favour": 12, "collapsed": 0,
        "stopped": "at its final look",
        "endpoints": {"auroc": (0.132, 0.086, 0.178, 0), "auroc_question": (-0.051, -0.082, -0.02, 10),
                      "e_aurc": (-0.103, -0.142, -0.064, 12), "ece": (-0.018, -0.03, -0.007, 10),
                      "accuracy": (-0.023, -0.036, -0.01, 10)},
        "means": {"grpo": {"auroc": 0.768, "auroc_question": 0.699, "accuracy": 0.424},
                  "capo": {"auroc": 0.901, "auroc_question": 0.648, "accuracy": 0.4}},
    },
}


def measure(study: Study) -> dict:
    """:data:`STUDY_RESULTS`'s entry of a test-bed study, computed from its committed files with the analysis its
    ``study.yaml`` fixes (CAPO without the mask and GRPO: its primary contrast's two arms)."""
    import numpy as np

    from capo_trl.harness.paired import paired_test
    from capo_trl.harness.study_report import analysis, records

    a = analysis(study)
    if a["look"] is None or not a["look"]["stop"]:
        raise ValueError(f"{study.folder}: the study has not reached a look that ends it; nothing to report yet.")
    runs = records(study)
    seeds, p = a["look"]["seeds"], a["primary"]
    _, capo, grpo = study.plan.primary

    def r3(*values):
        return tuple(round(v, 3) for v in values)

    endpoints = {}
    for key in ENDPOINTS:
        d = np.subtract([runs[capo][s][key] for s in seeds], [runs[grpo][s][key] for s in seeds])
        c = paired_test(d, 0.95, flip=False)
        endpoints[key] = (*r3(c["mean"], c["low"], c["high"]), int((d < 0).sum()))
    found = {"seeds": len(seeds), "level": round(p["confidence"], 3),
             "start": _start_auroc(a), "grpo": round(a["means"][grpo]["auroc"], 3),
             "nomask": round(a["means"][capo]["auroc"], 3), "primary": r3(p["mean"], p["low"], p["high"]),
             "p": round(p["p"], 4), "flip_p": round(p["flip_p"], 4), "favour": p["favour"],
             "collapsed": len(a["collapse"][capo]),
             "stopped": ("stopped for efficacy at its interim look" if a["look"]["reason"] == "efficacy"
                         else "at its final look"),
             "endpoints": endpoints, "means": _means(a, grpo, capo)}
    by_arm = {c["arm"]: c for c in a["secondary"] if c["endpoint"] == "auroc"}
    if by_arm:
        found["mask"] = {name: (*r3(by_arm[arm]["mean"], by_arm[arm]["low"], by_arm[arm]["high"]),
                                round(by_arm[arm]["holm_p"], 4)) for name, arm in MASK_ARMS.items()}
    return found


# What the README's first screen names of each arm: its mean of the two AUROCs and of accuracy.
MEANS = ("auroc", "auroc_question", "accuracy")


def _means(a: dict, grpo: str, capo: str) -> dict:
    """The two arms' means of :data:`MEANS`, rounded as printed (``grpo``, ``capo``: the primary's two arms)."""
    return {role: {key: round(a["means"][arm][key], 3) for key in MEANS} for role, arm in (("grpo", grpo),
                                                                                            ("capo", capo))}


def _iv(t: tuple) -> str:
    return f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]"


def _fill(text: str) -> str:
    return textwrap.fill(text, width=110, break_on_hyphens=False, break_long_words=False) + "\n"


def endpoint_table(r: dict) -> str:
    """Every pre-registered endpoint of a study, CAPO without the mask minus GRPO (markdown; reads as text too)."""
    lines = [f"| endpoint ({r['seeds']} seeds) | CAPO without the mask minus GRPO, mean [95% t interval] "
             "| seeds where CAPO was lower |", "|---|---|---|"]
    lines += [f"| {name} | {_iv(r['endpoints'][key])} | {r['endpoints'][key][3]} of {r['seeds']} |"
              for key, name in ENDPOINTS.items()]
    return "\n".join(lines) + "\n"


def _two_aurocs(r: dict) -> str:
    q = r["endpoints"]["auroc_question"]
    shown = ("lower than GRPO's" if q[2] < 0 else "higher than GRPO's" if q[1] > 0 else "not shown to differ from "
             "GRPO's")
    return _fill(
        "The two AUROCs answer different questions: pooled AUROC ranks answers across questions (which answers to "
        "abstain on), per-question AUROC ranks the samples of one question (which to pick, as best-of-n and "
        f"perplexity-weighted voting do). CAPO without the mask kept the first; the second was {shown} "
        f"({_iv(q)}).")


def study_words(task: str, r: dict | None = None) -> str:
    """A study's result in words and its endpoint table: the block its pages render and the demo prints."""
    r = r or STUDY_RESULTS[task]
    level = f"{100 * r['level']:g}%"
    if task == "guess-half":
        m = r["mask"]

        def holm(name):
            t = m[name]
            return f"{_iv(t)} (Holm p {_pv(t[3])}{', no difference shown' if t[3] >= 0.05 else ''})"
        head = _fill(
            f"On `guess-half` (half the items can only be guessed) GRPO loses calibration and CAPO without the "
            f"noise mask keeps it. In a pre-registered study, {r['stopped']} on {r['seeds']} seeds of 600 steps, "
            f"GRPO's pooled AUROC fell from {r['start']:.3f} to {r['grpo']:.3f} on average and CAPO without the "
            f"mask ended at {r['nomask']:.3f}: {_iv(r['primary'])} against GRPO ({level} t interval, the primary "
            f"endpoint; paired t p {_pv(r['p'])}, exact sign-flip p {_pv(r['flip_p'])}; {r['favour']} of "
            f"{r['seeds']} seeds favoured it), with {r['collapsed']} of {r['seeds']} runs collapsed. The noise mask "
            f"undid it (against CAPO without the mask, 95% t intervals): the two-sided mask {holm('both')}, its "
            f"correct-answer side alone (dropping suspected lucky guesses) {holm('correct')}, its wrong-answer "
            f"side alone {holm('wrong')}, and the two-sided mask with the loss normaliser kept at the unmasked "
            f"count {holm('unmasked')}, so the mask's larger step is not the whole of it. Every pre-registered "
            "endpoint, against GRPO:")
    else:
        head = _fill(
            f"On `guess-redraw` (guess-half's items, the hidden operand drawn afresh for every training sample, so "
            f"no answer to a guessable item beats 1 in 5) GRPO loses calibration too and CAPO without the noise "
            f"mask keeps it. In the pre-registered replication of the primary contrast, {r['stopped']} on "
            f"{r['seeds']} seeds of 600 steps, GRPO's pooled AUROC fell from {r['start']:.3f} to {r['grpo']:.3f} "
            f"on average and CAPO without the mask ended at {r['nomask']:.3f}: {_iv(r['primary'])} against GRPO "
            f"({level} t interval; paired t p {_pv(r['p'])}, exact sign-flip p {_pv(r['flip_p'])}; "
            f"{r['favour']} of {r['seeds']} seeds favoured it), with {r['collapsed']} of {r['seeds']} runs "
            "collapsed. The mask was not tested there. Every pre-registered endpoint, against GRPO:")
    return head + "\n" + endpoint_table(r) + "\n" + _two_aurocs(r)


def field_values(recommended: dict, *names: str) -> str:
    """Config fields as a user types them: ```tau=0.6`, `advantage_scale="paper"```."""
    return ", ".join(f"`{name}={recommended[name]!r}`".replace("'", '"') for name in names)


# The real model's first study: its words are written here before its look, so that what the README says of it
# follows from the intervals by rules fixed in advance, not from reading the numbers.
REAL_MODEL = "SmolLM2-135M-Instruct (dequantised from Q4_1, LoRA on CPU)"
# The real model's study at the look that ended it, as measure_real() gives it: the demo runs without
# docs/results/, so it prints real_words() of this; tests/test_tasks.py checks it against the committed files.
REAL_RESULT = {
    "look": True, "seeds": 12, "level": 0.95, "start": 0.86, "grpo": 0.728, "nomask": 0.56,
    "primary": (-0.167, -0.269, -0.066), "p": 0.004, "flip_p": 0.0039, "above": 2, "holds": True,
    "stopped": "at its final look",
    "collapsed": {"grpo": 0, "capo-nomask": 10, "capo-mask-paper": 10, "capo-mask-measured": 9},
    "secondary": [("auroc_question", "capo-nomask", "grpo", -0.083, -0.175, 0.008, 0.3535),
                  ("ece", "capo-nomask", "grpo", -0.028, -0.155, 0.098, 1.0),
                  ("e_aurc", "capo-nomask", "grpo", -0.026, -0.098, 0.047, 1.0),
                  ("auroc", "capo-mask-paper", "capo-nomask", -0.019, -0.156, 0.118, 1.0),
                  ("auroc", "capo-mask-measured", "capo-nomask", 0.047, -0.05, 0.144, 1.0)],
    "accuracy": {"capo-nomask": (-0.259, -0.367, -0.152), "capo-mask-paper": (-0.206, -0.342, -0.069),
                 "capo-mask-measured": (-0.084, -0.182, 0.015)},
    "undefined": [("capo-nomask", 101), ("capo-nomask", 111)], "defined_only": (-0.149, -0.271, -0.027, 10),
    "means": {"grpo": {"auroc": 0.728, "auroc_question": 0.66, "accuracy": 0.427},
              "capo": {"auroc": 0.56, "auroc_question": 0.577, "accuracy": 0.168}}}
# The real model's second study (learning rate 3e-4) at its look, as measure_real() gives it (None before it).
# Its protocol lets the demo speak of it only if its primary holds, as it did (tests/test_tasks.py checks both).
REAL_LR_RESULT: dict | None = {
    "look": True, "seeds": 12, "level": 0.95, "start": 0.86, "grpo": 0.806, "nomask": 0.735,
    "primary": (-0.07, -0.106, -0.034), "p": 0.0012, "flip_p": 0.0029, "above": 1, "holds": True,
    "stopped": "at its final look", "collapsed": {"grpo-lr3e-4": 0, "capo-nomask-lr3e-4": 0},
    "secondary": [("auroc_question", "capo-nomask-lr3e-4", "grpo-lr3e-4", 0.059, 0.016, 0.102, 0.0117),
                  ("ece", "capo-nomask-lr3e-4", "grpo-lr3e-4", -0.093, -0.136, -0.049, 0.0013),
                  ("e_aurc", "capo-nomask-lr3e-4", "grpo-lr3e-4", 0.064, 0.038, 0.09, 0.0006)],
    "accuracy": {"capo-nomask-lr3e-4": (-0.058, -0.074, -0.041)}, "undefined": [], "defined_only": None,
    "means": {"grpo": {"auroc": 0.806, "auroc_question": 0.681, "accuracy": 0.522},
              "capo": {"auroc": 0.735, "auroc_question": 0.74, "accuracy": 0.464}}}
# The study of the screening pilot's pick at its look, as measure_real() gives it (None before it): the demo prints
# its words and the recommendation its protocol's rule gives (tests/test_tasks.py checks it against the files).
PICK_RESULT: dict | None = {"look": True, "seeds": 13, "level": 0.95, "start": None, "grpo": 0.807, "nomask": 0.813,
    "primary": (0.006, -0.008, 0.02), "p": 0.3739, "flip_p": 0.3853, "above": 7, "holds": False,
    "stopped": "at its final look", "collapsed": {"grpo-lr3e-4": 0, "capo-paper-lr3e-4": 0},
    "secondary": [("auroc_question", "capo-paper-lr3e-4", "grpo-lr3e-4", 0.028, -0.005, 0.06, 0.3539),
                  ("ece", "capo-paper-lr3e-4", "grpo-lr3e-4", -0.001, -0.015, 0.012, 0.9414),
                  ("e_aurc", "capo-paper-lr3e-4", "grpo-lr3e-4", 0.004, -0.008, 0.016, 0.9414),
                  ("accuracy", "capo-paper-lr3e-4", "grpo-lr3e-4", -0.006, -0.019, 0.007, 0.9414)],
    "accuracy": {"capo-paper-lr3e-4": (-0.006, -0.019, 0.007)}, "undefined": [], "defined_only": None,
    "means": {"grpo": {"auroc": 0.807, "auroc_question": 0.681, "accuracy": 0.522},
              "capo": {"auroc": 0.813, "auroc_question": 0.709, "accuracy": 0.516}}}
# Its replication on addition-guess-half at its look (None before it), printed beside it, checked the same way.
REPLICATION_RESULT: dict | None = {"look": True, "seeds": 13, "level": 0.95, "start": None, "grpo": 0.799,
    "nomask": 0.836, "primary": (0.037, 0.016, 0.058), "p": 0.0021, "flip_p": 0.0015, "above": 12, "holds": True,
    "stopped": "at its final look", "collapsed": {"grpo-lr3e-4": 0, "capo-paper-lr3e-4": 0},
    "secondary": [("auroc_question", "capo-paper-lr3e-4", "grpo-lr3e-4", 0.058, 0.021, 0.095, 0.017),
                  ("ece", "capo-paper-lr3e-4", "grpo-lr3e-4", -0.015, -0.025, -0.005, 0.017),
                  ("e_aurc", "capo-paper-lr3e-4", "grpo-lr3e-4", -0.015, -0.028, -0.001, 0.0344),
                  ("accuracy", "capo-paper-lr3e-4", "grpo-lr3e-4", -0.018, -0.029, -0.007, 0.017)],
    "accuracy": {"capo-paper-lr3e-4": (-0.018, -0.029, -0.007)}, "undefined": [], "defined_only": None,
    "means": {"grpo": {"auroc": 0.799, "auroc_question": 0.683, "accuracy": 0.299},
              "capo": {"auroc": 0.836, "auroc_question": 0.741, "accuracy": 0.281}}}
REAL_PENDING = (
    f"On a real model, {REAL_MODEL}, no calibration result for CAPO exists yet. Two pre-registered pilots found GRPO "
    "losing pooled AUROC on two-digit addition on 3 of 3 seeds once truncated completions were out of the loss "
    "(without that, 2 of 6 runs drifted into answers that never end); whether CAPO keeps it there is the question "
    "of a confirmatory study committed before its runs, running now, its analysis at {planned} complete seeds.")

# The second study (at learning rate 3e-4), its words fixed before its look as the first's were.
REAL_LR_PENDING = (
    "A second pre-registered study asks the same question at learning rate 3e-4 (GRPO against CAPO without the "
    "noise mask, 100 steps; its protocol committed before its runs, which started on 2026-12-05). No result yet: "
    "its one analysis comes at {planned} complete seeds.")


def measure_real(study: Study) -> dict:
    """A real-model study at the look that ends it, rounded as printed; before that look (``look`` False) only its
    safety reading: how many of the finished runs of each arm collapsed by its file's rule. ``grpo`` and ``nomask``
    are the means of its primary's two arms."""
    from capo_trl.harness.study_report import analysis

    plan = study.plan
    a = analysis(study)
    if a["look"] is None or not a["look"]["stop"]:
        return {"look": False, "planned": len(a["planned_seeds"]),
                "finished": {arm: len(s) for arm, s in a["finished"].items()},
                "collapsed": {arm: len(s) for arm, s in a["collapsed_finished"].items()},
                "rule": (plan.collapse_tokens, plan.min_finished)}
    p, seeds, (_, capo, grpo) = a["primary"], a["look"]["seeds"], plan.primary
    r = {"look": True, "seeds": len(seeds), "level": round(p["confidence"], 3), "start": _start_auroc(a),
         "grpo": round(a["means"][grpo]["auroc"], 3), "nomask": round(a["means"][capo]["auroc"], 3),
         "primary": tuple(round(p[k], 3) for k in ("mean", "low", "high")), "p": round(p["p"], 4),
         "flip_p": round(p["flip_p"], 4), "above": p["favour"], "holds": bool(p["holds"]),
         "stopped": "closed at its deadline" if a["closed"] else "at its final look",
         "collapsed": {arm: len(c) for arm, c in a["collapse"].items()},
         "secondary": [(c["endpoint"], c["arm"], c["minus"], *(round(c[k], 3) for k in ("mean", "low", "high")),
                        round(c["holm_p"], 4)) for c in a["secondary"]],
         "accuracy": {arm: tuple(round(c[k], 3) for k in ("mean", "low", "high"))
                      for arm, c in a["safety"]["accuracy"].items()},
         "undefined": sorted({(arm, s) for arm, s, k in a["undefined"] if k == "auroc" and s in seeds}),
         "defined_only": (None if a["defined_only"] is None else
                          (*(round(a["defined_only"][k], 3) for k in ("mean", "low", "high")), a["defined_only"]["n"])),
         "means": _means(a, grpo, capo)}
    return r


def _pv(p: float) -> str:
    """A p-value as printed: "= 0.0012", or "< 0.0001" where four decimals would show 0."""
    return f"= {p:.4f}" if p >= 0.0001 else "< 0.0001"


def _start_auroc(a: dict) -> float | None:
    """The start model's pooled AUROC, None where the study has no start record (a study the runner ran): None, not
    nan, so that a result written down as a constant compares equal to the one measured again."""
    start = a["start"]["auroc"]
    return None if math.isnan(start) else round(start, 3)


def _real_safety(r: dict) -> str:
    """The study's safety reading before its look: collapsed of finished runs per arm (no endpoint)."""
    if not any(r["finished"].values()):
        return ""
    tokens, finished = r["rule"]
    counts = ", ".join(f"{arm} {r['collapsed'][arm]} of {n}" for arm, n in r["finished"].items())
    return (f" Its safety reading so far, not its analysis: runs that collapsed into answers that never end (test "
            f"answers of {tokens:g} tokens or more of 32 on average, or under {finished:g} of them ending), of those "
            f"finished: {counts}.")


def _real_verdict(r: dict, capo: str = "CAPO without the noise mask") -> str:
    """What the primary's p and interval support, by the rule fixed before the look (``capo``: its CAPO arm)."""
    if r["holds"] and r["primary"][1] > 0:
        return f"{capo} kept pooled AUROC better than GRPO"
    if r["holds"]:
        return f"{capo} ranked answers worse than GRPO"
    return f"no difference between {capo} and GRPO was shown"


def real_words(r: dict) -> str:
    """The real model's study in words, every pre-registered endpoint with it; before its look, that none exists
    and its safety reading."""
    if not r["look"]:
        return _fill(REAL_PENDING.format(planned=r["planned"]) + _real_safety(r))
    return _look_words(r, f"On a real model, {REAL_MODEL}, on two-digit addition: in a pre-registered study",
                       "as the protocol's amendment says")


def real_lr_words(r: dict) -> str:
    """The real model's second study (at learning rate 3e-4) in words, fixed like the first's before its look: before
    it that no result exists (no count, so a finished run changes no page but the study's own); at it every
    pre-registered endpoint."""
    if not r["look"]:
        return _fill(REAL_LR_PENDING.format(planned=r["planned"]))
    return _look_words(r, "At learning rate 3e-4, on the same model and task: in a second pre-registered study",
                       "as its protocol says")


PICK_PENDING = (
    "A confirmatory study of the screen's pick, {label}, against GRPO at learning rate 3e-4 on the same model and "
    "task (its protocol committed before its runs and before the screen's decision) has no result yet: its one "
    "analysis comes at {planned} complete seeds.")


def pick_words(r: dict, pick: str) -> str:
    """The confirmatory study of the pilot's pick (``pick``: the pilot's arm), in words fixed before its look, as the
    earlier studies' were: before it that no result exists; at it the primary's verdict by the protocol's rule and
    every pre-registered endpoint (:func:`results_evidence.measure_real` gives ``r``)."""
    label = PICK_LABELS[pick]
    if not r["look"]:
        return _fill(PICK_PENDING.format(label=label, planned=r["planned"]))
    return _look_words(r, "At learning rate 3e-4, on the same model and task: in a pre-registered study of the "
                       "screening pilot's pick", "as its protocol says", capo=label)


REPLICATION_PENDING = (
    "A pre-registered replication on `addition-guess-half` (half the items hide an operand), the same two arms at "
    "learning rate 3e-4 (its protocol committed before its runs and before the pick study's look), has no result "
    "yet: its one analysis comes at {planned} complete seeds.")


def replication_words(r: dict, pick: str) -> str:
    """The replication of the pick's study on `addition-guess-half`, in words fixed before its look like the pick
    study's (``r``: :func:`measure_real` of it)."""
    if not r["look"]:
        return _fill(REPLICATION_PENDING.format(planned=r["planned"]))
    return _look_words(r, "On `addition-guess-half` (half the items hide an operand), at learning rate 3e-4: in a "
                       "pre-registered replication of the pick's study", "as its protocol says", capo=PICK_LABELS[pick])


def _look_words(r: dict, lead: str, undefined_rule: str, capo: str = "CAPO without the noise mask") -> str:
    """A real-model study's words at its look: the primary's verdict by the rule fixed before it, then every
    secondary with its Holm p, accuracy, collapses and undefined AUROCs (``capo``: the primary's CAPO arm, in words)."""
    verdict = _real_verdict(r, capo) + " there"
    kind = "confirmatory" if r["holds"] else "exploratory, since the primary does not hold"
    second = "; ".join(f"{ENDPOINTS.get(e, e)}, {arm} minus {minus}: {_iv((m, lo, hi))} (Holm p {_pv(hp)})"
                       for e, arm, minus, m, lo, hi, hp in r["secondary"])
    safety = "; ".join(f"{arm} {_iv(iv)}" for arm, iv in r["accuracy"].items())
    collapsed = ", ".join(f"{arm} {n}" for arm, n in r["collapsed"].items())
    undefined = ""
    if r["undefined"]:
        runs = ", ".join(f"{arm} seed {seed}" for arm, seed in r["undefined"])
        undefined = (f" Pooled AUROC was undefined (answers of one class only) and counted as 0.5, {undefined_rule}, "
                     f"for {runs}")
        d = r["defined_only"]
        undefined += (f"; leaving those seeds out (a sensitivity analysis), {capo} minus GRPO was "
                      f"{_iv(d)} on {d[3]} seeds." if d else ".")
    # a study the runner ran has no start model record (start.json): then no "before RL" clause, not a nan
    before = "" if r["start"] is None else f"from {r['start']:.3f} before RL "
    return _fill(
        f"{lead} {r['stopped']} with "
        f"{r['seeds']} complete seeds of 100 steps, pooled AUROC went {before}to "
        f"{r['grpo']:.3f} on average under GRPO and to {r['nomask']:.3f} under {capo}: {_iv(r['primary'])} "
        f"against GRPO ({100 * r['level']:g}% t interval, the primary endpoint; paired t p {_pv(r['p'])}, exact "
        f"sign-flip p {_pv(r['flip_p'])}; above 0 on {r['above']} of {r['seeds']} seeds), so {verdict}. "
        f"Secondary endpoints, 95% t intervals with Holm's correction ({kind}): {second}. Accuracy against GRPO: "
        f"{safety}. Collapsed runs of {r['seeds']}: {collapsed}.{undefined} These numbers are the real model's, apart "
        "from the tiny models'.")


def real_mask_words(r: dict, folder: str) -> str:
    """What the real model's study found of the noise mask, for the recommendation's mask line (rendered from the
    study's files, in ``folder`` under docs/results/): each mask arm against CAPO without it, and the runs of each
    arm that collapsed."""
    arms = {arm: (m, lo, hi, hp) for e, arm, minus, m, lo, hi, hp in r["secondary"] if e == "auroc"}

    def said(arm: str) -> str:
        m, lo, hi, hp = arms[arm]
        shown = "" if hp < 0.05 else ", no difference shown"
        return f"{_iv((m, lo, hi))} (Holm p {_pv(hp)}{shown})"
    c, n = r["collapsed"], r["seeds"]
    kind = "" if r["holds"] else ", exploratory since the study's primary does not hold"
    return (f"on a real model, {REAL_MODEL}, on two-digit addition, with the embedded preset's relative tau and "
            f"matched scale at learning rate 1e-3 (docs/results/{folder}/, {n} seeds), "
            f"{_real_verdict(r)} (pooled AUROC {_iv(r['primary'])}, p {_pv(r['p'])}), and "
            f"pooled AUROC against CAPO without the "
            f"mask was {said('capo-mask-paper')} with the paper's thresholds and {said('capo-mask-measured')} "
            f"with the ones `calibrate-mask` measured{kind}; runs that collapsed into answers that never end: "
            f"{c['capo-mask-paper']} of {n} with the paper's thresholds, {c['capo-mask-measured']} with the measured "
            f"ones, {c['capo-nomask']} without the mask, {c['grpo']} under GRPO")


__all__ = ["ENDPOINTS", "MEANS", "PICK_RESULT", "REAL_LR_RESULT", "REPLICATION_RESULT", "REAL_RESULT", "STUDY_RESULTS",
           "endpoint_table", "field_values", "measure", "measure_real", "pick_words", "real_lr_words", "replication_words", "real_mask_words", "real_words",
           "study_words"]
