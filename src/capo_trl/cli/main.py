"""The ``capo-trl`` command: one argparse subcommand per task.

Adding a subcommand: write ``add_<name>_parser(subparsers)``, which creates the subparser and
sets ``func`` (a ``run_<name>(args) -> int``), and append the adder to :data:`SUBCOMMANDS`.
Keep heavy work (model loading, module imports beyond the package) inside ``run_*``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..data import arithmetic, benchmarks as data


# ------------------------------------------------------------------------------------ eval
# (the helpers up to add_eval_parser are shared by eval, demo, compare and calibrate-mask)
def _one_line(run):
    """Every UsageError of ``run`` on one line (a message may quote a multi-line library error)."""
    import functools

    @functools.wraps(run)
    def wrapped(args) -> int:
        from ..errors import UsageError

        try:
            return run(args)
        except UsageError as err:
            text = " ".join(str(err).split())
            if text == str(err):
                raise
            raise UsageError(text) from err

    return wrapped


def _quiet(args) -> None:
    """--no_progress also hides the progress bars of datasets (file loading) and transformers (weights)."""
    if getattr(args, "no_progress", False):
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()


def _role_name(text: str) -> str:
    """``--column ROLE=NAME`` (an argparse type: a malformed pair is an argparse error, exit 2)."""
    try:
        data.parse_column(text)
    except data.BenchmarkError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return text


_TEMPLATES = sorted(data.PROMPT_TEMPLATES)
_TEMPLATE_HELP = (f"prompt template (default: {data.DEFAULT_TEMPLATE}; {data.BENCHMARKS['arithmetic'].template} for "
                  "arithmetic)")


def _add_data_args(p) -> None:
    p.add_argument("--split", default=None, help="dataset split (default: the benchmark's)")
    p.add_argument("--column", action="append", default=[], type=_role_name, metavar="ROLE=NAME",
                   help=f"column mapping for the {'/'.join(data.ROLES)} roles, e.g. --column problem=question")


def _at_least(value, flag: str, minimum: int = 1, what: str = "") -> None:
    from ..errors import UsageError

    if value is not None and value < minimum:
        raise UsageError(f"{flag} must be >= {minimum}{f' ({what})' if what else ''}, got {value}.")


def _load_problems(name: str, columns: list[str], **kwargs):
    """load_benchmark of ``--column`` pairs, with the CLI's spelling of a column mapping in its hint."""
    try:
        return data.load_benchmark(name, columns=data.parse_columns(columns, "--column"), **kwargs)
    except data.BenchmarkError as err:
        if "columns=" in str(err) and "--column" not in str(err):
            raise data.BenchmarkError(f"{err} On the command line: --column ROLE=NAME, e.g. --column "
                                      "problem=question.") from err
        raise


def _check_device(device: str | None) -> None:
    if device is None:
        return
    import torch

    from ..errors import UsageError

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise UsageError(f"--device {device!r} is not a device ({err}); use e.g. cpu, cuda or cuda:1.") from err
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UsageError(f"--device {device}: no such CUDA device here ({torch.cuda.device_count()} visible); use "
                         "--device cpu, or another index.")


