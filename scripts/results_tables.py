"""Render every number block of the results pages (README.md, docs/concepts.md, docs/results/**/README.md)
from the committed result files, and the recommended configuration (README.md, docs/config.md, docs/faq.md,
docs/concepts.md) from ``capo_trl.training.defaults``.

    python scripts/results_tables.py            rewrite the blocks in place
    python scripts/results_tables.py --check    exit 1 (and print the differences) if any is stale

A block is the text between ``<!-- table: NAME (rendered by scripts/results_tables.py) -->`` (or
``<!-- text: NAME ... -->`` for a sentence) and ``<!-- end table -->`` / ``<!-- end text -->``; ``RENDER[NAME]``
builds it from files under docs/results/. On a study's page (docs/results/<study>/README.md) a table of numbers
outside such a block is an error (``unrendered_tables``), so a number without a file cannot be written; the
index (docs/results/README.md) and the other pages hold tables of settings, not results.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
import textwrap

from results_common import RESULTS, ROOT, study, summary, table
from results_cost import COST_RENDER
from results_real import REAL_RENDER, pick_result, real_lr_result, real_result, replication_result, screen_result
from results_recommend import render_recommended

from capo_trl.harness.paired import holm, paired_test, t_power

PAGES = (ROOT / "README.md", ROOT / "docs" / "concepts.md", ROOT / "docs" / "config.md", ROOT / "docs" / "faq.md",
         RESULTS / "README.md", *sorted(RESULTS.glob("*/README.md")))
BLOCK = re.compile(r"(<!-- (?P<kind>table|text): (?P<name>[\w-]+) \(rendered by scripts/results_tables\.py\) -->\n)"
                   r"(?P<body>.*?)(<!-- end (?P=kind) -->)", re.S)
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece")  # the column order of the method tables


def rows(path: str) -> list[dict]:
    with open(RESULTS / path, newline="") as f:
        return list(csv.DictReader(f))


def mean_sd(values: list[float], digits: int = 3) -> str:
    """``mean ± sd`` over seeds (sample sd), or the value alone for one seed."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def from_summary(path: str, key: str, bold: tuple = ()) -> list[str]:
    """One method's row of a ``capo-trl compare`` summary.json: mean ± sd over its seeds."""
    stats = summary(path)["summary"][key]
    cells = []
    for name in ENDPOINTS:
        mean, sd = stats[name]
        cell = f"{mean:.3f}" if sd == 0 else f"{mean:.3f} ± {sd:.3f}"
        cells.append(f"**{cell}**" if name in bold else cell)
    return cells


def from_final(paths: list[str], method: str, bold: tuple = ()) -> list[str]:
    """One method's row pooled over several ``final.csv`` files (one seed or more each)."""
    found = [r for p in paths for r in rows(p) if r["method"] == method]
    cells = [mean_sd([float(r[name]) for r in found]) for name in ENDPOINTS]
    return [f"**{c}**" if name in bold else c for c, name in zip(cells, ENDPOINTS)]


METHOD_HEADER = ["method", "accuracy", "pooled AUROC", "per-question AUROC", "ECE"]


def render_main() -> str:
    grpo_capo = "arithmetic-200-steps/grpo-capo/summary.json"
    variants = "arithmetic-200-steps/capo-variants/summary.json"
    body = [["start (no RL)", *from_summary(grpo_capo, "start (no RL)")],
            ["grpo", *from_summary(grpo_capo, "grpo")],
            ["capo (relative tau 1.0, bounded scale, no mask)", *from_summary(grpo_capo, "capo")],
            ["capo (relative tau 0.5, matched scale, no mask)",
             *from_summary(variants, "capo:advantage_scale=matched:tau=0.5")],
            ["capo-paper (tau 0.6 nats, 1/tau scale, mask 2.5 / 1.05)", *from_summary(variants, "capo-paper")]]
    return table(["method", "accuracy (mean@8)", *METHOD_HEADER[2:]], body)


def render_noise() -> str:
    labels = {"start (no RL)": "start (no RL)", "grpo": "grpo", "grpo-mask": "grpo-mask", "capo": "capo (no mask)",
              "capo-mask": "capo-mask"}
    bold = {"capo": ("accuracy",)}
    body = [[label, *from_summary("grader-noise-1-seed/summary.json", key, bold=bold.get(key, ()))]
            for key, label in labels.items()]
    return table(METHOD_HEADER, body)


