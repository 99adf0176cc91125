"""Which checkpoint folder a run can resume from: complete ones only, read from the files alone.

A process killed while saving leaves a ``checkpoint-N`` folder with some files missing or cut short.
Transformers' ``Trainer._save_checkpoint`` writes ``trainer_state.json`` after the weights, optimizer,
scheduler and RNG states, and deletes older checkpoints (``save_total_limit``) only after that; CAPO
writes its own state (``capo_state.pt``, atomically) before any of them and removes a stale
``trainer_state.json`` first when a folder is written again. So a folder is complete when its
``trainer_state.json`` reads back and every file it needs is there and whole; a folder that fails
is never resumed from (transformers' ``get_last_checkpoint`` takes the highest number, whatever it holds).
"""

from __future__ import annotations

import json
import os
import re
import struct
import warnings
import zipfile

from ..errors import UsageError

CAPO_STATE = "capo_state.pt"
LEGACY_STATE = "capo_state_{}.pt"  # one file per process, written before capo_state.pt existed
TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
ENTROPY_STATE = "entropy_ctrl_state.json"  # TRL's use_adaptive_entropy controller
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR-<global step>
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
           "pytorch_model.bin.index.json", "adapter_model.bin")


def _safetensors_problem(path: str) -> str | None:
    """A safetensors file is whole when its header parses and its data ends where the file ends."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "cut short"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return "cut short"
        try:
            header = json.loads(f.read(length))
        except ValueError:
            return "unreadable header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return None if 8 + length + end == size else "cut short"


def _file_problem(folder: str, name: str) -> str | None:
    path = os.path.join(folder, name)
    if name.endswith(".safetensors"):
        return _safetensors_problem(path)
    if name.endswith((".pt", ".pth", ".bin")):
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"  # torch.save's format; its directory is written last
        return "cut short" if zipped and not zipfile.is_zipfile(path) else None
    if name.endswith(".index.json"):
        try:
            with open(path) as f:
                shards = set(json.load(f)["weight_map"].values())
        except (ValueError, KeyError):
            return "unreadable"
        missing = sorted(shards - set(os.listdir(folder)))
        return f"names missing shard {missing[0]}" if missing else None
    return None


def checkpoint_problem(folder: str, needs_optimizer: bool = True, needs_json: tuple[str, ...] = ()) -> str | None:
    """Why ``folder`` cannot be resumed from, in a few words; None when it is complete.

    ``needs_optimizer``: the run saves optimizer, scheduler and RNG files as plain files (not
    ``save_only_model``, not DeepSpeed or FSDP, which write their own folders). ``needs_json``: JSON
    files the run's trainer reads back, which must be there and whole (TRL's adaptive-entropy state,
    written after the rest of the checkpoint and skipped silently by TRL when absent).
    """
    try:
        names = set(os.listdir(folder))
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if TRAINER_STATE not in names:
        return f"no {TRAINER_STATE}"
    try:
        with open(os.path.join(folder, TRAINER_STATE)) as f:
            step = json.load(f).get("global_step")
    except (ValueError, OSError):
        return f"{TRAINER_STATE} cut short"
    match = CHECKPOINT.match(os.path.basename(os.path.normpath(folder)))
    if match and step != int(match.group(1)):
        return f"{TRAINER_STATE} says step {step}"
    if CAPO_STATE not in names and LEGACY_STATE.format(0) not in names:
        return f"no {CAPO_STATE}"
    has_folder = any(os.path.isdir(os.path.join(folder, n)) for n in names)  # DeepSpeed's / FSDP's own layout
    if not has_folder and not names & set(WEIGHTS):
        return "no model weights"
    if needs_optimizer:
        for name in ("optimizer.pt", "scheduler.pt"):
            if name not in names:
                return f"no {name}"
        if not names & {"rng_state.pth", "rng_state_0.pth"}:  # every process's is written before trainer_state
            return "no rng_state.pth"
    for name in needs_json:
        if name not in names:
            return f"no {name}"
        try:
            with open(os.path.join(folder, name)) as f:
                json.load(f)
        except ValueError:
            return f"{name} cut short"
    for name in sorted(names):
        if os.path.isfile(os.path.join(folder, name)):
            problem = _file_problem(folder, name)
            if problem:
                return f"{name} {problem}"
    return None


def checkpoints(output_dir: str) -> list[str]:
    """The ``checkpoint-N`` folders of ``output_dir``, newest (highest N) first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), n) for n in os.listdir(output_dir) if (m := CHECKPOINT.match(n))
             and os.path.isdir(os.path.join(output_dir, n))]
    return [os.path.join(output_dir, n) for _, n in sorted(found, reverse=True)]


