"""What a study's records say, and nothing before its look: ``capo-trl study status`` and ``report``.

A confirmatory study is analysed by :mod:`capo_trl.harness.confirmatory` with the plan its file fixes (its looks,
stopping rule, Holm family, collapse and undefined-AUROC rules). A pilot is exploratory: its look is when every run
has finished, and its file's ``decision`` rule picks an arm (or none) from per-seed checks and means::

    decision:
      reference: grpo              # every candidate is compared with this arm, paired by seed
      candidates: [capo-a, capo-b] # in order of preference on a tie
      max_accuracy_loss: 0.03      # a candidate's mean paired accuracy difference must be >= -0.03
      rank_by: [auroc, auroc_question]   # among those that qualify: the highest sum of these means

A candidate qualifies when none of its runs drifted (its training log has a window in which every completion ran
to the length limit, or it collapsed at test by the file's collapse rule) and it did not lose accuracy by more
than the margin.

A pilot with a ``criterion`` (:mod:`capo_trl.harness.criterion`: checks of each run against the start model) reports
each run's checks as it finishes, and the criterion's verdict and decisions once every checked run has finished.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..errors import UsageError
from . import confirmatory, criterion
from .paired import paired_interval
from .study import Study


def records(study: Study, into=None) -> dict:
    """Every finished record, ``runs[arm][seed]`` (reused arms from their own study's folder)."""
    out = {}
    for arm in study.arms:
        out[arm] = {}
        for seed in study.seeds:
            path = study.record_path(arm, seed, into)
            if path.is_file():
                out[arm][seed] = json.loads(path.read_text())
    return out


def analysis(study: Study, into=None) -> dict:
    """A confirmatory study's analysis (:func:`capo_trl.harness.confirmatory.analyse`) of its records, at the look
    they have reached."""
    return confirmatory.analyse(study.folder, study.plan, loaded=({"seeds": study.seeds}, records(study, into)))


def checks(study: Study, runs: dict | None = None) -> dict:
    """The file's criterion over its records (or ``runs``): :func:`capo_trl.harness.criterion.evaluate`, each arm
    against its task's start record."""
    runs = records(study) if runs is None else runs
    rule = study.criterion
    starts = {arm: criterion.start_record(study.folder, rule["start"], study.arm_task(arm))
              for arm in rule.get("arms") or study.arms}
    return criterion.evaluate(rule, runs, starts, lambda rec: confirmatory.collapsed(rec, study.plan), study.seeds)


def mixed_commits(study: Study, runs: dict) -> list[str]:
    """The code the study's own records ran under (the ``src/`` tree of their commits, or from a wheel the capo-trl
    version), when there is more than one and its file allows none."""
    def code(record):
        return str(record.get("src_tree") or (f"capo-trl {record['capo_trl']}" if record.get("capo_trl") else None))

    trees = sorted({code(runs[arm][seed]) for arm, seed in study.own_runs() if seed in runs[arm]})
    return trees if len(trees) > 1 and not study.other_commits else []


def status(study: Study, into=None) -> str:
    unfrozen = "no commit (its protocol named none)" if study.cannot_run else "nothing yet (capo-trl study start)"
    lines = [f"{study.name} ({study.kind}): {study.question}",
             f"frozen at {study.frozen_commit or unfrozen}; deadline {study.deadline or 'none'}"]
    if study.cannot_run:
        lines.append(f"capo-trl study cannot run it: {' '.join(study.cannot_run.split())}")
    if study.kind == "measurement":
        return "\n".join(lines + [f"  {arm}: {'measured' if study.record_path(arm, None, into).is_file() else 'missing'}"
                                   for arm in study.arms])
    runs = records(study, into)
    for arm in study.arms:
        spec = study.reuse.get(arm)
        which = "" if spec is None or "seeds" not in spec else f"seeds {', '.join(map(str, spec['seeds']))} "
        origin = f" ({which}reused from {spec['folder']})" if spec else ""
        lines.append(f"  {arm}: {len(runs[arm])} of {len(study.seeds)} seeds{origin}")
    complete = [s for s in study.seeds if all(s in runs[a] for a in study.arms)]
    lines.append(f"complete seeds: {len(complete)} of {len(study.seeds)}")
    if mixed := mixed_commits(study, runs):
        lines.append(f"WARNING: records from several commits {mixed}; the study refuses to mix them")
    return "\n".join(lines)


def drifted(record: dict, plan) -> bool:
    """A run drifted: a training-log window in which every completion ran to the limit, or collapsed at test."""
    stuck = any(x.get("completions/clipped_ratio", 0.0) >= 1.0 for x in record.get("train", []))
    return stuck or confirmatory.collapsed(record, plan)


def screen(study: Study, runs: dict) -> dict:
    """A pilot's decision rule over its records (every run finished), per arm and seed and overall."""
    rule = study.decision
    ref = rule["reference"]
    per = {arm: {s: {"drifted": drifted(r, study.plan), "collapsed": confirmatory.collapsed(r, study.plan),
                     **{k: r.get(k) for k in ("accuracy", *rule["rank_by"])}}
                 for s, r in runs[arm].items()} for arm in study.arms}
    arms = {}
    for arm in rule["candidates"]:
        diffs = [runs[arm][s]["accuracy"] - runs[ref][s]["accuracy"] for s in study.seeds]
        mean, low, high = paired_interval(diffs)
        means = {k: float(np.mean([_value(runs[arm][s].get(k), study) for s in study.seeds])) for k in rule["rank_by"]}
        drift = sum(per[arm][s]["drifted"] for s in study.seeds)
        arms[arm] = {"drifted_runs": drift, "accuracy_minus_reference": [mean, low, high], "means": means,
                     "qualifies": drift == 0 and mean >= -rule["max_accuracy_loss"],
                     "rank": sum(means.values())}
    ok = [a for a in rule["candidates"] if arms[a]["qualifies"]]
    pick = max(ok, key=lambda a: (arms[a]["rank"], -rule["candidates"].index(a))) if ok else None
    reference = {k: float(np.mean([_value(runs[ref][s].get(k), study) for s in study.seeds]))
                 for k in ("accuracy", *rule["rank_by"])}
    return {"per_seed": per, "arms": arms, "reference": reference, "pick": pick}


def _value(v, study: Study) -> float:
    """An endpoint's value; an undefined AUROC (None) counts as the file says, else NaN."""
    if v is None:
        return study.plan.undefined_auroc if study.plan.undefined_auroc is not None else math.nan
    return float(v)


def report(study: Study, into=None) -> str:
    """The study's report as markdown: progress only before its look; then what the file's analysis fixes."""
    if study.kind == "measurement":
        return "A measurement: no runs and no analysis (its files are as its page describes them).\n"
    runs = records(study, into)
    if mixed := mixed_commits(study, runs):
        raise UsageError(f"{study.name}: its records ran under several versions of src/ {mixed}; a study does not mix them "
                         "(rerun the odd ones with the frozen capo-trl, or say in study.yaml's other_commits why they "
                         "may be mixed).")
    if study.kind == "confirmatory":
        config = {"seeds": study.seeds}
        found = confirmatory.analyse(study.folder, study.plan, loaded=(config, runs))
        return confirmatory.render(found, study.plan)
    done = sum(len(r) for r in runs.values())
    total = len(study.arms) * len(study.seeds)
    head = f"Runs finished: {done} of {total} (" + ", ".join(f"`{a}` {len(r)}" for a, r in runs.items()) + ")."
    if study.criterion is not None:
        head += "\n\n" + render_checks(checks(study, runs), study)
    if done < total or study.decision is None:
        why = "no decision rule in study.yaml" if study.decision is None else "the pilot's look is when all have run"
        return head + ("\n" if study.criterion is not None else f"\n\nNo result yet: {why}.\n")
    return head + "\n\n" + render_screen(screen(study, runs), study)


def render_checks(result: dict, study: Study) -> str:
    """The criterion's checks per run (as each finishes), then which arms meet it and the decisions."""
    names = list(study.criterion["checks"]) + (["required_met"] if study.criterion.get("required") else [])
    lines = [f"Criterion (fixed in study.yaml before the runs), each run against the start model "
             f"(`{study.criterion['start']}`):", "", "| arm | seed | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for arm, by_seed in result["runs"].items():
        for seed, row in sorted(by_seed.items()):
            lines.append(f"| {arm} | {seed} | " + " | ".join("yes" if row[k] else "no" for k in names) + " |")
    if study.criterion.get("required"):
        lines += ["", "Meets the criterion (every seed run and meeting it): "
                  + ", ".join(f"`{arm}` {'yes' if met else 'not yet' if not result['complete'][arm] else 'no'}"
                              for arm, met in result["meets"].items()) + "."]
    if result["decided"]:  # None until every checked run has finished; {} for a criterion without decisions
        lines += ["", "Decisions: " + ", ".join(f"{name} {'yes' if v else 'no'}" for name, v in result["decided"].items())
                  + "."]
    return "\n".join(lines) + "\n"


def render_screen(result: dict, study: Study) -> str:
    rule = study.decision
    keys = ["accuracy", *rule["rank_by"]]
    lines = ["Per run (exploratory): drifted = a training-log window in which every completion ran to the limit, "
             "or collapsed at test.", "", "| arm | seed | drifted | " + " | ".join(keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for arm, by_seed in result["per_seed"].items():
        for seed, row in sorted(by_seed.items()):
            cells = ["n/a" if row[k] is None else f"{row[k]:.3f}" for k in keys]
            lines.append(f"| {arm} | {seed} | {'yes' if row['drifted'] else 'no'} | " + " | ".join(cells) + " |")
    lines += ["", f"Decision rule (fixed in study.yaml before the runs): against `{rule['reference']}` (means "
              + ", ".join(f"{k} {v:.3f}" for k, v in result["reference"].items()) + "):", "",
              "| candidate | drifted runs | accuracy minus reference [95% t interval] | "
              + " | ".join(f"mean {k}" for k in rule["rank_by"]) + " | qualifies |",
              "|---|---|---|" + "---|" * len(rule["rank_by"]) + "---|"]
    for arm, a in result["arms"].items():
        m, lo, hi = a["accuracy_minus_reference"]
        lines.append(f"| {arm} | {a['drifted_runs']} of {len(study.seeds)} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                     + " | ".join(f"{a['means'][k]:.3f}" for k in rule["rank_by"])
                     + f" | {'yes' if a['qualifies'] else 'no'} |")
    pick = result["pick"]
    lines += ["", f"**Pick: `{pick}`**." if pick else "**No arm qualifies**: none is picked."]
    return "\n".join(lines) + "\n"


def run_seconds(record: dict) -> tuple[float, float] | None:
    """A record's (training, test) wall seconds: every training attempt summed (a resumed run paid each), or None
    when its runner kept no times. One thread each, so core-seconds."""
    if "train_s" not in record or "test_s" not in record:
        return None
    train = record["train_s"]
    return float(sum(train) if isinstance(train, list) else train), float(record["test_s"])


def render_cost(study: Study, into=None) -> str:
    """What a run of each arm cost, as its records measured it: the sentence a study's page states."""
    runs = records(study, into)
    parts, seconds = [], 0.0
    for arm in study.own_arms():
        times = [t for t in map(run_seconds, runs[arm].values()) if t is not None]
        seconds += sum(a + b for a, b in times)
        if not times:
            continue
        total = sorted((a + b) / 60 for a, b in times)
        train = float(np.median([a for a, _ in times])) / 60
        test = float(np.median([b for _, b in times])) / 60
        parts.append(f"`{arm}` {float(np.median(total)):.0f} core-minutes (training {train:.0f}, test {test:.0f}; "
                     f"{total[0]:.0f} to {total[-1]:.0f} over {len(times)} runs)")
    if not parts:
        return ("Cost per run: not measured; no record of this study holds its run's time (its runner did not keep "
                "it).\n")
    hours = seconds / 3600
    return (f"Cost per run, as the records measured it (wall time of one thread, as the runner kept it; the machines "
            f"and their loads varied): {'; '.join(parts)}. All of this study's runs: {hours:.1f} core-hours.\n")
