"""Errors a user can fix, and the checks that raise them before any work starts.

Why one class: the CLI turns every :class:`UsageError` into one line on stderr and exit status 2
(``capo-trl <command>: <message>``), while a real bug still shows its traceback. Messages name
the field or flag at fault and say how to fix it.
"""

from __future__ import annotations

from pathlib import Path


class UsageError(ValueError):
    """Bad input (a flag, a path, a file, a config value): the message says what is wrong and the fix."""


def close_names(name: str, known, cutoff: float = 0.6) -> list[str]:
    """What ``name`` may be a slip of, best first: the names it abbreviates (it begins them), else the closest.

    Flags compare with ``-`` and ``_`` alike (``--learning-rat`` abbreviates ``--learning_rate``).
    """
    import difflib

    def key(text: str) -> str:
        return text[:2] + text[2:].replace("-", "_") if text.startswith("--") else text

    by_key: dict[str, str] = {}
    for known_name in known:  # of a name's spellings, the underscored one is suggested (TRL's style)
        seen = by_key.get(key(known_name))
        if seen is None or ("-" in seen[2:] and "-" not in known_name[2:]):
            by_key[key(known_name)] = known_name
    wanted = key(name)
    started = sorted((k for k in by_key if k.startswith(wanted) and k != wanted), key=len)
    if started:
        return [by_key[k] for k in started]
    bare = {k.removeprefix("--"): k for k in by_key}  # "--" in both would make any two flags look alike
    close = difflib.get_close_matches(wanted.removeprefix("--"), list(bare), n=1, cutoff=cutoff)
    return [by_key[bare[k]] for k in close]


def did_you_mean(name: str, known, cutoff: float = 0.6, canonical: dict[str, str] | None = None) -> str:
    """``"did you mean X?"`` (or ``"X or Y"``, ``"one of X, Y or Z"`` for an abbreviation of several), or ``""``.
    ``canonical``: the name to show for an alias (``--benchmark`` -> ``--dataset_name``): one name for one thing."""
    close = list(dict.fromkeys((canonical or {}).get(c, c) for c in close_names(name, known, cutoff)))
    if not close:
        return ""
    shown = close[:4]
    if len(shown) == 1:
        return f"did you mean {shown[0]}?"
    listed = f"{', '.join(shown[:-1])} or {shown[-1]}"
    return f"did you mean {'one of ' if len(shown) > 2 else ''}{listed}{', ...' if len(close) > 4 else ''}?"


def unknown_flags(names: list[str], known, hints: dict[str, str] | None = None,
                  canonical: dict[str, str] | None = None) -> str:
    """One line for flags a parser does not know: ``unknown flag --x; did you mean --y?``.

    Abbreviations count as unknown (every parser here has ``allow_abbrev=False``), and are named with the
    flag they abbreviate. ``hints``: what to say of a flag instead of the closest name (another command's
    name for a flag: ``{"--model": "did you mean --model_name_or_path?"}``); ``canonical``: as in
    :func:`did_you_mean`.
    """
    def guess(name: str) -> str:
        key = name[:2] + name[2:].replace("-", "_")
        return (hints or {}).get(key) or did_you_mean(name, known, canonical=canonical)

    names = list(dict.fromkeys(names))
    if len(names) == 1:
        return f"unknown flag {names[0]}" + (f"; {hint}" if (hint := guess(names[0])) else "")
    return "unknown flags " + ", ".join(name + (f" ({hint})" if (hint := guess(name)) else "") for name in names)


def invalid_choice(value, choices) -> str:
    """argparse's "invalid choice" with the choice meant: ``invalid choice: 'relativ'; did you mean relative? ...``."""
    names = [str(c) for c in choices]
    guess = did_you_mean(str(value), names)
    return f"invalid choice: {str(value)!r}; {guess + ' ' if guess else ''}choose from {', '.join(names)}"


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
