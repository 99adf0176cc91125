"""The README's first screen: the configuration to use, then one plain sentence of evidence per model kind, then
what that adds up to, rendered from the studies' results (``scripts/results_tables.py`` measures them from the
committed files).

Its words at the look of the study of the screening pilot's pick were written before that look, as that study's
protocol ("Reporting") says: the real model's sentence then gives the pick's confirmatory result, and the first and
last lines say what :func:`results_verdict.real_recommendation` recommends: plainly, if no CAPO
configuration kept calibration better than GRPO. The replication's result, from its own look, stands beside the
pick study's (its protocol); those words were written before that look. No interval or p-value here: the pages
linked from it hold them.
"""

from __future__ import annotations

import textwrap

from results_evidence import field_values
from results_screen import PICK_LABELS, screen_words
from results_verdict import at_look, kept_better, real_recommendation


def _said(r: dict) -> str:
    """What a study's primary interval supports of CAPO against GRPO on pooled AUROC, in words."""
    low, high = r["primary"][1:3]
    return ("ranked answers across questions better than GRPO" if low > 0 else "ranked answers across questions "
            "worse than GRPO" if high < 0 else "was not shown to rank answers across questions differently from GRPO")


def _arms(r: dict) -> str:
    """Both arms' means of the two AUROCs and accuracy, CAPO's first."""
    c, g = r["means"]["capo"], r["means"]["grpo"]
    return (f"pooled AUROC {c['auroc']:.3f} against GRPO's {g['auroc']:.3f}, per-question AUROC "
            f"{c['auroc_question']:.3f} against {g['auroc_question']:.3f}, accuracy {100 * c['accuracy']:.1f}% "
            f"against {100 * g['accuracy']:.1f}%")


def what_to_use(recommended: dict) -> str:
    """``recommended`` (:data:`capo_trl.training.defaults.RECOMMENDED`) as a user types it: the paper's absolute tau
    and scale named as such, any other tau with its mode and scale; the noise mask with its thresholds, or off."""
    def kw(*names):
        return field_values(recommended, *names)
    paper = recommended["tau_mode"] == "absolute" and recommended["advantage_scale"] == "paper"
    settings = (f", the paper's settings ({kw('tau', 'advantage_scale')}" if paper
                else f" ({kw('tau', 'tau_mode', 'advantage_scale')}")
    mask = f"the noise mask on at {kw('ref_high', 'ref_low')}" if recommended["noise_mask"] else "no noise mask"
    return f"`CAPOConfig()` as it comes{settings}, {mask})"


def _drifted(r: dict) -> tuple[int, int]:
    """A confirmatory study's collapsed runs: its CAPO arm's (the primary's), then GRPO's (the other arm counted)."""
    (capo,) = r["accuracy"]
    (grpo,) = set(r["collapsed"]) - {capo}
    return r["collapsed"][capo], r["collapsed"][grpo]


def _aurocs(r: dict) -> str:
    """Both arms' mean pooled AUROC, CAPO's first, unlabelled."""
    return f"{r['means']['capo']['auroc']:.3f} against {r['means']['grpo']['auroc']:.3f}"


def _pick_clause(pick: dict, screen: dict) -> str:
    """The pick's confirmatory result as the real model's first clause (the screen, exploratory, named as its origin)."""
    label = PICK_LABELS[screen["pick"]]
    n, (c, g) = pick["seeds"], _drifted(pick)
    return (f"{label}, picked by an exploratory screen, in a confirmatory study ({n} seeds, learning rate 3e-4) "
            f"{_said(pick)}: {_arms(pick)}; runs that drifted into answers that never end: {c} of {n} (GRPO's: {g})")


def _replication_clause(rep: dict) -> str:
    """The replication's confirmatory result, said after the pick's clause ("it": the pick)."""
    c, g = rep["means"]["capo"], rep["means"]["grpo"]
    (drifted, grpo_drifted) = _drifted(rep)
    return (f"; replicated where half the items hide an operand, it {_said(rep)}: pooled AUROC {_aurocs(rep)}, "
            f"accuracy {100 * c['accuracy']:.1f}% against {100 * g['accuracy']:.1f}%, drifted {drifted} of "
            f"{rep['seeds']} (GRPO's: {grpo_drifted})")


