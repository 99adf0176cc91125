"""``capo-trl study``: a pre-registered comparison's life, from its file (``docs/studies.md``).

    capo-trl study plan FOLDER --sd 0.05        # seeds from a power calculation
    capo-trl study check FOLDER                 # can its arms learn? (start and queue check it too)
    capo-trl study start FOLDER                 # freeze what its runs depend on into study.yaml (clean tree only)
    capo-trl study run FOLDER ARM SEED          # one run: train (resumes), test, keep its record
    capo-trl study queue FOLDER --slots 2       # every missing run, seed-major, N at a time
    capo-trl study status FOLDER                # what has finished
    capo-trl study report FOLDER                # the analysis, at its look (nothing before)
    capo-trl study close FOLDER                 # at the deadline: the analysis takes the seeds complete now
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import one_line

VERBS = ("plan", "check", "start", "run", "queue", "status", "report", "close")


def add_study_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "study", help="run a pre-registered comparison from its study.yaml: plan, start, run, queue, status, "
                      "report, close", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, help="what to do with the study")
    helps = {"plan": "seeds from a power calculation (a pilot's SD of the paired differences)",
             "check": "refuse a study whose arms cannot learn (the model, the prompts, the start model's groups)",
             "start": "check it, then freeze what its runs depend on: the commit, capo-trl's version, the recipes",
             "run": "one run of one arm and seed: train (resuming), test, keep the record",
             "queue": "every missing run, seed-major, --slots at a time (one thread each)",
             "status": "what has finished", "report": "the analysis the file fixes, at its look",
             "close": "at the deadline: end the study with the seeds complete now"}
    for verb in VERBS:
        v = verbs.add_parser(verb, help=helps[verb], description=helps[verb], allow_abbrev=False)
        v.add_argument("folder", type=Path, help="the study's folder (holds study.yaml)")
        if verb == "run":
            v.add_argument("arm", help="an arm of study.yaml that this study runs")
            v.add_argument("seed", type=int, help="one of study.yaml's seeds")
        if verb in ("check", "start", "run", "queue"):
            v.add_argument("--runs", type=Path, default=Path("runs"), help="where runs' folders go (default runs/)")
        if verb in ("run", "queue"):
            v.add_argument("--into", type=Path, default=None,
                           help="where records are written (default: the study's folder)")
        if verb == "queue":
            v.add_argument("--slots", type=int, default=2, help="runs at a time, one thread each (default 2)")
            v.add_argument("--on_record", default=None,
                           help="a shell command run after each record is written, given its path as $STUDY_RECORD")
        if verb in ("status", "report"):
            v.add_argument("--into", type=Path, default=None, help="where the records are (default: the folder)")
        if verb == "plan":
            v.add_argument("--sd", type=float, required=True, help="SD of the paired differences (from a pilot)")
            v.add_argument("--effect", type=float, required=True, help="the true difference to detect")
            v.add_argument("--power", type=float, default=0.8, help="the power wanted (default 0.8)")
            v.add_argument("--alpha", type=float, default=0.05, help="alpha of the test (default 0.05)")
            v.add_argument("--one_sided", action="store_true",
                           help="a one-sided test in the effect's direction (a replication of a direction found)")
            v.add_argument("--min_seeds", type=int, default=12, help="never fewer seeds (default 12)")
            v.add_argument("--max_seeds", type=int, default=48, help="never more seeds (default 48)")
    p.set_defaults(func=run_study)


@one_line
def run_study(args) -> int:
    from ..errors import UsageError
    from ..harness import study, study_freeze, study_report
    from . import study_check, study_run

    if args.verb == "plan":
        return _plan(args)
    spec = study.load_study(args.folder)
    if args.verb in ("check", "start", "run", "queue"):
        study.refuse_unrunnable(spec, args.verb)
    if args.verb in ("run", "queue"):
        src = study_freeze.frozen_code(spec, args.runs)
        if src is not None:  # this checkout is another commit, but holds the frozen one: run from that
            return _run_frozen(args, src)
        study_freeze.check_code(spec)
    if args.verb in ("check", "start", "run", "queue"):
        study_check.check(spec, args.runs, log=lambda text: print(text, flush=True))
    if args.verb == "check":
        return 0
    if args.verb == "start":
        frozen = study_freeze.start(spec)
        print(f"frozen at {frozen['commit']} with capo-trl {frozen['capo_trl']}; commit study.yaml now")
        return 0
    if args.verb == "run":
        print(f"wrote {study_run.run_one(spec, args.arm, args.seed, args.runs, args.into)}")
    elif args.verb == "queue":
        if args.slots < 1:
            raise UsageError(f"--slots {args.slots}: run at least 1 at a time.")
        result = study_run.queue(spec, args.runs, args.slots, args.into, args.on_record,
                                 log=lambda text: print(text, flush=True))
        print(f"finished {len(result['finished'])}, failed {len(result['failed'])}")
        return 1 if result["failed"] else 0
    elif args.verb == "status":
        print(study_report.status(spec, args.into))
    elif args.verb == "report":
        print(study_report.report(spec, args.into), end="")
    else:
        from ..harness.confirmatory import close

        if spec.kind != "confirmatory":
            raise UsageError(f"{spec.folder}: close ends a confirmatory study at its deadline; a {spec.kind} "
                             + ("ends when every run has finished." if spec.kind == "pilot" else "has no deadline "
                                "analysis: it reports what its runs measured."))
        try:
            print(close(spec.folder, spec.plan))
        except ValueError as err:
            raise UsageError(str(err)) from err
    return 0


def _run_frozen(args, src: Path) -> int:
    """This verb again, in a process that imports capo_trl from the frozen commit's ``src/``; its exit status."""
    import os
    import subprocess
    import sys

    argv = ["study", args.verb, str(args.folder)] + ([args.arm, str(args.seed)] if args.verb == "run" else [])
    argv += ["--runs", str(args.runs)] + (["--into", str(args.into)] if args.into else [])
    if args.verb == "queue":
        argv += ["--slots", str(args.slots)] + (["--on_record", args.on_record] if args.on_record else [])
    print(f"{args.folder}: running the capo-trl it was frozen with, from {src.parent}", file=sys.stderr, flush=True)
    path = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "capo_trl.cli", *argv], env={**os.environ, "PYTHONPATH": path}).returncode