def newest_complete(output_dir: str, needs_optimizer: bool = True,
                    needs_json: tuple[str, ...] = ()) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete checkpoint of ``output_dir`` (None if none) and the (folder, problem) of newer ones."""
    broken = []
    for folder in checkpoints(output_dir):
        problem = checkpoint_problem(folder, needs_optimizer, needs_json)
        if problem is None:
            return folder, broken
        broken.append((folder, problem))
    return None, broken


def _check_unfinished(folder: str, max_steps: int) -> str:
    """Transformers trains one step more when resumed at its last step: a finished run is refused instead."""
    with open(os.path.join(folder, TRAINER_STATE)) as f:
        state = json.load(f)
    step, total = state.get("global_step", 0), max_steps if max_steps > 0 else state.get("max_steps", 0)
    if total and step >= total:
        raise UsageError(f"resume_from_checkpoint {folder} is step {step} of max_steps={total}: that run is finished "
                         "(resuming it would train one step more); its weights are the trained model, or raise "
                         "max_steps to train on.")
    return folder


def resume_checkpoint(value, output_dir: str, needs_optimizer: bool = True, warn: bool = True,
                      max_steps: int = -1, needs_json: tuple[str, ...] = ()) -> str | None:
    """The folder to resume from for Trainer's ``resume_from_checkpoint`` (None, True or a path).

    True takes the newest complete checkpoint of ``output_dir`` (saying which newer ones it passes
    over); a path must be complete. Anything else is refused in one line naming the checkpoint to use,
    and so is a checkpoint at the run's last step (``max_steps``; -1: the one the checkpoint recorded).
    """
    if value is None or value is False:
        return None
    start_afresh = "start afresh (capo-trl train: --overwrite_output_dir true)"
    if value is True:
        folder, broken = newest_complete(output_dir, needs_optimizer, needs_json)
        if folder is None and not broken:
            raise UsageError(f"resume_from_checkpoint: {output_dir} holds no checkpoint-N folder to resume from; "
                             "drop the flag to start afresh, or point output_dir at the run to resume.")
        if folder is None:
            raise UsageError(f"resume_from_checkpoint: {output_dir} holds no complete checkpoint: {broken[0][0]} is "
                             f"incomplete ({broken[0][1]}; killed while saving?) and so is every older one; "
                             f"{start_afresh}.")
        if broken and warn:
            names = ", ".join(f"{os.path.basename(f)} ({p})" for f, p in broken)
            warnings.warn(f"resume_from_checkpoint: skipping incomplete {names} (killed while saving?); resuming "
                          f"from {folder}, the newest complete checkpoint.", stacklevel=3)
        return _check_unfinished(folder, max_steps)
    problem = checkpoint_problem(str(value), needs_optimizer, needs_json)
    if problem is None:
        return _check_unfinished(str(value), max_steps)
    folder, _ = newest_complete(os.path.dirname(os.path.normpath(str(value))), needs_optimizer, needs_json)
    use = f"resume from {folder}, the newest complete checkpoint" if folder else start_afresh
    raise UsageError(f"resume_from_checkpoint {value} is incomplete ({problem}; killed while saving?); {use}.")
