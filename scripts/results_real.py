"""The real model's blocks (SmolLM2-135M-Instruct, dequantised Q4_1: docs/results/smollm2-*/), rendered from its
committed files and each study's ``study.yaml`` (its arms, seeds, rules); scripts/results_tables.py puts them in the
pages (``REAL_RENDER``)."""

from __future__ import annotations

import functools
import json

from results_common import RESULTS, study, summary, table

REAL_STUDY = "smollm2-study"  # the real model's first confirmatory study, the one the README and the demo cite
REAL_LR_STUDY = "smollm2-lr-study"  # its second, at learning rate 3e-4
SCREEN_STUDY = "smollm2-screen"  # its screening pilot of other CAPO settings (the paper's among them)
PICK_STUDY = "smollm2-pick-study"  # the confirmatory study of the pilot's pick, at learning rate 3e-4
REPLICATION = "smollm2-pick-guess-half"  # its replication on addition-guess-half


@functools.cache
def measured(name: str) -> dict:
    """A real-model study as results_evidence.measure_real gives it (once per study and run of this script)."""
    import results_evidence as evidence

    return evidence.measure_real(study(name))


def real_result() -> dict:
    return measured(REAL_STUDY)


def real_lr_result() -> dict:
    return measured(REAL_LR_STUDY)


def pick_result() -> dict:
    return measured(PICK_STUDY)


def replication_result() -> dict:
    return measured(REPLICATION)


@functools.cache
def screen_result() -> dict | None:
    """The screening pilot as results_screen.measure_screen gives it (None before its look)."""
    import results_screen as evidence_screen

    return evidence_screen.measure_screen(study(SCREEN_STUDY))


def render_real_words() -> str:
    """The real model's study in words (results_evidence.real_words): before its look that no result exists
    and its safety reading (collapsed runs), every pre-registered endpoint after it, from its committed files."""
    import results_evidence as evidence

    return evidence.real_words(real_result())


def render_real_lr_words() -> str:
    """The real model's second study in words (results_evidence.real_lr_words): before its look that no
    result exists, every pre-registered endpoint after it, from its committed files."""
    import results_evidence as evidence

    return evidence.real_lr_words(real_lr_result())


# The start's tasks, in its study.yaml's order, and how its page names them.
TASK_WORDS = {"addition": "two-digit addition", "addition-guess-half": "addition, half the items hiding an operand"}
REAL_START = {task: TASK_WORDS[task] for task in study("smollm2-start").arms}


def render_real_start() -> str:
    """The real model's start (no RL) on each of its tasks' test splits (smollm2-start/<task>/report.json)."""
    body = []
    for task, what in REAL_START.items():
        m = summary(f"smollm2-start/{task}/report.json")["metrics"]
        body.append([f"`{task}` ({what})", f"{int(m['n_problems'])} x {int(m['n_samples'] / m['n_problems'])}",
                     f"{m['pass@1']:.3f}", f"{m['auroc']:.3f}", f"{m['auroc_question']:.3f}", f"{m['ece']:.3f}",
                     f"{m['e_aurc']:.3f}", f"{m['finished_frac']:.3f}", f"{m['mean_tokens']:.1f}"])
    return table(["task", "problems x samples", "accuracy", "pooled AUROC", "per-question AUROC", "ECE", "E-AURC",
                  "finished", "mean tokens"], body)


def render_real_mask() -> str:
    """The start model's samples by kind of item, and what the paper's thresholds would drop of them
    (smollm2-start/<task>/paper-mask.json; the start model is the reference, so exp(-s) is the reference PPL)."""
    body = []
    for task in REAL_START:
        m = summary(f"smollm2-start/{task}/paper-mask.json")
        kinds = "; ".join(f"{k} {m[k + '/accuracy']:.3f}" for k in ("derivable", "guessable") if k + "/accuracy" in m)
        body.append([f"`{task}`", kinds, f"{m['n_correct']} / {m['n_wrong']}", f"{m['dropped_correct']:.3f}",
                     f"{m['dropped_wrong']:.3f}", f"{m['ppl_correct_max']:.2f}", f"{m['ppl_wrong_min']:.3f}"])
    return table(["task", "accuracy by item", "right / wrong samples", f"right dropped (PPL > {m['ref_high']})",
                  f"wrong dropped (PPL < {m['ref_low']})", "highest PPL of a right one", "lowest PPL of a wrong one"],
                 body)


