"""The analysis of a pre-registered, group-sequential comparison by seed, as its study file fixes it in advance.

A study's folder holds its ``study.yaml`` (the plan: :class:`~capo_trl.harness.study.Plan`, read by
:func:`~capo_trl.harness.study.load_study`), ``start.json`` and one record per finished run. A test-bed study's
folder also holds ``config.json`` (the method labels the test-bed driver ran, in arm order). What the analysis
shows depends only on those files, so anyone re-renders it from a clone:

- before the first look, progress only (no endpoint is computed, so nobody peeks);
- at a look (the first ``looks[i][0]`` complete seeds, by seed number), the primary contrast's paired t
  test at that look's alpha with its interval, the sign-flip sensitivity test, then the secondaries with
  Holm's correction (confirmatory only if the primary holds), the safety endpoints and the descriptives;
- the study stops at the first look whose primary p is below its alpha, at ``max_seeds`` complete seeds,
  or when ``closed.json`` (written by ``close`` at the deadline) says so: then the last look is the final one,
  on every complete seed.

A study whose arms are harness presets runs through the test-bed driver (``python -m capo_trl.harness.testbed run
--out RUNS``), which names each run by its method's label; ``collect`` copies them into the study's folder under
the arms' names and ``restore`` puts them back (a study whose arms are recipes is run by ``capo-trl study``)::

    python -m capo_trl.harness.confirmatory collect --runs RUNS --into STUDY_FOLDER
    python -m capo_trl.harness.confirmatory restore --runs RUNS --into STUDY_FOLDER
    python -m capo_trl.harness.confirmatory report --into STUDY_FOLDER
    python -m capo_trl.harness.confirmatory close --into STUDY_FOLDER
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shutil
from pathlib import Path

import numpy as np

from .paired import holm, paired_test
from .study import Plan, load_study


def check_config(folder: Path, plan: Plan) -> dict:
    """The study's ``config.json``, refused unless it ran exactly the plan's arms in the plan's order."""
    config = json.loads((folder / "config.json").read_text())
    if config["methods"] != list(plan.arms.values()):
        raise ValueError(f"{folder}/config.json ran {config['methods']}, the plan's arms are "
                         f"{list(plan.arms.values())}; analyse it with the plan its protocol fixed.")
    return config


def _copy_runs(source: Path, target: Path, folders: dict) -> list[str]:
    """Copy ``config.json``, ``start.json`` and every ``<folder>/seed<k>.json`` of ``source`` into ``target``, each
    folder renamed by ``folders`` (source name -> target name); never overwrite. Returns what was new."""
    target.mkdir(parents=True, exist_ok=True)
    pairs = [(source / name, target / name, name) for name in ("config.json", "start.json")]
    pairs += [(path, target / to / path.name, f"{to}/{path.name}")
              for frm, to in folders.items() for path in sorted((source / frm).glob("seed*.json"))]
    new = []
    for frm, to, name in pairs:
        if frm.is_file() and not to.is_file():
            to.parent.mkdir(exist_ok=True)
            shutil.copy(frm, to)
            new.append(name)
    return new


def collect(runs: Path, into: Path, plan: Plan) -> list[str]:
    """Copy each finished run (``<label>/seed<k>.json``) into the study folder under its arm's name (a label holds
    characters a file name should not); never overwrite a copied run. Returns what was new."""
    check_config(runs, plan)
    return _copy_runs(runs, into, {label: arm for arm, label in plan.arms.items()})


def restore(into: Path, runs: Path, plan: Plan) -> list[str]:
    """The inverse of :func:`collect`: put the committed runs back where the runner looks for finished runs
    (``<label>/seed<k>.json``), so a study resumes on a fresh machine without redoing them; never overwrites."""
    check_config(into, plan)
    return _copy_runs(into, runs, dict(plan.arms))


def load(folder: Path, plan: Plan) -> tuple[dict, dict]:
    """The config and every finished run, ``runs[arm][seed]``."""
    config = check_config(folder, plan)
    runs = {arm: {s: json.loads((folder / arm / f"seed{s}.json").read_text()) for s in config["seeds"]
                  if (folder / arm / f"seed{s}.json").is_file()} for arm in plan.arms}
    return config, runs


AUROCS = ("auroc", "auroc_question")