def first_screen(tiny: dict, real: dict[str, dict], recommended: dict, screen: dict | None = None,
                 pick: dict | None = None, replication: dict | None = None) -> str:
    """The README's first screen. ``tiny``: :func:`results_evidence.measure` of the tiny models' study;
    ``real``: :func:`results_evidence.measure_real` of each study of the embedded preset on the real model,
    by its learning rate, in the order they ran (a study before its look is left out); ``recommended``: the fields
    of :data:`capo_trl.training.defaults.RECOMMENDED`; ``screen``: the screening pilot
    (:func:`results_screen.measure_screen`, None before its look); ``pick``: the study of its pick
    (``measure_real``; before its look, the screen's clause stands in for it); ``replication``: the replication of
    that study on `addition-guess-half` (``measure_real``; said from its own look)."""
    looked = {rate: r for rate, r in real.items() if r["look"]}

    def primary(r):  # the recommended settings' clause gives both AUROCs and accuracy; these, the primary's means
        return f"pooled AUROC {r['means']['capo']['auroc']:.3f} against GRPO's {r['means']['grpo']['auroc']:.3f}"
    each = ", and ".join(f"at learning rate {rate} {_said(r)} ({primary(r)})" for rate, r in looked.items())
    if len(looked) > 1 and len({_said(r) for r in looked.values()}) == 1:  # one verdict: said once
        (first, r), *rest = looked.items()  # the label once: "(pooled AUROC x against GRPO's y) and at ... (x against y)"
        each = f"{_said(r)} at learning rate {first} ({primary(r)})" + "".join(
            f" and at {rate} ({_aurocs(later)})" for rate, later in rest)
    seeds = sorted({r["seeds"] for r in looked.values()})
    preset = (f"CAPO as on the tiny models ({' or '.join(map(str, seeds))} seeds{' each' if len(looked) > 1 else ''}) "
              f"{each}")
    use = f"**What to use:** {what_to_use(recommended)}."
    if pick is not None and pick["look"]:
        rec = real_recommendation(pick, real["3e-4"])
        rep = at_look(replication)
        evidence = f"{_pick_clause(pick, screen)}{_replication_clause(rep) if rep else ''}. {preset}"
        if rec["kept"]:
            so = (f"So on a real model {PICK_LABELS[screen['pick']]} kept calibration better than GRPO in a "
                  "confirmatory study")
        elif kept_better(rep):  # the replication held above 0 where the pick study did not: each said as it is
            use = (f"**What to use:** {what_to_use(recommended)}. On a real model {PICK_LABELS[screen['pick']]} "
                   "kept calibration better than GRPO in one confirmatory study of two.")
            so = "So on a real model CAPO kept calibration better than GRPO in one confirmatory study of two"
        else:
            use = (f"**What to use:** no CAPO configuration kept calibration better than GRPO on a real model; the "
                   f"one that did least harm there is {what_to_use(recommended)}.")
            so = ("So in a confirmatory study on a real model no CAPO configuration has kept calibration better "
                  "than GRPO")
    else:
        evidence = f"{screen_words(screen, '3e-4')}. {preset}"
        better = [rate for rate, r in looked.items() if r["primary"][1] > 0]
        # a confirmatory secondary (the primary held, Holm p < 0.05) in CAPO's favour, said beside the primary's verdict
        question = [rate for rate, r in looked.items() if r["holds"] and any(
            e == "auroc_question" and lo > 0 and hp < 0.05 for e, _, _, m, lo, hi, hp in r["secondary"])]
        so = ("So in a confirmatory study on a real model CAPO has not ranked answers across questions better than "
              "GRPO" if not better
              else f"So on a real model CAPO ranked answers better than GRPO only at learning rate {' and '.join(better)}")
        if question:
            so += (f"; at {' and '.join(question)} it ranked one question's samples better (a secondary "
                   "endpoint), at lower accuracy")
    lines = [
        use,
        f"- **Tiny models** (CPU; a task where half the items can only be guessed; {tiny['seeds']} seeds): CAPO "
        f"with the tiny models' own settings (no noise mask) {_said(tiny)}: {_arms(tiny)}.",
        f"- **A real model** (SmolLM2-135M-Instruct from a 4-bit quantised file, LoRA on CPU; two-digit addition): "
        f"{evidence}.",
        "",
        f"{so}: compare the two on yours ([`docs/studies.md`](docs/studies.md)).",
    ]
    return "\n".join(textwrap.fill(line, width=115, subsequent_indent="  " if line.startswith("- ") else "",
                                    break_on_hyphens=False, break_long_words=False) for line in lines) + "\n"


__all__ = ["first_screen", "what_to_use"]
