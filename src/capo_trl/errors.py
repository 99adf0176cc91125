"""Errors a user can fix, and the checks that raise them before any work starts.

Why one class: the CLI turns every :class:`UsageError` into one line on stderr and exit status 2
(``capo-trl <command>: <message>``), while a real bug still shows its traceback. Messages name
the field or flag at fault and say how to fix it.
"""

from __future__ import annotations

from pathlib import Path


class UsageError(ValueError):
    """Bad input (a flag, a path, a file, a config value): the message says what is wrong and the fix."""


def offline_kernel_error(err: Exception) -> UsageError | None:
    """The one-line form of a Hub kernel that could not be fetched offline, else None.

    Why: on CUDA, transformers (5.2x) swaps Hub kernels into a model at ``from_pretrained`` unless
    ``USE_HUB_KERNELS`` says no; with ``HF_HUB_OFFLINE`` and none cached the load fails deep inside the
    ``kernels`` package (seen on an H200), in a setting common on clusters, for every command that loads a model.
    """
    text = " ".join(str(err).split())
    if not isinstance(err, ValueError) or "offline mode" not in text or "kernel" not in text.lower():
        return None
    return UsageError(f"loading the model, transformers asked the Hugging Face Hub for a kernel while offline "
                      f"({text[:160]}). Set USE_HUB_KERNELS=NO to keep PyTorch's own layers, or run once online "
                      "so the kernel is cached.")


def check_output_dir(path: str | Path, overwrite: bool, flag: str = "--overwrite",
                     ignore: tuple[str, ...] = ()) -> Path:
    """Refuse to write into a non-empty ``path`` unless ``overwrite``: nothing is replaced silently.

    A path that is an existing *file* is always refused. ``ignore`` lists entry names that do not
    count (e.g. a resumable run's own manifest, checked by the caller).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} is a file, not a directory: give a directory for the output.")
    if path.is_dir() and not overwrite:
        entries = sorted(p.name for p in path.iterdir() if p.name not in ignore)
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise UsageError(f"output directory {path} is not empty ({shown}); choose a new directory, or pass "
                             f"{flag} to replace what is there.")
    return path


def check_model_path(name: str | Path, what: str = "model") -> str:
    """A model given as a directory must exist and hold a config; a hub id must be reachable.

    Why here: transformers answers a missing directory with four chained tracebacks ending in
    "Repo id must be in the form ...", never "no such directory".
    """
    import os

    text = str(name)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{what} {text} is a file; give the directory that holds config.json and the weights.")
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise UsageError(f"{what} directory {text} has no config.json (nor adapter_config.json): not a saved "
                             "model. Give the directory written by save_pretrained().")
        return text
    looks_local = text.startswith((".", "/", "~")) or text.count("/") != 1 or text.endswith("/") or "\\" in text
    if looks_local:
        raise UsageError(f"{what} {text}: no such directory. Give an existing model directory (or a hub id 'org/name').")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(text, "config.json"), str):
            raise UsageError(f"{what} {text}: no such directory, and HF_HUB_OFFLINE is set with no cached copy of the "
                             "hub id. Give a local model directory, or download it first.")
    return text
