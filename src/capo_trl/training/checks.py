"""Input checks run when a trainer is built, so a bad dataset fails before the first step, not at step 500."""

from __future__ import annotations

import warnings

from ..errors import UsageError


def check_dataset_size(dataset, args) -> None:
    """TRL's sampler drops an incomplete generation batch: too few rows train 0 steps and 'succeed'."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return
    prompts = args.generation_batch_size // args.num_generations
    if len(dataset) == 0:
        raise UsageError("train_dataset is empty: nothing to train on.")
    if len(dataset) < prompts:
        raise UsageError(
            f"train_dataset has {len(dataset)} rows, fewer than the {prompts} distinct prompts of one generation "
            f"batch (generation_batch_size={args.generation_batch_size} / num_generations={args.num_generations}), "
            "so no step would train. Add rows, or lower per_device_train_batch_size (or steps_per_generation)."
        )


def prompt_lengths(prompts, tokenizer) -> list[int]:
    """Token count of each prompt as TRL renders it (chat template with generation prompt, or plain text)."""
    lengths = []
    for prompt in prompts:
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(prompt)["input_ids"]
        lengths.append(len(ids))
    return lengths


def check_prompt_lengths(dataset, tokenizer, context: int | None, max_completion_length: int, name: str,
                         limit: int = 10_000) -> None:
    """A prompt longer than the model's context cannot be trained on (TRL 1.16 does not truncate).

    Checks the first ``limit`` rows (tokenising more would slow start-up for no new information).
    """
    if not isinstance(context, int) or dataset is None or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return
    columns = getattr(dataset, "column_names", None) or []
    if "prompt" not in columns or {"image", "images"} & set(columns):  # multimodal: the processor counts
        return
    rows = dataset.select(range(min(limit, len(dataset)))) if len(dataset) > limit else dataset
    lengths = prompt_lengths(rows["prompt"], tokenizer)
    checked = f"{len(rows)} of {len(dataset)}" if len(rows) < len(dataset) else f"all {len(rows)}"
    too_long = [n for n in lengths if n >= context]
    if too_long:
        raise UsageError(
            f"{name}: {len(too_long)} prompt(s) ({checked} checked) are {max(too_long)} tokens or longer, but the "
            f"model's context (max_position_embeddings) is {context} tokens: no completion token fits. Drop them "
            "(capo-trl train: max_prompt_length; Python: dataset.filter) or use a longer-context model."
        )
    overflow = [n for n in lengths if n + max_completion_length > context]
    if overflow:
        warnings.warn(
            f"{name}: {len(overflow)} prompt(s) ({checked} checked, longest {max(overflow)} tokens) plus "
            f"max_completion_length={max_completion_length} exceed the model's context of {context} tokens; "
            "their completions run past the positions the model was trained on. Drop long prompts "
            "(capo-trl train: max_prompt_length) or lower max_completion_length.",
            stacklevel=4,
        )


def check_correct_threshold(reward_funcs, reward_weights, threshold: float, names=None) -> None:
    """Refuse a ``correct_threshold`` no total reward can reach, or every total reward reaches.

    Knowable only when every reward function declares the values it returns (``reward_range``: those of
    :mod:`capo_trl.rewards` do, and so may yours); a reward model or another function leaves it unchecked.
    A function's missing reward (None) counts as 0 in TRL's weighted total, so 0 is always within reach.
    """
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    ranges = [getattr(f, "reward_range", None) for f in funcs]
    if not funcs or any(r is None for r in ranges):
        return
    weights = [1.0] * len(funcs) if reward_weights is None else [float(w) for w in reward_weights]
    if len(weights) != len(funcs):
        return  # TRL refuses the mismatch with its own message
    low = sum(min(0.0, w * lo, w * hi) for w, (lo, hi) in zip(weights, ranges))
    high = sum(max(0.0, w * lo, w * hi) for w, (lo, hi) in zip(weights, ranges))
    names = names or [getattr(f, "__name__", type(f).__name__) for f in funcs]
    parts = ", ".join(f"{name} in [{lo:g}, {hi:g}]" + (f" x {w:g}" if w != 1 else "")
                      for name, (lo, hi), w in zip(names, ranges, weights))
    if threshold > high:
        raise UsageError(f"CAPOConfig.correct_threshold={threshold:g} is above the highest total reward ({high:g}: "
                         f"{parts}), so no completion would ever count as correct (the noise mask and the capo/* "
                         f"calibration metrics split on it); give a value in ({low:g}, {high:g}], e.g. "
                         f"{(low + high) / 2:g}.")
    if threshold <= low:
        raise UsageError(f"CAPOConfig.correct_threshold={threshold:g} is at or below the lowest total reward ({low:g}: "
                         f"{parts}), so every completion would count as correct (the noise mask and the capo/* "
                         f"calibration metrics split on it); give a value in ({low:g}, {high:g}], e.g. "
                         f"{(low + high) / 2:g}.")