def _plan(args) -> int:
    from ..errors import UsageError
    from ..harness.paired import t_power

    for name in ("sd", "effect"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name} {getattr(args, name)}: it must be > 0.")
    if not 0 < args.power < 1 or not 0 < args.alpha < 1 or not 2 <= args.min_seeds <= args.max_seeds:
        raise UsageError("--power and --alpha must be in (0, 1), and 2 <= --min_seeds <= --max_seeds.")
    table = {n: t_power(args.effect, args.sd, n, args.alpha, args.one_sided)
             for n in range(args.min_seeds, args.max_seeds + 1)}
    seeds = next((n for n, p in table.items() if p >= args.power), None)
    if seeds is None:
        print(f"no number of seeds up to {args.max_seeds} reaches power {args.power} (at {args.max_seeds}: "
              f"{table[args.max_seeds]:.2f}); raise --max_seeds or --effect")
        return 1
    print(f"{seeds} seeds: power {table[seeds]:.2f} for a true difference {args.effect} with SD {args.sd} of the "
          f"paired differences (paired t, {'one' if args.one_sided else 'two'}-sided alpha {args.alpha}); with twice "
          f"that SD: {t_power(args.effect, 2 * args.sd, seeds, args.alpha, args.one_sided):.2f}")
    print(_cost(args.folder, seeds))
    return 0


def _cost(folder: Path, seeds: int) -> str:
    """What ``seeds`` seeds of the study cost, from the first finished run of each arm it runs (its record's
    ``train_s``, every attempt, and ``test_s``: one thread each, so core-seconds)."""
    import json

    from ..harness.study import load_study

    from ..harness.study_report import run_seconds

    study = load_study(folder)
    each = {}
    for arm in study.own_arms():
        for seed in study.seeds:
            path = study.record_path(arm, seed)
            seconds = run_seconds(json.loads(path.read_text())) if path.is_file() else None
            if seconds is not None:
                each[arm] = (seed, sum(seconds))
                break
    missing = [arm for arm in study.own_arms() if arm not in each]
    if missing:
        return (f"cost: unknown until a run of each arm has finished ({', '.join(missing)} have none): run one "
                f"(capo-trl study run {folder} {missing[0]} {study.seeds[0]}) and plan again")
    hours = seeds * sum(s for _, s in each.values()) / 3600
    runs = ", ".join(f"{arm} seed {seed}: {s / 60:.0f} core-min" for arm, (seed, s) in each.items())
    return (f"cost: {hours:.1f} core-hours for {seeds} seeds x {len(each)} arms ({hours / 2:.1f} h on two slots), "
            f"from the first finished run of each arm ({runs})")