def add_eval_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="sample N answers per problem; report accuracy, scaling and calibration",
        description="Sample --n completions per problem, grade them with the math reward, and write "
                    "report.json (metrics), samples.csv (one row per completion) and, with --plots, "
                    "precision-coverage and reliability PNGs to --out (a new or empty directory, or "
                    "--overwrite).",
    )
    p.add_argument("--model", required=True, help="model directory (or hub id, with network)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    p.add_argument("--benchmark", required=True,
                   help=f"registered name ({', '.join(sorted(data.BENCHMARKS))}) or a local "
                        f"{'/'.join(data.LOCAL_SUFFIXES)} file")
    _add_data_args(p)
    p.add_argument("--template", default=None, choices=_TEMPLATES, help=_TEMPLATE_HELP)
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N problems only")
    p.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    p.add_argument("--ks", type=int, nargs="+", default=None, help="k values of pass@k / maj@k (default 1,2,4..n)")
    p.add_argument("--max_new_tokens", type=int, default=1024,
                   help="most tokens sampled per completion (default 1024)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling and log-prob temperature (0: greedy)")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling, in (0, 1] (1: off)")
    p.add_argument("--top_k", type=int, default=0, help="0 disables top-k")
    p.add_argument("--batch_size", type=int, default=64, help="sequences per generate() call")
    p.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same samples (default 0)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"],
                   help="generation engine: transformers (any device) or vllm (CUDA, pip install 'capo-trl[vllm]')")
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--out", required=True, help="output directory (new or empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing a previous report there (other files are kept)")
    p.add_argument("--plots", action="store_true", help="also write PNG plots")
    p.add_argument("--calibrate_on", default=None, metavar="SPLIT_OR_FILE",
                   help="fit a map s -> P(correct) on this split of --benchmark (or a local file), sampled the same "
                        "way, and report ECE/Brier before and after on the evaluated problems; writes calibrator.json")
    p.add_argument("--calibration", default="platt", choices=["temperature", "platt", "isotonic"],
                   help="the map --calibrate_on fits (default platt)")
    p.add_argument("--calibrate_limit", type=int, default=None, help="use the first N calibration problems only")
    p.add_argument("--target_precision", type=float, default=None, metavar="P",
                   help="with --calibrate_on: choose there the abstention threshold on s whose precision is >= P "
                        "with 95%% confidence (bounded by question), and report its coverage and precision on the "
                        "evaluated problems")
    p.add_argument("--no_progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=run_eval)


_EVAL_FLAGS = {"n": "--n", "ks": "--ks", "temperature": "--temperature", "top_p": "--top_p", "top_k": "--top_k",
               "max_new_tokens": "--max_new_tokens", "batch_size": "--batch_size", "backend": "--backend"}


@_one_line
def run_eval(args) -> int:
    import importlib.util

    from ..evaluation import evaluate as evaluation
    from ..errors import UsageError, check_model_path, check_output_dir

    _quiet(args)
    # Everything is checked before the model loads: numbers, device, output, data, model path.
    ks = evaluation.check_settings(n=args.n, ks=args.ks, temperature=args.temperature, top_p=args.top_p,
                                   top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                   backend=args.backend, names=_EVAL_FLAGS)
    _at_least(args.limit, "--limit", what="problems to evaluate")
    if args.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UsageError("--backend vllm needs vLLM, which is not installed: pip install 'capo-trl[vllm]' (CUDA "
                         "only), or use --backend transformers.")
    _check_device(args.device)
    _at_least(args.calibrate_limit, "--calibrate_limit", what="calibration problems")
    if args.target_precision is not None and (args.calibrate_on is None or not 0 < args.target_precision < 1):
        raise UsageError("--target_precision needs --calibrate_on (the threshold is chosen there) and a value in "
                         f"(0, 1), got {args.target_precision}.")
    out = check_output_dir(args.out, args.overwrite)
    problems = _load_problems(args.benchmark, args.column, split=args.split, limit=args.limit,
                              template=args.template)
    calibration = None
    if args.calibrate_on is not None:  # a local file, else a split of --benchmark
        is_file = Path(args.calibrate_on).expanduser().is_file()
        calibration = _load_problems(args.calibrate_on if is_file else args.benchmark, args.column,
                                     split=None if is_file else args.calibrate_on, limit=args.calibrate_limit,
                                     template=args.template)
    check_model_path(args.model, "--model")
    if args.tokenizer is not None and not Path(args.tokenizer).expanduser().is_dir():
        check_model_path(args.tokenizer, "--tokenizer")
    result = evaluation.evaluate(
        args.model, args.tokenizer, problems, n=args.n, ks=ks, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        backend=args.backend, seed=args.seed, progress=not args.no_progress, device=args.device,
        calibrate_on=calibration, calibration=args.calibration, target_precision=args.target_precision,
    )
    paths = result.save(out, plots=args.plots)
    print(f"{args.benchmark}: {len(problems)} problems x {args.n} samples, temperature {args.temperature}")
    print(result.table())
    if calibration is not None:
        print(f"calibrated on {args.calibrate_on} ({len(calibration)} problems, {args.calibration}): ECE "
              f"{result.metrics['ece']:.4f} -> {result.metrics['ece_calibrated']:.4f}, Brier {result.metrics['brier']:.4f} "
              f"-> {result.metrics['brier_calibrated']:.4f}")
    if args.target_precision is not None:
        m, bound = result.metrics, result.config["selective_bound"]
        if not math.isfinite(m["selective/threshold"]):
            from ..evaluation.certify import advice

            print(f"no threshold meets precision >= {args.target_precision} at 95% confidence on the calibration split "
                  f"(bound by {bound}): always abstain; {advice(args.target_precision, len(calibration))}")
        else:
            print(f"answer only where s >= {m['selective/threshold']:.4f} (P(correct) >= "
                  f"{m['selective/probability']:.4f}; chosen for precision >= {args.target_precision} at 95% "
                  f"confidence, bound by {bound}): coverage {m['selective/coverage']:.4f}, precision "
                  f"{m['selective/precision']:.4f} [{m['selective/precision_ci_low']:.4f}, "
                  f"{m['selective/precision_ci_high']:.4f}] on {m['selective/n_answered']} answered samples of "
                  f"{m['selective/n_questions']} questions")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


# ------------------------------------------------------------------------------------ demo / compare
def _add_budget_args(p, steps: int, test_problems: int) -> None:
    from ..data.tasks import DEFAULT_TASK, TASKS

    p.add_argument("--task", default=DEFAULT_TASK, metavar="TASK",
                   help=f"embedded task: {'; '.join(f'{t.name}: {t.summary}' for t in TASKS.values())} "
                        f"(default {DEFAULT_TASK})")
    p.add_argument("--model", default=None, help="model directory (default: the task's start model)")
    p.add_argument("--steps", type=int, default=steps, help=f"RL steps per run (default {steps})")
    p.add_argument("--test_problems", type=int, default=test_problems, help="test-split problems to evaluate")
    p.add_argument("--test_samples", type=int, default=8, help="samples per test problem")
    p.add_argument("--grader_noise", type=float, default=0.0, help="fraction of rewards flipped (mask ablations)")
    p.add_argument("--no_progress", action="store_true", help="hide progress bars")


def _budget(args, **extra):
    from ..harness.presets import Budget

    fields = dict(steps=args.steps, test_problems=args.test_problems, test_samples=args.test_samples,
                  grader_noise=args.grader_noise, task=args.task, model=args.model, progress=not args.no_progress, **extra)
    return Budget(**{k: v for k, v in fields.items() if v is not None})


def add_demo_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="train CAPO on the embedded default and show calibration before/after (CPU, minutes)",
        description="Trains the `capo` preset on the embedded arithmetic task with the embedded tiny model, then "
                    "prints accuracy, pooled and per-question AUROC and ECE on the test split before and after.",
    )
    _add_budget_args(p, steps=200, test_problems=256)
    p.add_argument("--method", default="capo",
                   help="one method: a preset, optionally amended, e.g. capo:tau=0.5 (see `capo-trl compare --help`)")
    p.add_argument("--plot", default="runs/demo.png", metavar="PNG",
                   help="where to write the picture: reliability before/after and validation AUROC over steps "
                        "(default runs/demo.png; replaced if there)")
    p.set_defaults(func=run_demo)


@_one_line
def run_demo(args) -> int:
    from ..harness.demo import demo

    _quiet(args)
    plot = Path(args.plot)
    if plot.suffix.lower() != ".png" or plot.is_dir():
        from ..errors import UsageError

        raise UsageError(f"--plot {args.plot}: give a file name ending in .png.")
    demo(_budget(args, val_every=max(1, args.steps // 2), val_problems=32), method=args.method, plot=plot)
    return 0


class _PresetsHelp(argparse.HelpFormatter):
    """Writes the preset names into a help text when it is printed: building the parser imports no harness."""

    def add_text(self, text):
        if text and "{presets}" in text:
            from ..harness.presets import PRESETS

            text = text.replace("{presets}", ", ".join(sorted(PRESETS)))
        super().add_text(text)


def add_compare_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="train several methods side by side on identical data, seeds and budget",
        formatter_class=_PresetsHelp,
        description="Every method is a preset of CAPOConfig overrides, optionally amended with :field=value "
                    "(presets: {presets}); all are checked before anything trains. Writes "
                    "DIR/report.md, metrics.csv, final.csv, summary.json, val_curves.png and precision_coverage.png, "
                    "and each finished run at once to DIR/runs/<method>-seed<k>/result.json: rerunning the same "
                    "command on the same DIR resumes an interrupted comparison (only missing runs train).",
    )
    p.add_argument("--methods", default="grpo,capo", help="comma-separated, e.g. grpo,capo,capo:tau=0.5")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds per method")
    p.add_argument("--first_seed", type=int, default=0, help="seeds are first-seed .. first-seed + seeds - 1")
    p.add_argument("--out", required=True,
                   help="output directory: new, empty, or one this command wrote (resumed)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a non-empty --out: forget its saved runs (other files are kept)")
    p.add_argument("--val_every", type=int, default=25, help="validation every N steps")
    p.add_argument("--val_problems", type=int, default=64, help="validation problems per validation (default 64)")
    p.add_argument("--val_samples", type=int, default=4, help="samples per validation problem (default 4)")
    p.add_argument("--learning_rate", type=float, default=None,
                   help="learning rate of every run (default: the training budget's, capo_trl.defaults)")
    _add_budget_args(p, steps=200, test_problems=256)
    p.set_defaults(func=run_compare)


@_one_line
def run_compare(args) -> int:
    from ..harness.compare import compare
    from ..harness.presets import parse_methods

    _quiet(args)
    methods = parse_methods(args.methods)
    budget = _budget(args, val_every=args.val_every, val_problems=args.val_problems, val_samples=args.val_samples,
                     learning_rate=args.learning_rate)
    summary = compare(methods, args.seeds, args.out, budget, first_seed=args.first_seed, overwrite=args.overwrite)
    print((Path(args.out) / "report.md").read_text())
    return 0 if summary else 1


def add_calibrate_mask_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate-mask", help="measure tau and the noise-mask thresholds for a reference model",
        description="Samples the reference model on training prompts and prints the paper's quartile-rule "
                    "ref_high/ref_low, the within-group spread of the score s (a suggested absolute tau), and "
                    "the reference's own AUROC (is it calibrated enough for the mask to mean anything?). "
                    "Exits 1, writing nothing, when a value cannot be measured on the sample.",
    )
    p.add_argument("--model", default=None, help="reference model directory (default: the embedded model)")
    p.add_argument("--benchmark", default="arithmetic-train",
                   help="training prompts: a registered name or a local file (default: the arithmetic train split)")
    _add_data_args(p)
    p.add_argument("--limit", type=int, default=128, help="number of prompts")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (the group size you train with; >= 2)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: 48 for arithmetic, else 1024")
    p.add_argument("--template", default=None, choices=_TEMPLATES, help=_TEMPLATE_HELP)
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--write_config", default=None, metavar="YAML",
                   help="write the recommended CAPO configuration (docs/config.md) with the measured tau, ref_high "
                        "and ref_low into this YAML recipe (created if missing; only those lines change, comments "
                        "are kept)")
    p.set_defaults(func=run_calibrate_mask)


@_one_line
def run_calibrate_mask(args) -> int:
    from ..errors import UsageError, check_model_path
    from ..harness import calibrate_mask as harness

    _at_least(args.limit, "--limit", what="number of prompts")
    _at_least(args.n, "--n", what="samples per prompt")
    _at_least(args.max_new_tokens, "--max_new_tokens")
    if args.n == 1:
        raise UsageError("--n 1 gives no within-group spread, tau cannot be measured: use --n >= 2 (the group size "
                         "you train with).")
    _check_device(args.device)
    if args.model is not None:
        check_model_path(args.model, "--model")
    path = Path(args.write_config) if args.write_config else None
    text = harness.read_recipe(path) if path else None
    embedded_task = args.benchmark == "arithmetic-train"
    if embedded_task:
        for flag, value in (("--split", args.split), ("--column", args.column)):
            if value:
                raise UsageError(f"{flag} does not apply to arithmetic-train (the embedded task's train split); for "
                                 "another split use --benchmark arithmetic --split NAME.")
        problems = arithmetic.arithmetic_dataset("train", args.limit)
    else:
        problems = _load_problems(args.benchmark, args.column, split=args.split, limit=args.limit,
                                  template=args.template)
    max_new = args.max_new_tokens or (48 if embedded_task else 1024)
    report = harness.calibrate_mask(args.model or arithmetic.embedded_model_path(), None, problems, n=args.n,
                                    max_new_tokens=max_new, device=args.device)
    for key, value in report.items():
        print(f"{key:>22}: {value}")
    reasons = harness.unmeasured(report)
    if reasons:
        tail = f"; nothing written to {path}" if path else ""
        for reason in reasons:
            print(f"capo-trl calibrate-mask: {reason}{tail}", file=sys.stderr)
        return 1
    for caveat in harness.caveats(report):
        print(f"capo-trl calibrate-mask: warning: {caveat}", file=sys.stderr)
    if path:
        values = harness.recipe_values(report)
        updated = harness.update_recipe(text, values, path)
        try:
            path.write_text(updated, encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--write_config {path}: cannot write it ({err.strerror}); give a writable path.") from err
        print(f"wrote {', '.join(values)} to {path}")
    return 0


# ------------------------------------------------------------------------------------ train
def add_train_parser(subparsers) -> None:
    # Every argument after `train` goes to TRL's TrlParser (src/capo_trl/train.py), which owns --help,
    # --config and several hundred fields: prefix_chars="+" stops argparse from reading them as its options.
    p = subparsers.add_parser(
        "train", help="train CAPO (or GRPO) from a YAML recipe and flags: every CAPOConfig/ModelConfig field",
        description="capo-trl train [--config RECIPE.yaml] [--field value ...] [--accelerate_config NAME|PATH "
                    "[--num_processes N]]; see `capo-trl train --help`.",
        add_help=False, prefix_chars="+",
    )
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="--config RECIPE.yaml and field overrides")
    p.set_defaults(func=run_train)


def run_train(args) -> int:
    from .launch import launch, wants_launch

    if wants_launch(args.train_args):  # --accelerate_config: N processes, each running this command
        return launch(args.train_args)
    from .train import parse_args, run_and_end

    try:
        parsed = parse_args(args.train_args)  # a bad recipe or flag is a clean error, not a traceback
    except ValueError as err:
        print(f"capo-trl train: {' '.join(str(err).split())}", file=sys.stderr)  # one line, whatever it quotes
        return 2
    run_and_end(*parsed)
    return 0


# ------------------------------------------------------------------------------------ dispatcher

SUBCOMMANDS = [add_eval_parser, add_demo_parser, add_compare_parser, add_calibrate_mask_parser, add_train_parser]


class _Parser(argparse.ArgumentParser):
    """TRL's flag style (``--max_new_tokens``) for every subcommand; the hyphenated spelling
    (``--max_new_tokens``) of earlier releases is still accepted, for one release."""

    def add_argument(self, *names, **kwargs):
        spelled = []
        for name in names:
            if name.startswith("--") and ("-" in name[2:] or "_" in name[2:]):
                spelled += ["--" + name[2:].replace("-", "_"), "--" + name[2:].replace("_", "-")]
            else:
                spelled.append(name)
        return super().add_argument(*dict.fromkeys(spelled), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ``capo-trl`` parser with every subcommand of :data:`SUBCOMMANDS` (also used to test the CLI)."""
    from .. import __version__

    parser = _Parser(prog="capo-trl", description="Calibration-Aware Policy Optimization for TRL.")
    parser.add_argument("--version", action="version", version=f"capo-trl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``capo-trl`` command; returns the exit status (callable from Python and tests)."""
    args = build_parser().parse_args(argv)
    from ..errors import UsageError

    try:
        return args.func(args)
    except UsageError as err:  # bad input: one line naming what to fix, no traceback
        print(f"capo-trl {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
