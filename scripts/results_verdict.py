"""What the library recommends for a real model once the study of the screening pilot's pick has its look: the pick
study's protocol ("Reporting") as a pure function, written before that look so that the recommendation follows from
the intervals by a rule fixed in advance, not from reading the numbers.

The rule: if the pick's primary holds above 0, the pick is recommended for a real model, labelled as measured on
this model, task and learning rate. Otherwise no CAPO configuration kept calibration better than GRPO on the real
model, and the recommendation is the one that did least harm: among the CAPO configurations with a confirmatory
result against GRPO at 3e-4 (the preset's, from the second study, and the pick's), the one with the higher mean
primary difference, stated with its interval and its accuracy difference.

The replication of the pick's study (on `addition-guess-half`) does not change which configuration is recommended
(its protocol); its result is given beside the pick study's, and where its primary holds above 0 while the pick
study's did not, the sentence that nothing kept calibration better is scoped to two-digit addition, so that the two
never contradict each other. Those words too were written before the replication's look.
"""

from __future__ import annotations

from results_evidence import _fill, _iv, pick_words, replication_words
from results_screen import PICK_LABELS

PRESET_LABEL = "CAPO with the embedded preset's settings (relative tau, matched scale, no noise mask)"


def at_look(r: dict | None) -> dict | None:
    """A study's result once it has had its look; None before it (or for no study)."""
    return r if r is not None and r["look"] else None


def kept_better(r: dict | None) -> bool:
    """Whether a real-model study, at its look, found the CAPO arm keeping pooled AUROC better than GRPO: its primary
    holds and its interval lies above 0 (None, or a study before its look: no)."""
    return bool(at_look(r) and r["holds"] and r["primary"][1] > 0)


def real_recommendation(pick: dict, preset: dict) -> dict:
    """Which configuration the library recommends for a real model. ``pick``: the pick's study at its look,
    ``preset``: the second study (the preset at 3e-4) at its look, each as
    :func:`results_evidence.measure_real` gives it. Returns ``kept`` (the pick's primary held above 0),
    ``config`` ("pick" or "preset") and that study's primary interval and accuracy difference."""
    if not (pick["look"] and preset["look"]):
        raise ValueError("the recommendation follows both studies' looks; one has not had it yet")
    kept = kept_better(pick)
    # least harm: the higher mean primary difference (a tie, to three decimals, goes to the pick: it has the mask)
    config = "pick" if kept or pick["primary"][0] >= preset["primary"][0] else "preset"
    chosen = pick if config == "pick" else preset
    (accuracy,) = chosen["accuracy"].values()
    return {"kept": kept, "config": config, "primary": chosen["primary"], "accuracy": accuracy}


def recommendation_words(rec: dict, pick_label: str, replication: dict | None = None) -> str:
    """The recommendation in one plain sentence, for the README's first screen and the recommendation block
    (``replication``: the replication's :func:`~results_evidence.measure_real`, if it had its look)."""
    label = pick_label if rec["config"] == "pick" else PRESET_LABEL
    said = (f"pooled AUROC {_iv(rec['primary'])} against GRPO, accuracy {_iv(rec['accuracy'])}; measured on "
            "SmolLM2-135M-Instruct from a 4-bit quantised file, two-digit addition, learning rate 3e-4")
    if rec["kept"]:
        return f"On the real model, {label} kept calibration better than GRPO ({said})."
    if kept_better(replication):
        return (f"On two-digit addition no CAPO configuration kept calibration better than GRPO on the real model. What "
                f"did least harm there: {label} ({said}). Where half the items hide an operand, {pick_label} kept "
                "calibration better than GRPO in the replication of that study (below).")
    return (f"No CAPO configuration kept calibration better than GRPO on the real model. What did least harm: "
            f"{label} ({said}).")


def pick_paragraphs(found: dict, preset: dict, pick: str, replication: dict | None = None) -> str:
    """The pick study's words (``found``: its :func:`~results_evidence.measure_real`; ``pick``: the pilot's
    arm) and, from its look, the recommendation its rule gives (``preset``: the second study at its look), then from
    the replication's own look its words (``replication``: its ``measure_real``): what the pick study's page and the
    recommendation block render and ``capo-trl demo`` prints."""
    words = pick_words(found, pick)
    if not found["look"]:
        return words
    looked = at_look(replication)
    words += "\n" + _fill(recommendation_words(real_recommendation(found, preset), PICK_LABELS[pick], looked))
    return words + ("\n" + replication_words(looked, pick) if looked else "")


__all__ = ["PRESET_LABEL", "at_look", "kept_better", "pick_paragraphs", "real_recommendation", "recommendation_words"]