def render_real_calibrate() -> str:
    """calibrate-mask on the real model: 512 train problems x 8 (smollm2-start/<task>/calibrate-mask.json)."""
    body = []
    for task in REAL_START:
        path = RESULTS / "smollm2-start" / task / "calibrate-mask.json"
        if not path.is_file():
            continue
        m = json.loads(path.read_text())
        q = lambda key: " / ".join(f"{v:.3f}" for v in m[key])  # noqa: E731
        body.append([f"`{task}`", f"{m['n_problems']} x {m['n_samples'] // m['n_problems']}", f"{m['mixed_groups']}",
                     f"{m['reference_accuracy']:.3f}", f"{m['reference_auroc']:.3f}", f"{m['score_spread']:.3f}",
                     f"{m['ref_high']:.3f}", f"{m['ref_low']:.3f}", q("ppl_correct_quartiles"), q("ppl_wrong_quartiles")])
    return table(["task", "problems x samples", "mixed groups", "accuracy", "AUROC", "score spread (absolute tau)",
                  "ref_high", "ref_low", "PPL of right answers (quartiles)", "PPL of wrong answers (quartiles)"], body)


def render_real_truncation() -> str:
    """GRPO's and CAPO's advantages of the start model's test samples taken as training batches, by kind
    (smollm2-start/<task>/truncation.json): what unfinished samples carry, out of the loss."""
    body = []
    for task in REAL_START:
        m = summary(f"smollm2-start/{task}/truncation.json")
        body.append([f"`{task}`", f"{m['mixed_groups']} ({m['mixed_groups_with_unfinished']})",
                     f"{m['n/right']} / {m['n/wrong_finished']} / {m['n/wrong_unfinished']}",
                     " / ".join(f"{m['score/' + k]:.2f}" for k in ("right", "wrong_finished", "wrong_unfinished"))]
                    + [" / ".join(f"{m[f'{name}/advantage/{k}']:+.3f}" for k in ("right", "wrong_finished",
                                                                                 "wrong_unfinished"))
                       for name in ("grpo", "capo")]
                    + [f"{m[f'{name}/unfinished_total_per_group']:+.3f}" for name in ("grpo", "capo", "capo_tied")])
    return table(["task", "mixed groups (with an unfinished sample)", "samples: right / wrong finished / wrong unfinished",
                  "mean score (nats), same order", "GRPO mean advantage, same order", "CAPO mean advantage, same order",
                  "GRPO: unfinished total per mixed group", "CAPO: unfinished total per mixed group",
                  "CAPO, `truncated_pairs: tied`: unfinished total per mixed group"], body)


def render_real_sweep() -> str:
    """The real model's exploratory sweep, one row per arm that ran (its study.yaml's records, smollm2-sweep/<arm>.json,
    collected from each run's trainer state); the criterion of its protocol, read at the study's steps (100):
    validation accuracy +0.10 from step 0, mean training length < 30 tokens there."""
    sweep, body = study("smollm2-sweep"), []
    at = sweep.steps
    for path in (p for arm in sweep.arms if (p := sweep.record_path(arm, sweep.seeds[0])).is_file()):
        m = json.loads(path.read_text())
        val = {v["step"]: v for v in m["validation"]}
        first, last = val[min(val)], val[max(val)]
        length = next((r["completions/mean_length"] for r in m["train"] if r["step"] == at), None)
        acc = lambda v: f"{v['val/mean@4']:.3f} [{v['val/mean@4_ci_low']:.3f}, {v['val/mean@4_ci_high']:.3f}]"  # noqa: E731
        num = lambda x: "undefined" if x is None else f"{x:.3f}"  # noqa: E731  (AUROC with no right answer)
        met = (at in val and length is not None
               and val[at]["val/mean@4"] - first["val/mean@4"] >= 0.10 and length < 30)
        minutes = f"{sum(m['wall_s']) / 60:.0f}" if m["wall_s"] else "running"
        body.append([m["arm"], f"{m['learning_rate']:g}", m["layers"], str(m["global_step"]),
                     " / ".join(acc(val[s]) for s in sorted(val)), f"{num(first['val/auroc'])} / {num(last['val/auroc'])}",
                     f"{num(first['val/ece'])} / {num(last['val/ece'])}",
                     f"{length:.1f}" if length is not None else "-", "yes" if met else "no", minutes])
    return table(["arm", "learning rate", "LoRA on", "steps", "validation accuracy every 50 steps from 0 [95% CI]",
                  "pooled AUROC first / last", "ECE first / last", "mean length at 100", "criterion met (at 100)",
                  "wall minutes"], body)


