"""``capo-trl train --accelerate_config NAME|PATH [--num_processes N ...]``: launch through accelerate, as ``trl grpo``.

Why: a TRL user starts multi-GPU runs with ``trl grpo --accelerate_config zero3``, not by learning
``accelerate launch --config_file ...``. As in TRL, NAME is one of TRL's predefined configs
(``trl/accelerate_configs``: zero1/2/3, fsdp1/2, multi_gpu, single_gpu; those in
``examples/accelerate/`` match them) or PATH a config file, and every flag that is not a
``capo-trl train`` field (``--num_processes``, ``--mixed_precision``, ``--main_process_port``...)
goes to ``accelerate launch``; the rest reaches ``capo-trl train`` in each process.
"""

from __future__ import annotations

import importlib.resources
import subprocess
import sys

from .errors import UsageError

FLAG = "--accelerate_config"


def wants_launch(argv: list[str]) -> bool:
    """True when ``argv`` (after ``train``) asks for an accelerate launch."""
    return FLAG in argv


def predefined_configs() -> list[str]:
    """The names TRL ships in ``trl/accelerate_configs`` (without ``.yaml``)."""
    files = importlib.resources.files("trl.accelerate_configs").iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def _without(argv: list[str], taken: list[str]) -> list[str]:
    """``argv`` less ``taken``, an ordered subsequence of it (argparse's unknown strings keep their order)."""
    rest, pending = [], list(taken)
    for arg in argv:
        if pending and arg == pending[0]:
            pending.pop(0)
        else:
            rest.append(arg)
    return rest


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(accelerate launch arguments, capo-trl train arguments) of ``argv``; the config name is resolved."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    from .train_args import make_parser

    index = argv.index(FLAG)
    if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
        raise UsageError(f"{FLAG} needs a value: one of {', '.join(predefined_configs())}, or a config file path.")
    rest = argv[:index] + argv[index + 2:]
    recipe = []
    if "--config" in rest and rest.index("--config") + 1 < len(rest):  # TrlParser reads it itself
        at = rest.index("--config")
        recipe, rest = rest[at:at + 2], rest[:at] + rest[at + 2:]
    _, unknown = make_parser().parse_known_args(rest)
    try:
        launch = resolve_accelerate_config_argument([FLAG, argv[index + 1], *unknown])
    except ValueError as err:
        raise UsageError(f"{FLAG} {argv[index + 1]}: neither a file nor a predefined config; give one of "
                         f"{', '.join(predefined_configs())}, or a config file path.") from err
    return launch, recipe + _without(rest, unknown)


def launch(argv: list[str]) -> int:
    """``accelerate launch LAUNCH_ARGS -m capo_trl.cli train TRAIN_ARGS``; the exit status of the launch."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    launch_args, train_args = split_args(argv)
    args = launch_command_parser().parse_args([*launch_args, "--module", "capo_trl.cli", "train", *train_args])
    print(f"capo-trl train: accelerate launch {' '.join(launch_args)}", file=sys.stderr)
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:  # the process printed its own error above
        print(f"capo-trl train: a launched process failed (exit status {err.returncode}).", file=sys.stderr)
        return err.returncode or 1
    except Exception as err:  # torchrun's ChildFailedError: its report is above
        if type(err).__name__ != "ChildFailedError":
            raise
        print("capo-trl train: a launched process failed (torchrun's report is above).", file=sys.stderr)
        return 1
    return 0