def render_noise3() -> str:
    paths = [f"grader-noise-3-seeds/seed-{k}/final.csv" for k in range(3)]
    body = [["start (no RL)", "-", *from_final(paths[:1], "start (no RL)")]]
    for key, label in (("grpo", "grpo"), ("grpo-mask", "grpo-mask"), ("capo", "capo (no mask)"),
                       ("capo-mask", "capo-mask")):
        seeds = len([r for p in paths for r in rows(p) if r["method"] == key])
        body.append([label, str(seeds), *from_final(paths, key, bold=("accuracy",) if key == "capo" else ())])
    return table(["method", "seeds", *METHOD_HEADER[1:]], body)


def render_long() -> str:
    runs = {"GRPO": ("arithmetic-600-steps/grpo-seeds-0-1/final.csv", "arithmetic-600-steps/grpo-seed-2/final.csv",
                     "grpo"),
            "CAPO": ("arithmetic-600-steps/capo-seeds-0-1/final.csv", "arithmetic-600-steps/capo-seed-2/final.csv",
                     "capo:advantage_scale=matched:tau=0.5")}
    body = []
    for metric, label in (("accuracy", "accuracy"), ("auroc_question", "per-question AUROC"), ("auroc", "pooled AUROC")):
        for arm, (first, third, method) in runs.items():
            by_seed = {int(r["seed"]): float(r[metric]) for p in (first, third) for r in rows(p) if r["method"] == method}
            values = [by_seed[s] for s in sorted(by_seed)]
            # Seed 2 of CAPO is the collapsed run: bold, as the text discusses it.
            cells = [f"**{v:.3f}**" if arm == "CAPO" and s == 2 and metric != "accuracy" else f"{v:.3f}"
                     for s, v in zip(sorted(by_seed), values)]
            body.append([f"{arm} {label}", *cells, mean_sd(values)])
    return table(["run", "seed 0", "seed 1", "seed 2", "mean ± sd"], body)


ARMS = {"grpo": "A grpo", "capo-mask:advantage_scale=matched:tau=0.5": "B capo-mask (matched, tau 0.5)",
        "capo-paper": "C capo-paper", "capo:advantage_scale=matched:tau=0.5": "D capo, no mask"}


def render_powered() -> str:
    per_seed = rows("arithmetic-powered/per_seed.csv")
    body = []
    for method, label in ARMS.items():
        mine = [r for r in per_seed if r["method"] == method]
        cells = [mean_sd([float(r[k]) for r in mine]) for k in ("auroc_question", "accuracy", "auroc", "ece")]
        body.append([label, str(len(mine)), *cells, f"{statistics.mean(float(r['mean_tokens']) for r in mine):.1f}"])
    return table(["method", "seeds", "auroc_question", "accuracy", "auroc", "ece", "mean tokens"], body)


def _comparisons(pairs, with_verdict: bool) -> str:
    comparisons = summary("arithmetic-powered/summary.json")["comparisons"]
    short = {method: label.split()[0] for method, label in ARMS.items()}
    body = []
    for b, a in pairs:
        for endpoint in ("auroc_question", "accuracy", "auroc", "ece"):
            d = comparisons[f"{b} - {a}: {endpoint}"]
            row = [f"{short[b]} - {short[a]}", endpoint, str(d["n"]), f"{d['mean']:+.4f}",
                   f"[{d['t_low']:+.4f}, {d['t_high']:+.4f}]", f"[{d['boot_low']:+.4f}, {d['boot_high']:+.4f}]",
                   f"{d['wilcoxon_p']:.3f}"]
            if with_verdict:  # the pre-registered rule (protocol.md), on the primary endpoint only
                row.append(("helps" if d["t_low"] > 0 else "hurts" if d["t_high"] < 0 else "inconclusive")
                           if endpoint == "auroc_question" else "")
            body.append(row)
    header = ["comparison", "endpoint", "n", "mean", "95% t-interval", "bootstrap 95%", "Wilcoxon p"]
    return table(header + ["verdict"] * with_verdict, body)


A, B, C, D = ARMS


def render_paired() -> str:
    return _comparisons([(B, A), (C, A)], with_verdict=True)


def render_exploratory() -> str:
    return _comparisons([(D, A), (D, B)], with_verdict=False)