SECOND = "auroc_question_falls"  # the pilots' second verdict (per-question AUROC), a check of their criterion


def render_real_pilot(name: str = "smollm2-pilot") -> str:
    """A real model's pilot (one GRPO arm per task; its study.yaml's records and criterion): per task, the start and
    each GRPO seed on the test split, each seed's checks of the pre-registered criterion, and its verdict."""
    from capo_trl.harness import criterion, study_report

    pilot = study(name)
    rule, result, runs = pilot.criterion, study_report.checks(pilot), study_report.records(pilot)
    body = []
    for task in pilot.arms:
        start = criterion.start_record(pilot.folder, rule["start"], pilot.arm_task(task))
        done = result["runs"][task]
        for label, m, checks in [("start", start, None)] + [(f"GRPO seed {s}", runs[task][s], done[s]) for s in done]:
            guess = f"{m['guessable/accuracy']:.3f} / {m['guessable/modal_share']:.3f}" if "guessable/accuracy" in m else "-"
            failed = [] if checks is None else [k for k in rule["required"] if not checks[k]]
            met = "-" if checks is None else "yes" if checks["required_met"] else f"no ({', '.join(failed)})"
            per_q = "-" if checks is None else "yes" if checks[SECOND] else "no"
            body.append([f"`{task}`", label, f"{m['accuracy']:.3f} [{m['accuracy_ci'][0]:.3f}, {m['accuracy_ci'][1]:.3f}]",
                         f"{m['auroc']:.3f}", f"{m['auroc_question']:.3f}", f"{m['ece']:.3f}", f"{m['e_aurc']:.3f}",
                         f"{m['mean_tokens']:.1f}", f"{m['finished_frac']:.3f}", guess, met, per_q])
        verdict_text = ("**test bed**" if result["meets"][task] else "**not a test bed**") if result["complete"][task] \
            else f"open ({len(done)} of {len(pilot.seeds)} seeds)"
        body.append([f"`{task}`", "verdict", verdict_text, "", "", "", "", "", "", "", "", ""])
    fell = abs(rule["checks"][SECOND]["change"])
    return table(["task", "model", "accuracy [95% CI]", "pooled AUROC", "per-question AUROC", "ECE", "E-AURC",
                  "mean tokens", "finished", "guessable accuracy / modal share", "criterion met (failed checks)",
                  f"per-question AUROC fell >= {fell:g}"], body)


def render_real_study(name: str = REAL_STUDY) -> str:
    """One of the real model's confirmatory studies: the analysis its study.yaml fixes, of its committed records."""
    from capo_trl.harness import confirmatory, study_report

    found = study(name)
    return confirmatory.render(study_report.analysis(found), found.plan)


def all_truncated_from(train: list[dict]) -> dict | None:
    """A run's first log whose every completion ran to the length limit (clipped ratio 1.0 over the logging
    window) and what it logged after that: its lowest clipped ratio, and whether any later log had a gradient (the
    norm is its last step's). None: no such log. With ``mask_truncated_completions`` such steps train nothing."""
    first = next((i for i, x in enumerate(train) if x["completions/clipped_ratio"] >= 1.0), None)
    if first is None:
        return None
    after = train[first + 1:]
    return {"step": train[first]["step"],
            "lowest_clipped_after": min((x["completions/clipped_ratio"] for x in after), default=None),
            "gradient_after": any(x["grad_norm"] > 0 for x in after)}


