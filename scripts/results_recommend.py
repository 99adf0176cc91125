"""The recommended configuration's block (docs/config.md, docs/faq.md, docs/concepts.md): each value of
``capo_trl.training.defaults.RECOMMENDED`` with why and its limits, the real model's study rendered from its files.
The library holds the values; the reasons, which cite the studies, live here beside the pages that print them."""

from __future__ import annotations

import textwrap

from results_real import REAL_STUDY, pick_result, real_lr_result, real_result, replication_result, screen_result

# Why each recommended value, and its limits: the one text every page that recommends a value renders, and what
# tests/test_recommendation.py holds every page and recipe to. Evidence so far: the paper's runs on its models,
# ours on tiny models, and on a real model (SmolLM2-135M-Instruct) two studies of the embedded preset's settings
# (docs/results/smollm2-study/, smollm2-lr-study/), which found CAPO without the mask ranking answers worse than
# GRPO and the mask not shown to change that, and a screen of the paper's settings (smollm2-screen/, exploratory),
# whose pick had a confirmatory study (smollm2-pick-study/): the block adds their numbers from their files.
RECOMMENDATION = {
    "tau": ("the paper chose 0.6 on Qwen2.5-Math-1.5B (0.5 on 7B; its results moved < 1 point over tau 0.4, 0.6, "
            "1.0); `capo-trl calibrate-mask --write_config recipe.yaml` measures your model's within-group score "
            "spread and writes it as an absolute tau",
            "measured by us on a real model in the exploratory screen and the confirmatory study above (one model, "
            "one task, 3e-4); tau must be of the order of `capo/score_spread`: check it in the first steps (ten "
            "times the spread makes CAPO a rescaled Dr. GRPO)"),
    "tau_mode": ("tau in nats is the paper's form, and what `calibrate-mask` writes",
                 "`\"relative\"` (tau in units of the batch's spread) is the embedded tiny model's setting, "
                 "whose absolute spread (~0.06 nats) is far below the paper's tau; on a real model we ran it in "
                 "the study in the mask line (1e-3), where CAPO ranked answers worse than GRPO, and in a second "
                 "at 3e-4 (docs/results/smollm2-lr-study/), where it did so again on pooled AUROC while ranking one "
                 "question's samples better, at lower accuracy"),
    "advantage_scale": ("the paper's 1/tau scale, with the paper's tau",
                        "`\"matched\"` (GRPO's step size per group) is the embedded tiny model's setting; on a "
                        "real model run only in those same two studies"),
    "noise_mask": ("the paper found that without it entropy climbs and accuracy stalls; on tiny models, without it "
                   "CAPO collapsed into a length hack on arithmetic in 1 of 5 seeds and, with 20% of the grades "
                   "flipped, to accuracy near 0 in 3 of 3 runs of an older configuration, with it in none "
                   "(docs/results/arithmetic-powered/, docs/results/grader-noise-3-seeds/)",
                   "on tiny-model test beds where answers can be guessed it undid the calibration CAPO keeps without "
                   "it (docs/results/guess-half-mask-study/): there set `noise_mask=False` (or "
                   "`noise_mask_side=\"wrong\"`) and watch mean completion length; its thresholds fit the paper's "
                   "models only: `capo-trl calibrate-mask` measures yours, `noise_mask_guard` keeps a class they "
                   "would drop whole"),
}


def render_recommended() -> str:
    """The one recommended configuration for a real model, with its evidence and limits per setting
    (capo_trl.training.defaults.RECOMMENDED and :data:`RECOMMENDATION`): the same block on every page that
    recommends."""
    import results_evidence as evidence
    import results_screen as evidence_screen
    import results_verdict as evidence_verdict
    from capo_trl.training.defaults import RECOMMENDED

    def kw(*names):
        return evidence.field_values(RECOMMENDED, *names)
    groups = {"tau": kw("tau") + " (0.5 for a 7B model)", "tau_mode": kw("tau_mode"),
              "advantage_scale": kw("advantage_scale"),
              "noise_mask": kw("noise_mask", "noise_mask_guard", "ref_thresholds", "ref_high", "ref_low")}
    real = real_result()
    lines = ["**Recommended for a real model** (one configuration, `capo_trl.training.defaults.RECOMMENDED`: "
             "`CAPOConfig`'s defaults, the `capo-recommended` preset, the SmolLM2 and `capo-qwen2.5-math-*` "
             "recipes). The evidence is the paper's runs on its models, ours on tiny models on CPU, and on a real "
             "model, SmolLM2-135M-Instruct (dequantised from Q4_1) on two-digit addition: two studies of CAPO with the "
             "embedded preset's relative tau and matched scale (the first in the mask line), and "
             f"{evidence_screen.screen_words(screen_result(), '3e-4', pick_result()['look'])}.", ""]
    screen, pick = screen_result(), pick_result()
    if pick["look"]:  # the pick study's protocol: from its look, every endpoint and what its rule recommends,
        # with the replication's result beside it from its own look (each paragraph its own)
        said = evidence_verdict.pick_paragraphs(pick, real_lr_result(), screen["pick"], replication_result())
        lines += [line for paragraph in said.strip("\n").split("\n\n") for line in (paragraph, "")]
    for name, (why, limits) in RECOMMENDATION.items():
        if name == "noise_mask":
            limits += "; " + evidence.real_mask_words(real, REAL_STUDY)
            if screen is not None:  # the screen ran the paper's settings with and without it
                arms, n = screen["arms"], screen["seeds"]
                why += (f"; on the real model, with the paper's tau and scale at learning rate {screen['rate']}, "
                        f"runs drifted into answers that never end on {arms[evidence_screen.NOMASK_ARM]['drifted']} "
                        f"of {n} seeds without it and {arms[evidence_screen.PAPER_ARM]['drifted']} of {n} with it "
                        "(an exploratory screen, docs/results/smollm2-screen/)")
        lines.append(f"- {groups[name]}. Evidence: {why}. Limits: {limits}.")
    return "\n".join(textwrap.fill(line, width=110, subsequent_indent="  " if line.startswith("- ") else "",
                                    break_on_hyphens=False, break_long_words=False) for line in lines) + "\n"