def render_collapse() -> str:
    per_seed = rows("arithmetic-powered/per_seed.csv")
    body = []
    for method in (D, B, A, C):
        mine = sorted((r for r in per_seed if r["method"] == method and int(r["seed"]) <= 4), key=lambda r: int(r["seed"]))
        runs = ", ".join(f"s{r['seed']}: {float(r['mean_tokens']):.1f} / {float(r['auroc']):.3f} / "
                         f"{float(r['auroc_question']):.3f}" for r in mine)
        collapsed = sum(r["collapsed"] == "True" for r in mine)
        body.append([ARMS[method], str(len(mine)), str(collapsed), runs])
    return table(["arm", "seeds 0-4", "collapsed", "per seed (tokens / pooled AUROC / per-question AUROC)"], body)


def render_confidence() -> str:
    """The table scripts/confidence_table.py wrote next to its files (confidence/table.md), as it is."""
    text = (RESULTS / "calibrated-confidence" / "table.md").read_text()
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("|"))


def render_pilot(name: str) -> str:
    """A test-bed pilot's tables and verdict (one GRPO arm), re-rendered from its start and seed files with the
    criterion its study.yaml fixes."""
    from capo_trl.harness import criterion, pilot, study_report

    found = study(name)
    arm = next(iter(found.arms))
    start = criterion.start_record(found.folder, found.criterion["start"], found.arm_task(arm))
    result = study_report.checks(found)
    verdict = {"per_seed": result["runs"][arm], "test_bed": result["meets"][arm]}
    return pilot.render(start, study_report.records(found)[arm], verdict)


def render_testbed_compare() -> str:
    """The five-arm comparison's tables (guess-half-comparison/), re-rendered from its run files by the test-bed
    driver's report."""
    from capo_trl.harness import testbed

    return testbed.render(testbed.summarise(RESULTS / TESTBED_DIR))


# ------------------------------------------------------------------ the test-bed comparison, re-analysed
TESTBED_DIR = "guess-half-comparison"


def _contrasts() -> tuple[tuple, dict]:
    """The comparison's primary (arm, minus) and its secondaries by arm, as its study.yaml fixes them."""
    plan = study(TESTBED_DIR).plan
    return plan.primary[1:], {arm: minus for _, arm, minus in plan.secondaries}


def _by_seed(method: str, key: str) -> list[float]:
    found = summary(f"{TESTBED_DIR}/summary.json")
    return [found["per_seed"][method][str(seed)][key] for seed in found["complete_seeds"]]


def paired(a: str, b: str, key: str = "auroc") -> dict:
    """``a - b`` by seed over the complete seeds: scipy's one-sample t test (interval, p), the exact sign-flip
    permutation p (every one of the 2^n sign patterns), and the t interval with each seed left out."""
    import numpy as np
    from scipy import stats

    seeds = summary(f"{TESTBED_DIR}/summary.json")["complete_seeds"]
    d = np.subtract(_by_seed(a, key), _by_seed(b, key))
    loo = {seed: tuple(stats.ttest_1samp(np.delete(d, i), 0.0).confidence_interval()) for i, seed in enumerate(seeds)}
    return {**paired_test(d), "loo": {s: (float(lo), float(hi)) for s, (lo, hi) in loo.items()}}