def render_real_stuck(name: str = REAL_STUDY) -> str:
    """Exploratory, from a finished study's training logs (its records' ``train``): per arm, the runs that logged a
    window of only truncated completions, when, and whether they trained again; then the same in words."""
    from capo_trl.harness import confirmatory, study_report

    found = study(name)
    plan, runs = found.plan, study_report.records(found)
    body, stuck, after = [], {}, []
    for arm, by_seed in runs.items():
        recs = list(by_seed.values())
        found = [(r, all_truncated_from(r["train"])) for r in recs]
        hits = [h for _, h in found if h is not None]
        others = [max(x["completions/clipped_ratio"] for x in r["train"]) for r, h in found if h is None]
        stuck[arm] = (len(hits), len(recs))
        after += [h for h in hits if h["lowest_clipped_after"] is not None]
        steps = sorted(h["step"] for h in hits)
        lowest = [h["lowest_clipped_after"] for h in hits if h["lowest_clipped_after"] is not None]
        body.append([f"`{arm}`", str(len(recs)), str(len(hits)), f"{steps[0]}-{steps[-1]}" if steps else "-",
                     f"{min(lowest):.3f}" if lowest else "-", str(sum(h["gradient_after"] for h in hits)),
                     f"{max(others):.2f}" if others else "-",
                     str(sum(confirmatory.collapsed(r, plan) for r in recs))])
    out = table(["arm", "runs", "a log with every completion truncated (runs)", "its first step (range)",
                 "lowest clipped ratio logged after it", "a gradient logged after it (runs)",
                 "highest clipped ratio of the other runs", "collapsed at test (the protocol's rule)"], body)
    counts = "; ".join(f"`{arm}` {n} of {total}" for arm, (n, total) in stuck.items())
    if not after:
        return out + f"\nRuns with a log whose every completion ran to the limit: {counts}.\n"
    trained = sum(h["gradient_after"] for h in after)
    return out + (f"\nRuns with a log whose every completion ran to the limit: {counts}. Of the {len(after)} that "
                  f"logged again after it, the lowest clipped ratio logged was "
                  f"{min(h['lowest_clipped_after'] for h in after):.3f} and {trained} logged a gradient again"
                  + (" (with `mask_truncated_completions` a truncated completion is out of the loss, so a step "
                     "whose completions all ran to the limit trains nothing).\n" if trained == 0 else ".\n"))


def render_real_tied() -> str:
    """The exploratory pilot of truncated_pairs: tied (its study.yaml: one arm of its own, the study's capo-nomask and
    grpo reused): collapse per seed by its file's rule (the study's), its arm's next to the study's runs of that seed,
    and its own arm's endpoints."""
    from capo_trl.harness import confirmatory

    tied = study("smollm2-tied")
    word = {True: "collapsed", False: "no", None: "not run yet"}
    body = []
    for seed in tied.seeds:
        paths = {arm: tied.record_path(arm, seed) for arm in tied.arms}
        row = [str(seed)] + [word[confirmatory.collapsed(json.loads(p.read_text()), tied.plan) if p.is_file() else None]
                             for p in paths.values()]
        path = paths[tied.own_arms()[0]]
        if path.is_file():
            r = json.loads(path.read_text())
            num = lambda v, d=3: "undefined" if v is None else f"{v:.{d}f}"  # noqa: E731
            row += [num(r["accuracy"]), num(r["auroc"]), num(r["auroc_question"]), num(r["ece"]), num(r["e_aurc"]),
                    num(r["finished_frac"]), num(r["mean_tokens"], 1),
                    num(max(x.get("completions/clipped_ratio", 0.0) for x in r["train"]), 2)]
        else:
            row += ["-"] * 8
        body.append(row)
    return table(["seed", "`tied`: collapsed", "study `capo-nomask`: collapsed", "study `grpo`: collapsed",
                  "`tied`: accuracy", "pooled AUROC", "per-question AUROC", "ECE", "E-AURC", "finished",
                  "mean tokens", "highest clipped ratio in training"], body)


