"""What the ``capo-trl`` subcommands share: one-line errors, quiet progress, data and device flags and their checks."""

from __future__ import annotations

import argparse

from ..data import benchmarks as data


def one_line(run):
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


def quiet(args) -> None:
    """--no_progress also hides the progress bars of datasets (file loading) and transformers (weights)."""
    if getattr(args, "no_progress", False):
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()


def _role_name(text: str) -> str:
    """``--dataset_columns ROLE=NAME`` (an argparse type: a malformed pair is an argparse error, exit 2)."""
    try:
        data.parse_column(text)
    except data.BenchmarkError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return text


TEMPLATES = sorted(data.PROMPT_TEMPLATES)
TEMPLATE_HELP = (f"prompt template (default: {data.DEFAULT_TEMPLATE}; {data.BENCHMARKS['arithmetic'].template} for "
                  "arithmetic)")


def add_data_args(p) -> None:
    p.add_argument("--split", default=None, help="dataset split (default: the benchmark's)")
    # train's name (--dataset_columns, TRL's dataset_* family); --column, one pair per flag, stays for old scripts
    p.add_argument("--dataset_columns", "--column", action="extend", nargs="+", default=[], type=_role_name,
                   metavar="ROLE=NAME", help=f"column mapping for the {'/'.join(data.ROLES)} roles, e.g. "
                   "--dataset_columns problem=question answer=final (default: none)")


def at_least(value, flag: str, minimum: int = 1, what: str = "") -> None:
    from ..errors import UsageError

    if value is not None and value < minimum:
        raise UsageError(f"{flag} must be >= {minimum}{f' ({what})' if what else ''}, got {value}.")


def load_problems(name: str, columns: list[str], flag: str = "--dataset_name", **kwargs):
    """load_benchmark of ``--dataset_columns`` pairs, with the CLI's spelling of a column mapping in its hint, and the flag
    that named an unknown benchmark."""
    try:
        return data.load_benchmark(name, columns=data.parse_columns(columns, "--dataset_columns"), **kwargs)
    except data.BenchmarkError as err:
        if "columns=" in str(err) and "--dataset_columns" not in str(err):
            raise data.BenchmarkError(f"{err} On the command line: --dataset_columns ROLE=NAME, e.g. "
                                      "--dataset_columns problem=question.") from err
        if data.dataset_kind(name) == "hub":  # neither registered nor a file name: say which flag named it
            raise data.BenchmarkError(f"{flag}: {err}") from err
        raise


def check_device(device: str | None) -> None:
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