def observed_power(d: dict, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at ``d``'s own n, for an effect equal to its observed mean and sd."""
    return t_power(d["mean"], d["sd"], d["n"], alpha)


def testbed_facts() -> dict:
    """Every number the words about the test-bed comparison use (pages, README, concepts, the demo)."""
    found = summary(f"{TESTBED_DIR}/summary.json")
    primary, secondaries = _contrasts()
    secondary = {arm: paired(arm, minus) for arm, minus in secondaries.items()}
    nomask = secondary["capo-nomask"]
    return {"seeds": nomask["n"], "start": found["start"]["auroc"], "grpo": found["arms"]["grpo"]["auroc"],
            "nomask_end": found["arms"]["capo-nomask"]["auroc"], "primary": paired(*primary),
            "nomask": nomask, "holm_p": holm({arm: d["p"] for arm, d in secondary.items()})["capo-nomask"],
            "power": observed_power(nomask),
            "fragile": [s for s, (lo, hi) in nomask["loo"].items() if lo <= 0 <= hi],
            "mask_vs_nomask": {k: paired("capo", "capo-nomask", k)
                               for k in ("auroc", "e_aurc", "guessable/modal_share")}}


def _iv(d: dict) -> str:
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def _seeds(seeds: list) -> str:
    return ", ".join(map(str, seeds[:-1])) + f" or {seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def render_testbed_words() -> str:
    """The test-bed result in one paragraph, for README.md, docs/concepts.md and the comparison's page."""
    f = testbed_facts()
    n, p, mv = f["nomask"], f["primary"], f["mask_vs_nomask"]
    return textwrap.fill(
           f"On `guess-half` (half the items can only be guessed) GRPO does lose calibration: pooled AUROC "
            f"{f['start']:.3f} -> {f['grpo']:.3f} over 600 steps ({f['seeds']} seeds). CAPO as recommended (with the "
            f"noise mask) did not keep it better than GRPO: {_iv(p)} (95% t interval), no difference shown. CAPO "
            f"without the mask ended at {f['nomask_end']:.3f}, {_iv(n)} against GRPO (paired t p = {n['p']:.3f}), "
            f"and all {n['favour']} of {n['n']} seeds favoured it, but that is suggestive, not shown: it was one of "
            f"{len(_contrasts()[1])} secondary comparisons with no correction (Holm's would give "
            f"p = {f['holm_p']:.3f}), "
            f"the exact sign-flip test gives p = {n['flip_p']:.4f} (the smallest {n['n']} seeds allow), and leaving "
            f"out any one of seeds {_seeds(f['fragile'])} makes the interval cross 0. Nor is it shown that removing "
            f"the mask is what kept calibration: CAPO with the mask minus CAPO without it is {_iv(mv['auroc'])} on "
            f"pooled AUROC and {_iv(mv['e_aurc'])} on E-AURC; only the guessable items' modal-answer share differs "
            f"clearly ({_iv(mv['guessable/modal_share'])}).",
           width=110, break_on_hyphens=False, break_long_words=False) + "\n"


def render_testbed_robustness() -> str:
    """Each contrast the words use, with both tests, and the leave-one-out intervals of the secondary one."""
    f = testbed_facts()
    rows_ = [("capo - grpo (primary)", "auroc", f["primary"]), ("capo-nomask - grpo (secondary)", "auroc", f["nomask"])]
    rows_ += [("capo - capo-nomask (exploratory)", k, d) for k, d in f["mask_vs_nomask"].items()]
    body = [[name, key, str(d["n"]), f"{d['mean']:+.3f}", f"[{d['low']:+.3f}, {d['high']:+.3f}]", f"{d['p']:.3f}",
             f"{d['flip_p']:.4f}", f"{d['favour']} of {d['n']}", f"{d['sd']:.3f}"] for name, key, d in rows_]
    first = table(["contrast", "endpoint", "seeds", "mean", "95% t interval", "paired t p", "exact sign-flip p",
                   "seeds above 0", "sd of the differences"], body)
    loo = [[str(s), f"[{lo:+.3f}, {hi:+.3f}]", "yes" if lo <= 0 <= hi else "no"]
           for s, (lo, hi) in f["nomask"]["loo"].items()]
    second = table(["seed left out", "capo-nomask - grpo, 95% t interval", "crosses 0"], loo)
    return (first + f"\nPower of the paired t test (n = {f['nomask']['n']}, two-sided 0.05) for capo-nomask's own "
            f"observed effect and sd: {f['power']:.2f}.\n\n" + second)


MASK_STUDY = "guess-half-mask-study"
# The confirmatory study of each test bed, whose words the pages and `capo-trl demo` give (results_evidence).
STUDY_OF_TASK = {"guess-half": MASK_STUDY, "guess-redraw": "guess-redraw-study"}


def render_mask_study() -> str:
    """The confirmatory study's block: the analysis its study.yaml fixes, of its committed run files."""
    from capo_trl.harness import confirmatory, study_report

    found = study(MASK_STUDY)
    return confirmatory.render(study_report.analysis(found), found.plan)


def study_words(task: str) -> str:
    """A test bed's result in words with every pre-registered endpoint (results_evidence, the rendering
    `capo-trl demo` prints), measured from the study's committed files: for README.md, docs/concepts.md, the results
    index and the study's page."""
    import results_evidence as evidence

    return evidence.study_words(task, evidence.measure(study(STUDY_OF_TASK[task])))


def render_first_screen() -> str:
    """The README's first screen: the configuration to use and its evidence per model kind
    (results_first_screen), from the tiny models' study and the real model's (the replication's from its
    look), measured from files."""
    import results_evidence as evidence
    import results_first_screen as first_screen
    from capo_trl.training.defaults import RECOMMENDED

    real = {"1e-3": real_result(), "3e-4": real_lr_result()}
    return first_screen.first_screen(evidence.measure(study(MASK_STUDY)), real, RECOMMENDED, screen_result(),
                                     pick_result(), replication_result())


# The exploratory pilot's compare runs per budget, in the order they ran (protocol.md and its amendments).
DEMO_BUDGET_FOLDERS = {"B200": ("B200", "B200-capo"), "B300": ("B300", "B300-capo")}


def _broke(run: dict, start: dict, tokens: float) -> bool:
    """Amendment 2's rule for a CAPO run: test accuracy below the start model's, or mean length >= 36 tokens."""
    return float(run["accuracy"]) < float(start["accuracy"]) or tokens >= 36


def render_demo_budget() -> str:
    """The demo-budget pilot (demo-budget/): each run against the start model, per budget; the protocol's criterion
    for GRPO (pooled AUROC down >= 0.03, accuracy not down, mean length < 36 tokens, on every seed) and, where
    amendment 2 asks it (B300), whether a `capo-nomask` run broke."""
    where = "demo-budget"
    extra = {(r["budget"], r["method"], r["seed"]): r for r in rows(f"{where}/runs.csv")}
    body, verdicts, start = [], [], None
    for budget, folders in DEMO_BUDGET_FOLDERS.items():
        finals = [r for folder in folders if (RESULTS / where / folder).is_dir()
                  for r in rows(f"{where}/{folder}/final.csv")]
        if not finals:
            continue
        start = next(r for r in finals if r["method"] == "start (no RL)")
        met, broke = [], []
        for r in finals:
            if r["method"] == "start (no RL)":
                continue
            info = extra[(budget, r["method"], r["seed"])]
            tokens = float(info["mean_tokens"])
            drop = float(start["auroc"]) - float(r["auroc"])
            ok = drop >= 0.03 and float(r["accuracy"]) >= float(start["accuracy"]) and tokens < 36
            grpo = r["method"].startswith("grpo")
            if grpo:
                met.append(ok)
            elif budget != "B200" and r["method"] == "capo-nomask":
                broke.append(_broke(r, start, tokens))
            body.append([budget, f"`{r['method']}`", r["seed"], f"{float(r['accuracy']):.3f}",
                         f"{float(r['auroc']):.3f}", f"{-drop:+.3f}", f"{tokens:.1f}", f"{float(info['seconds']):.0f}",
                         ("yes" if ok else "no") if grpo else "(descriptive)"])
        line = (f"{budget}: GRPO met the criterion on {sum(met)} of {len(met)} seeds, so {budget} "
                f"{'shows' if met and all(met) else 'does not show'} the loss")
        if broke:
            line += f"; `capo-nomask` broke on {sum(broke)} of {len(broke)} seeds"
        verdicts.append(line + ".")
    head = (f"Start model on the same test set (256 problems x 8): accuracy {float(start['accuracy']):.3f}, pooled AUROC "
            f"{float(start['auroc']):.3f}.\n\n")
    return head + table(["budget", "method", "seed", "accuracy", "pooled AUROC", "change from start", "mean tokens",
                         "seconds", "criterion met"], body) + "\n" + "\n".join(verdicts) + "\n"


def render_redraw_study() -> str:
    """The replication on guess-redraw: the analysis its study.yaml fixes, of its committed run files, once they exist."""
    from capo_trl.harness import confirmatory, study_report

    found = study(STUDY_OF_TASK["guess-redraw"])
    if not any(study_report.records(found).values()):
        return "Not started: no run of this study exists yet.\n"
    return confirmatory.render(study_report.analysis(found), found.plan)


def render_gpu_check() -> str:
    """scripts/gpu_check.sh's step costs on one GPU (gpu-check/gpu_check.json): a variant the time limit cut off
    is listed as not reached, never left out."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its variants, in the order it runs them, and which GRPO each is compared with
    variants, baseline = module.VARIANTS, module.BASELINE
    report = summary("gpu-check/gpu_check.json")
    body = []
    for name, (estimator, mask, lora, zero3) in variants.items():
        kind = [estimator, "on" if mask else "off", "yes" if lora else "no", "yes" if zero3 else "no"]
        r = report["results"].get(name)
        if r is None or "error" in r:
            body.append([name, *kind, "not reached before the time limit" if r is None else "failed", "", "", "", ""])
            continue
        base = report["ratios"].get(f"{name}_over_{baseline.get(name)}", {})
        ratio = (f"{base['step_time']:.2f}x / {base['peak_memory']:.2f}x vs {baseline[name]}"
                 if base.get("step_time") else "-")
        body.append([name, *kind, f"{r['steps_measured']}: " + ", ".join(f"{t:.2f}" for t in r["step_times_s"]),
                     f"{r['step_time_s']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['peak_memory_gib']:.2f}", ratio])
    return table(["variant", "estimator", "noise mask", "LoRA", "ZeRO-3", "measured steps: seconds each",
                  "median s/step", "tokens/s", "peak GiB", "step time / peak memory"], body)


TESTBED_RENDER = {"demo-budget": render_demo_budget, "guess-redraw-study": render_redraw_study,
                  "guess-redraw-pilot": lambda: render_pilot("guess-redraw-pilot"), "guess-half-mask-study": render_mask_study,
                  "guess-half-mask-words": lambda: study_words("guess-half"),
                  "guess-redraw-words": lambda: study_words("guess-redraw"),
                  "first-screen": render_first_screen,
                  "recommended": render_recommended, "guess-half-words": render_testbed_words, "guess-half-robustness": render_testbed_robustness}


RENDER = {"arithmetic-200-steps": render_main, "grader-noise-1-seed": render_noise,
          "grader-noise-3-seeds": render_noise3, "arithmetic-600-steps": render_long,
          "arithmetic-powered": render_powered, "arithmetic-powered-paired": render_paired,
          "arithmetic-powered-exploratory": render_exploratory, "arithmetic-powered-collapse": render_collapse,
          "calibrated-confidence": render_confidence, "guess-pilot-300-steps": lambda: render_pilot("guess-pilots/300-steps"),
          "guess-pilot-600-steps": lambda: render_pilot("guess-pilots/600-steps"),
          "guess-pilot-1000-steps": lambda: render_pilot("guess-pilots/1000-steps"),
          "guess-half-comparison": render_testbed_compare, "gpu-check": render_gpu_check,
          **TESTBED_RENDER, **REAL_RENDER, **COST_RENDER}


def study_report_of(name: str) -> str:
    """A study folder's report, as `capo-trl study report` prints it: a block named after a folder with a study.yaml
    renders this, so a new study's page needs no renderer of its own."""
    from capo_trl.harness.study import load_study
    from capo_trl.harness.study_report import report

    return report(load_study(RESULTS / name))


def study_cost_of(name: str) -> str:
    """A block ``<study>-cost``: what a run of each arm of that study cost, from its records' times."""
    from capo_trl.harness.study import load_study
    from capo_trl.harness.study_report import render_cost

    return render_cost(load_study(RESULTS / name.removesuffix("-cost")))


def _renderer(name: str):
    if name in RENDER:
        return RENDER[name]
    if (RESULTS / name / "study.yaml").is_file():
        return lambda: study_report_of(name)
    if name.endswith("-cost") and (RESULTS / name.removesuffix("-cost") / "study.yaml").is_file():
        return lambda: study_cost_of(name)
    raise KeyError(f"no renderer for table {name!r}; add one to RENDER in scripts/results_tables.py, or name the "
                   "block after a study folder (its `capo-trl study report` is rendered, or with -cost its runs' cost).")


def render(text: str) -> str:
    """``text`` with every marked table re-rendered (an unknown name is an error)."""
    def one(match):
        return match.group(1) + _renderer(match["name"])() + match.group(5)
    return BLOCK.sub(one, text)


def unrendered_tables(text: str) -> list[str]:
    """Table lines holding a digit outside the marked blocks: numbers no file backs."""
    outside = BLOCK.sub("", text)
    return [line for line in outside.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")
            and re.search(r"\d", line)]


def problems(write: bool = False) -> list[str]:
    """What is stale (a unified diff per page) or unbacked (a table row outside a block); ``write`` re-renders."""
    import difflib

    found = []
    for page in PAGES:
        text, name = page.read_text(), str(page.relative_to(ROOT))
        new = render(text)
        if write:
            page.write_text(new)
        elif new != text:
            found.append("".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), name, "rendered")))
        if page.parent.parent == RESULTS:  # a study's page holds results: every table row of numbers is rendered
            found += [f"{name}: table row with numbers but no rendering block: {line}"
                      for line in unrendered_tables(text)]
    import results_demo  # the file capo-trl demo reads its studies' numbers from, written from the same records

    if write:
        results_demo.DATA.write_text(results_demo.text())
    elif results_demo.DATA.read_text() != results_demo.text():
        found.append(f"{results_demo.DATA.relative_to(ROOT)} is stale: run python scripts/results_tables.py")
    return found


def main(argv: list[str]) -> int:
    found = problems(write="--check" not in argv)
    print("\n".join(found))
    return int(bool(found))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
