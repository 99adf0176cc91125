"""``capo-trl train --accelerate_config NAME|PATH [--num_processes N ...]``: launch through accelerate, as ``trl grpo``.

Why: a TRL user starts multi-GPU runs with ``trl grpo --accelerate_config zero3``, not by learning
``accelerate launch --config_file ...``. As in TRL, NAME is one of TRL's predefined configs
(``trl/accelerate_configs``: zero1/2/3, fsdp1/2, multi_gpu, single_gpu; those in
``examples/accelerate/`` match them) or PATH a config file, and every flag that is not a
``capo-trl train`` field (``--num_processes``, ``--mixed_precision``, ``--main_process_port``...)
goes to ``accelerate launch``; the rest reaches ``capo-trl train`` in each process.
"""

from __future__ import annotations

import subprocess
import sys

from .train_args import FLAG, split_args


def wants_launch(argv: list[str]) -> bool:
    """True when ``argv`` (after ``train``) asks for an accelerate launch."""
    return FLAG in argv


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