def _count_undefined(runs: dict, plan: Plan) -> list[tuple]:
    """Set each undefined AUROC (None: the run's answers were of one class) to what the plan counts it as, in
    place; returns the (arm, seed, key) it set. A plan that does not say refuses, naming the run."""
    found = [(arm, s, k) for arm, by_seed in runs.items() for s, rec in by_seed.items() for k in AUROCS
             if k in rec and rec[k] is None]
    if found and plan.undefined_auroc is None:
        raise ValueError(f"undefined AUROC (one class only) in {found}: the protocol must say what it counts as "
                         "(Plan.undefined_auroc) before the analysis can run.")
    for arm, s, k in found:
        runs[arm][s][k] = plan.undefined_auroc
    return found


def collapsed(rec: dict, plan: Plan) -> bool:
    """The protocol's collapse rule for one finished run: its test answers too long, or too few of them ended."""
    return rec["mean_tokens"] >= plan.collapse_tokens or rec.get("finished_frac", 1.0) < plan.min_finished


def _contrast(runs, seeds, endpoint, arm, minus, confidence=0.95, flip=False, alternative="two-sided") -> dict:
    """``arm - minus`` by seed; the sign-flip test only where the protocol uses it (the primary's sensitivity)."""
    diffs = [runs[arm][s][endpoint] - runs[minus][s][endpoint] for s in seeds]
    return {"endpoint": endpoint, "arm": arm, "minus": minus, **paired_test(diffs, confidence, flip, alternative),
            "diffs": diffs}


def _looks(config: dict, runs: dict, plan: Plan, closed: bool) -> list[tuple[int, list, bool]]:
    """The looks the files have reached, in order: (index, its seeds, whether it is the final look)."""
    complete = [s for s in config["seeds"] if all(s in runs[arm] for arm in plan.arms)]
    looks = [(i, complete[:n], False) for i, (n, _) in enumerate(plan.looks[:-1]) if len(complete) >= n]
    if closed or len(complete) >= plan.max_seeds:
        looks.append((len(plan.looks) - 1, complete[:plan.max_seeds], True))
    return looks


def analyse(folder: Path, plan: Plan, loaded: tuple[dict, dict] | None = None) -> dict:
    """The analysis the protocol fixes, at the look the committed files have reached (``loaded``: the config's
    seeds and the runs, when a study file's records were read already; else the folder's ``config.json``)."""
    config, runs = loaded if loaded is not None else load(folder, plan)
    undefined = _count_undefined(runs, plan)
    closed_file = folder / "closed.json"
    closed = json.loads(closed_file.read_text()) if closed_file.is_file() else None
    out = {"finished": {arm: sorted(r) for arm, r in runs.items()}, "planned_seeds": config["seeds"],
           # safety, reported as runs finish (no endpoint): every finished run, complete seed or not
           "collapsed_finished": {arm: sorted(s for s, rec in r.items() if collapsed(rec, plan))
                                  for arm, r in runs.items()},
           "deadline": plan.deadline, "closed": closed, "look": None, "undefined": undefined}
    looks = _looks(config, runs, plan, closed is not None)
    if not looks:
        return out
    for index, seeds, final in looks:  # the first look whose primary holds stops the study: no later look is taken
        alpha = plan.looks[index][1]
        primary = _contrast(runs, seeds, *plan.primary, confidence=1 - alpha, flip=True, alternative=plan.alternative)
        holds = primary["p"] < alpha
        if holds:
            break
    secondary = [_contrast(runs, seeds, *c) for c in plan.secondaries]
    key, arm, minus = plan.primary  # sensitivity (amendment 1): the seeds where no primary value was undefined
    counted = {(a, s) for a, s, k in undefined if k == key and a in (arm, minus)}
    defined = [s for s in seeds if (arm, s) not in counted and (minus, s) not in counted]
    sensitivity = (_contrast(runs, defined, key, arm, minus) if counted and len(defined) >= 2 else None)
    adjusted = holm({i: c["p"] for i, c in enumerate(secondary)})
    for i, c in enumerate(secondary):
        c["holm_p"], c["rejected"] = adjusted[i], holds and adjusted[i] < plan.family_alpha
    ref = next(iter(plan.arms))
    safety = {k: {arm: _contrast(runs, seeds, k, arm, ref) for arm in list(plan.arms)[1:]} for k in plan.safety}
    collapse = {arm: [s for s in seeds if collapsed(runs[arm][s], plan)] for arm in plan.arms}
    keys = (plan.primary[0], *plan.safety, "guessable/modal_share", "mean_tokens", *plan.descriptive)
    # a key a task has no items for (the guessable ones of a plain task) is nan, not an error
    means = {arm: {k: float(np.mean([runs[arm][s].get(k, math.nan) for s in seeds])) for k in keys}
             for arm in plan.arms}
    incomplete = sorted({s for r in runs.values() for s in r} - set(seeds))
    stop = holds or final
    out.update(look={"index": index, "name": "final" if final or index == len(plan.looks) - 1 else "interim",
                     "alpha": alpha, "seeds": seeds, "incomplete_seeds": incomplete, "stop": stop,
                     "reason": ("efficacy" if holds and not final else "final look" if final else None)},
               primary={**primary, "holds": holds}, secondary=secondary, defined_only=sensitivity, confirmatory_secondaries=holds,
               safety=safety, collapse=collapse, means=means, mask=_mask_shares(runs, seeds),
               start={k: _start(folder).get(k, math.nan) for k in keys})
    return out


