"""``capo-trl demo``, ``compare`` and ``calibrate-mask``: the experiment harness from the command line
(:mod:`capo_trl.harness` is imported only inside the command that runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ..data import arithmetic
from .common import TEMPLATES, TEMPLATE_HELP, add_data_args, at_least, check_device, load_problems, one_line, quiet


# ------------------------------------------------------------------------------------ demo / compare
def _add_budget_args(p, steps: int | None, test_problems: int, steps_help: str | None = None,
                     task: str | None = None) -> None:
    from ..data.tasks import DEFAULT_TASK, TASKS

    task = task or DEFAULT_TASK
    p.add_argument("--task", "--dataset_name", default=task, metavar="TASK",
                   help=f"embedded task: {'; '.join(f'{t.name}: {t.summary}' for t in TASKS.values())} "
                        f"(default {task}; --dataset_name, capo-trl train's name, is accepted too)")
    p.add_argument("--model", "--model_name_or_path", default=None,
                   help="model directory or fetched short name (capo-trl fetch-model; default: the task's start "
                        "model; --model_name_or_path, capo-trl train's name, is accepted too)")
    p.add_argument("--steps", type=int, default=steps, help=f"RL steps per run (default {steps_help or steps})")
    p.add_argument("--test_problems", type=int, default=test_problems, help=f"test-split problems to evaluate (default {test_problems})")
    p.add_argument("--test_samples", type=int, default=8, help="samples per test problem (default 8)")
    p.add_argument("--grader_noise", type=float, default=0.0, help="fraction of rewards flipped (mask ablations; default 0: none)")
    p.add_argument("--no_progress", action="store_true", help="hide progress bars")


def _budget(args, **extra):
    from ..harness.presets import Budget

    fields = dict(steps=args.steps, test_problems=args.test_problems, test_samples=args.test_samples,
                  grader_noise=args.grader_noise, task=args.task, model=args.model, progress=not args.no_progress, **extra)
    return Budget(**{k: v for k, v in fields.items() if v is not None})


def add_demo_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="train GRPO and CAPO side by side on an embedded task; calibration before/after (CPU, minutes)",
        description="Trains GRPO and the `capo` preset side by side (one process each, a progress bar each) on an "
                    "embedded task with its tiny start model, by default guess-half, where GRPO loses calibration; "
                    "then prints accuracy, pooled and per-question AUROC and ECE on the test split before and after, "
                    "the validation AUROC over steps, this run against the committed study's seeds on that task, "
                    "and what that study found. Numbers vary with the CPU kind: the same seed gives other numbers "
                    "on another machine.",
    )
    _add_budget_args(p, steps=None, test_problems=256, steps_help="the task's demo budget: 300 on guess-half, else 200",
                     task="guess-half")
    p.add_argument("--seed", type=int, default=0, help="seed of both arms (training data order, sampling; default 0)")
    p.add_argument("--methods", default="grpo,capo",
                   help="the arms, comma-separated presets, optionally amended, e.g. grpo,capo:tau=0.3 "
                        "(see `capo-trl compare --help`; default grpo,capo)")
    p.add_argument("--val_problems", type=int, default=64,
                   help="validation problems (x 4 samples) at steps 0, 1/4, ... of the run (default 64)")
    p.add_argument("--learning_rate", type=float, default=None,
                   help="learning rate of both arms (default: the task's demo budget, 4e-4 on guess-half, else 2e-4)")
    p.add_argument("--plot", default="runs/demo.png", metavar="PNG",
                   help="where to write the picture: the test split's pooled and per-question AUROC and accuracy, "
                        "this run against the committed study's seeds on the task (default runs/demo.png; replaced "
                        "if there; docs/demo.png is `capo-trl demo --plot docs/demo.png`)")
    p.set_defaults(func=run_demo)


@one_line
def run_demo(args) -> int:
    from ..harness.demo import demo, demo_budget

    quiet(args)
    plot = Path(args.plot)
    if plot.suffix.lower() != ".png" or plot.is_dir():
        from ..errors import UsageError

        raise UsageError(f"--plot {args.plot}: give a file name ending in .png.")
    if args.seed < 0:
        from ..errors import UsageError

        raise UsageError(f"--seed must be an integer >= 0, got {args.seed}.")
    budget = demo_budget(args.task, steps=args.steps, learning_rate=args.learning_rate, model=args.model,
                         val_problems=args.val_problems,
                         test_problems=args.test_problems, test_samples=args.test_samples,
                         grader_noise=args.grader_noise, progress=not args.no_progress)
    import torch

    torch.set_num_threads(1)  # this process evaluates the start model while the arms train, one thread each
    demo(budget, methods=args.methods, plot=plot, seed=args.seed)
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
    p.add_argument("--methods", default="grpo,capo", help="comma-separated, e.g. grpo,capo,capo:tau=0.5 (default grpo,capo)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds per method (default 3)")
    p.add_argument("--first_seed", type=int, default=0, help="seeds are first-seed .. first-seed + seeds - 1 (default 0)")
    p.add_argument("--out", required=True,
                   help="output directory: new, empty, or one this command wrote (resumed)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a non-empty --out: forget its saved runs (other files are kept)")
    p.add_argument("--val_every", type=int, default=25, help="validation every N steps (default 25)")
    p.add_argument("--val_problems", type=int, default=64, help="validation problems per validation (default 64)")
    p.add_argument("--val_samples", type=int, default=4, help="samples per validation problem (default 4)")
    p.add_argument("--learning_rate", type=float, default=None,
                   help="learning rate of every run (default: the training budget's, capo_trl.training.defaults)")
    _add_budget_args(p, steps=200, test_problems=256)
    p.set_defaults(func=run_compare)


@one_line
def run_compare(args) -> int:
    from ..harness.compare import compare
    from ..harness.presets import parse_methods

    quiet(args)
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
    p.add_argument("--model", "--model_name_or_path", default=None,
                   help="reference model directory or fetched short name (default: the embedded model; "
                        "--model_name_or_path, capo-trl train's name, is accepted too)")
    p.add_argument("--dataset_name", "--benchmark", default="arithmetic-train",
                   help="training prompts: a registered name or a local file (default: the arithmetic train split; "
                        "capo-trl train's name; --benchmark, the name of earlier releases, is still accepted)")
    add_data_args(p)
    p.add_argument("--limit", type=int, default=128, help="number of prompts (default 128)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (the group size you train with; >= 2; default 8)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: 48 for arithmetic, else 1024")
    p.add_argument("--template", default=None, choices=TEMPLATES, help=TEMPLATE_HELP)
    p.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--write_config", default=None, metavar="YAML",
                   help="write the recommended CAPO configuration (docs/config.md) with the measured ref_high and "
                        "ref_low, and the measured tau where the recommendation's tau is absolute, into this YAML "
                        "recipe (created if missing; only those lines change, comments are kept)")
    p.set_defaults(func=run_calibrate_mask)


@one_line
def run_calibrate_mask(args) -> int:
    from ..errors import UsageError, check_model_path
    from ..harness import calibrate_mask as harness

    at_least(args.limit, "--limit", what="number of prompts")
    at_least(args.n, "--n", what="samples per prompt")
    at_least(args.max_new_tokens, "--max_new_tokens")
    if args.n == 1:
        raise UsageError("--n 1 gives no within-group spread, tau cannot be measured: use --n >= 2 (the group size "
                         "you train with).")
    check_device(args.device)
    if args.model is not None:
        from ..data.models import resolve_model

        args.model = resolve_model(args.model, "--model")
        check_model_path(args.model, "--model")
    path = Path(args.write_config) if args.write_config else None
    text = harness.read_recipe(path) if path else None
    embedded_task = args.dataset_name == "arithmetic-train"
    if embedded_task:
        for flag, value in (("--split", args.split), ("--dataset_columns", args.dataset_columns)):
            if value:
                raise UsageError(f"{flag} does not apply to arithmetic-train (the embedded task's train split); for "
                                 "another split use --dataset_name arithmetic --split NAME.")
        problems = arithmetic.arithmetic_dataset("train", args.limit)
    else:
        problems = load_problems(args.dataset_name, args.dataset_columns, split=args.split, limit=args.limit,
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
        if (yaml.safe_load(updated) or {}).get("noise_mask") is False:
            print(f"capo-trl calibrate-mask: note: {path} sets noise_mask: false, so the thresholds written apply "
                  "only once it is true (tau applies either way)", file=sys.stderr)
    return 0