COUNT = dict(enumerate(("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                         "twelve")))
# A pilot's decisions (its study.yaml's criterion) as its page words them.
DECISION_WORDS = {"candidate": "3e-4 a candidate setting for a second study",
                  "recipe_learning_rate": "the CAPO SmolLM2 recipe's learning rate becomes 3e-4"}


def render_real_lr(name: str = "smollm2-lr") -> str:
    """The learning-rate pilot: per arm and seed the checks its study.yaml's criterion fixes (against the start model
    it names) and the test endpoints; then the decisions, once every run is in."""
    from capo_trl.harness import criterion, study_report

    pilot = study(name)
    result, runs = study_report.checks(pilot), study_report.records(pilot)
    grpo, capo = list(pilot.arms)
    word = {True: "yes", False: "no"}
    body = []
    for seed in pilot.seeds:
        for arm in pilot.arms:
            c = result["runs"][arm].get(seed)
            if c is None:
                body.append([str(seed), f"`{arm}`", "not run yet"] + ["-"] * 10)
                continue
            r = runs[arm][seed]
            num = lambda v, d=3: "undefined" if v is None else f"{v:.{d}f}"  # noqa: E731
            body.append([str(seed), f"`{arm}`", word[c["collapsed"]], word[c["loses_calibration"]], word[c["trains"]],
                         num(r["accuracy"]), num(r["auroc"]), num(r["auroc_question"]), num(r["ece"]),
                         num(r["e_aurc"]), num(r["finished_frac"]), num(r["mean_tokens"], 1),
                         num(max(x.get("completions/clipped_ratio", 0.0) for x in r["train"]), 2)])
    out = table(["seed", "arm", "collapsed", "loses calibration (the pilots' criterion)", "trains (accuracy +0.02, "
                 "no collapse)", "accuracy", "pooled AUROC", "per-question AUROC", "ECE", "E-AURC", "finished",
                 "mean tokens", "highest clipped ratio in training"], body)
    start = criterion.start_record(pilot.folder, pilot.criterion["start"], pilot.task)
    out += (f"\nStart model (`{pilot.criterion['start']}`): accuracy {start['accuracy']:.3f}, pooled AUROC "
            f"{start['auroc']:.3f}.\n")
    d = result["decided"]
    if d is None:
        total = COUNT.get(len(pilot.arms) * len(pilot.seeds), len(pilot.arms) * len(pilot.seeds))
        return out + f"Decisions: not yet (they are taken when all {total} runs are in).\n"
    side = ", ".join(f"{s} {runs[capo][s]['auroc'] - runs[grpo][s]['auroc']:+.3f}" for s in pilot.seeds)
    decided = "; ".join(f"{DECISION_WORDS.get(name, name)}: {word[value]}" for name, value in d.items())
    return out + (f"Decisions (the protocol's): {decided}.\n\nSide by side, as the protocol allows (exploratory: "
                  f"{COUNT.get(len(pilot.seeds), len(pilot.seeds))} seeds, no interval, no test): pooled AUROC at the "
                  f"end, `{capo}` minus `{grpo}`, by seed: {side}.\n")


def _push(logs: list[dict]) -> float | None:
    """The logs' net advantage on truncated completions over GRPO's on the same batches (None: GRPO pushed none)."""
    grpo = sum(x["capo/truncated_adv_share_grpo"] for x in logs)
    return sum(x["capo/truncated_adv_share"] for x in logs) / grpo if grpo < 0 else None


def render_drift(name: str = "smollm2-screen") -> str:
    """Exploratory, per run of a study's own runs (the screening pilot's, the pick study's, its replication's) as
    each finishes: when the trainer's drift rule (capo_trl.training.monitor.DriftWatch) holds, replayed from the
    run's logged 5-step means of the signals it reads, against when every completion first ran to the limit; and
    the push against truncated completions (the run's logged shares summed, over GRPO's on the same batches)."""
    from capo_trl.harness import study_report
    from capo_trl.training.monitor import replay_drift

    pilot = study(name)
    runs, body, drifted, others = study_report.records(pilot), [], [], []
    for arm, seed in pilot.own_runs():
        r = runs[arm].get(seed)
        if r is None:
            body.append([f"`{arm}`", str(seed), "not run yet"] + ["-"] * 5)
            continue
        train = r["train"]
        warned, stuck = replay_drift(train), all_truncated_from(train)
        push = [_push(train[:4]), _push(train)]
        end = stuck["step"] if stuck else r["global_step"]  # a run that collapsed only at test: its last step
        lead = end - warned if warned is not None and warned <= end else None
        (drifted if study_report.drifted(r, pilot.plan) else others).append((warned, stuck, lead))
        body.append([f"`{arm}`", str(seed), "no" if warned is None else str(warned),
                     "no" if stuck is None else str(stuck["step"]), "-" if lead is None or not stuck else str(lead),
                     f"{max(x['completions/clipped_ratio'] for x in train):.2f}",
                     *("n/a" if v is None else f"{v:.2f}" for v in push)])
    out = table(["arm", "seed", "drift warning at step", "every completion at the limit from step",
                 "steps between", "highest clipped ratio", "push against truncation, of GRPO's: steps 1-20",
                 "whole run"], body)
    if not drifted and not others:
        return out
    early = sum(lead is not None and lead >= 20 for _, _, lead in drifted)
    if not drifted:
        return out + (f"\nOf the {len(others)} runs finished, none drifted (a window of only truncated completions, "
                      f"or collapsed at test); the rule warned in {sum(w is not None for w, _, _ in others)} of them.\n")
    rule = "the pilot's rule" if pilot.kind == "pilot" else "a window of only truncated completions, or collapsed at test"
    return out + (f"\nOf the {len(drifted) + len(others)} runs finished, {len(drifted)} drifted ({rule}); the "
                  f"rule warned before {sum(lead is not None for _, _, lead in drifted)} of them, 20 steps or more "
                  f"before for {early}, and it warned in {sum(w is not None for w, _, _ in others)} of the other "
                  f"{len(others)} (a run that collapsed only at test counts from its last step).\n")


def render_pick_words() -> str:
    """The study of the screening pilot's pick in words, and from its look what the library recommends for a real
    model by its protocol's rule (results_verdict.pick_paragraphs), and from its own look the
    replication's words beside them, from their committed files."""
    import results_verdict as evidence_verdict

    return evidence_verdict.pick_paragraphs(pick_result(), real_lr_result(), screen_result()["pick"],
                                            replication_result())


def render_replication_words() -> str:
    """The replication on addition-guess-half in words (results_evidence.replication_words), from its files."""
    import results_evidence as evidence

    return evidence.replication_words(replication_result(), screen_result()["pick"])


REAL_RENDER = {"smollm2-start": render_real_start, "smollm2-start-mask": render_real_mask,
               "smollm2-calibrate-mask": render_real_calibrate, "smollm2-start-truncation": render_real_truncation,
               "smollm2-sweep": render_real_sweep, "smollm2-pilot": render_real_pilot,
               "smollm2-pilot2": lambda: render_real_pilot("smollm2-pilot2"),
               "smollm2-study": render_real_study, "smollm2-study-words": render_real_words,
               "smollm2-study-stuck": render_real_stuck,
               "smollm2-tied": render_real_tied, "smollm2-lr": render_real_lr,
               "smollm2-lr-study": lambda: render_real_study(REAL_LR_STUDY),
               "smollm2-lr-study-words": render_real_lr_words, "smollm2-screen-drift": render_drift,
               "smollm2-pick-study": lambda: render_real_study(PICK_STUDY), "smollm2-pick-study-words": render_pick_words,
               "smollm2-pick-study-drift": lambda: render_drift(PICK_STUDY),
               "smollm2-pick-guess-half": lambda: render_real_study(REPLICATION),
               "smollm2-pick-guess-half-words": render_replication_words,
               "smollm2-pick-guess-half-drift": lambda: render_drift(REPLICATION)}