def _start(folder: Path) -> dict:
    """The start model's test metrics (``start.json``), empty when the study has none."""
    path = folder / "start.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _mask_shares(runs: dict, seeds: list) -> dict:
    """For each masked arm, the shares dropped in training: lucky guesses (correct answers to guessable items),
    true answers (correct, derivable) and wrong answers, summed over the look's seeds."""
    shares = {}
    for arm, by_seed in runs.items():
        counts: dict = {}
        for s in seeds:
            for k, v in by_seed[s].get("mask", {}).items():
                counts[k] = counts.get(k, 0) + v
        if not any(k.endswith("/dropped") for k in counts):
            continue

        def share(*parts):
            total = sum(v for k, v in counts.items() if all(p in k.split("/") for p in parts))
            dropped = sum(v for k, v in counts.items() if all(p in k.split("/") for p in (*parts, "dropped")))
            return dropped / total if total else math.nan
        shares[arm] = {"lucky guesses": share("guessable", "correct"), "true answers": share("derivable", "correct"),
                       "wrong answers": share("wrong")}
    return shares


def _iv(c: dict) -> str:
    return f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"


def _table(header: list, body: list) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in body)]


def _sides(plan: Plan) -> str:
    """How the primary is tested, in words."""
    if plan.alternative == "two-sided":
        return "two-sided"
    _, arm, minus = plan.primary
    return f"one-sided ({arm} - {minus} {'>' if plan.alternative == 'greater' else '<'} 0)"


def render(analysis: dict, plan: Plan) -> str:
    """The study's numbers as markdown, from :func:`analyse` only (its page renders this block)."""
    finished = analysis["finished"]
    lines = [f"Runs finished per arm (of {len(analysis['planned_seeds'])} planned seeds): "
             + ", ".join(f"`{arm}` {len(seeds)}" for arm, seeds in finished.items()) + "."]
    look = analysis["look"]
    if look is None:
        first = plan.looks[0][0]
        return "\n".join(lines + ["", f"No look yet: the first is at {first} complete seeds; until then no endpoint "
                                       "is computed."]) + "\n"
    p, n = analysis["primary"], len(look["seeds"])
    level = f"{100 * p['confidence']:.1f}%"
    state = (f"stopped for efficacy at the {look['name']} look" if look["reason"] == "efficacy" else
             "final look" if look["reason"] == "final look" else
             f"{look['name']} look passed without stopping; the study goes on to {plan.max_seeds} complete seeds")
    lines += ["", f"**Look: {look['name']}** ({state}), {n} complete seeds ({', '.join(map(str, look['seeds']))}), "
              f"{_sides(plan)} alpha {look['alpha']}."
              + (f" Finished runs of seeds {', '.join(map(str, look['incomplete_seeds']))} are not in this look."
                 if look["incomplete_seeds"] else ""), ""]
    sided = "" if plan.alternative == "two-sided" else "one-sided "
    lines += _table(["contrast", "endpoint", "mean", f"{level} {sided}t interval", f"{sided}paired t p",
                     f"{sided}sign-flip p",
                     "seeds above 0", "sd of the differences", "holds"],
                    [[f"{p['arm']} - {p['minus']} (primary)", p["endpoint"], f"{p['mean']:+.3f}",
                      f"[{p['low']:+.3f}, {p['high']:+.3f}]", f"{p['p']:.4f}", f"{p['flip_p']:.4f}",
                      f"{p['favour']} of {p['n']}", f"{p['sd']:.3f}", "yes" if p["holds"] else "no"]])
    if analysis["undefined"]:
        runs = ", ".join(f"`{arm}` seed {s} ({k})" for arm, s, k in analysis["undefined"])
        lines += ["", f"Undefined AUROCs (the run's answers of one class only), counted as {plan.undefined_auroc:g} "
                  f"as the protocol says: {runs}."]
        d = analysis.get("defined_only")
        if d is not None:
            lines += [f"Sensitivity, not a test of the protocol: {p['arm']} - {p['minus']} on the {d['n']} seeds "
                      f"where neither had an undefined {p['endpoint']}: {_iv(d)} (95% t interval, paired t p = "
                      f"{d['p']:.4f})."]
    if analysis["secondary"]:
        kind = "confirmatory" if analysis["confirmatory_secondaries"] else "exploratory (the primary does not hold)"
        lines += ["", f"Secondary contrasts, Holm's correction over the family of {len(analysis['secondary'])} "
                  f"(alpha {plan.family_alpha}), {kind}; mean [95% t interval]:", ""]
        lines += _table(["contrast", "endpoint", "mean [95% t interval]", "paired t p", "Holm p", "rejected"],
                        [[f"{c['arm']} - {c['minus']}", c["endpoint"], _iv(c), f"{c['p']:.4f}", f"{c['holm_p']:.4f}",
                          "yes" if c["rejected"] else "no"] for c in analysis["secondary"]])
    ref = next(iter(plan.arms))
    ended = f" or less than {plan.min_finished:g} of its samples finished" if plan.min_finished else ""
    lines += ["", f"Safety, against `{ref}`: mean [95% t interval]; collapse = mean completion length on the test "
              f"split >= {plan.collapse_tokens:g} tokens{ended}.", ""]
    lines += _table(["arm", *plan.safety, "collapsed runs"],
                    [[arm] + [_iv(analysis["safety"][k][arm]) if arm != ref else "(reference)" for k in plan.safety]
                     + [f"{len(analysis['collapse'][arm])} of {n}"] for arm in plan.arms])
    # a row or column with no number at all (no start.json; a kind of item the task lacks) is left out, not shown nan
    rows = {"start": analysis["start"], **analysis["means"]}
    rows = {name: row for name, row in rows.items() if not all(math.isnan(v) for v in row.values())}
    keys = [k for k in next(iter(analysis["means"].values())) if not all(math.isnan(r[k]) for r in rows.values())]
    lines += ["", "Means over the look's seeds (descriptive):", ""]
    lines += _table(["model", *keys], [[name] + [f"{row[k]:.3f}" for k in keys] for name, row in rows.items()])
    if analysis["mask"]:
        lines += ["", "Noise mask in training: share of completions dropped (the look's seeds):", ""]
        kinds = list(next(iter(analysis["mask"].values())))
        lines += _table(["arm", *kinds], [[arm] + [f"{v[k]:.3f}" for k in kinds] for arm, v in analysis["mask"].items()])
    return "\n".join(lines) + "\n"


def close(folder: Path, plan: Plan, now: datetime.datetime | None = None) -> dict:
    """At the deadline: record that the study ends with the seeds complete now (refused before the deadline)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if plan.deadline is None:
        raise ValueError("the study states no deadline (deadline: null), so it is not closed: it ends at "
                         f"{plan.max_seeds} complete seeds.")
    if now < datetime.datetime.fromisoformat(plan.deadline):
        raise ValueError(f"the deadline is {plan.deadline}; before it the study ends only at {plan.max_seeds} "
                         "complete seeds or when a look stops it.")
    record = {"closed_at": now.isoformat(timespec="seconds")}
    (folder / "closed.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("command", choices=("collect", "restore", "report", "close"))
    parser.add_argument("--into", type=Path, required=True, help="the study's folder (holds study.yaml)")
    parser.add_argument("--runs", type=Path, help="collect, restore: the folder `harness.testbed run --out` writes")
    args = parser.parse_args(argv)
    plan = load_study(args.into).plan
    if args.command in ("collect", "restore"):
        if args.runs is None:
            parser.error(f"{args.command} needs --runs (the folder `python -m capo_trl.harness.testbed run --out` writes)")
        moved = (collect(args.runs, args.into, plan) if args.command == "collect" else restore(args.into, args.runs, plan))
        print("\n".join(moved) or "nothing new")
    elif args.command == "close":
        print(close(args.into, plan))
    else:
        print(render(analyse(args.into, plan), plan), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
