"""The loss forward with each distinct prompt run once: its cache shared by the rows drawn from it.

Why: TRL's loss forward runs every row's prompt again, though a group's ``num_generations`` rows share it.
With a few-shot prompt of ~100 tokens and completions of ~25, that is most of the loss's forward and
backward on a CPU. Here the prompts of a micro-batch, all but their last token, run once per distinct
(ids, mask) row with the gradient on, their cache is indexed out to every row, and TRL's own forward
(``fused_lm_head=True``: log-probs without the full logits) runs on the last prompt token and the
completion only. Positions and the attention mask are those of the unshared forward, so the log-probs
and the gradient equal TRL's up to float rounding (forwards over other shapes). Autograd sums each
prompt's gradient over its rows, as the unshared forward's would be summed.
"""

from __future__ import annotations

import contextlib

import torch

from ..evaluation.prefill import _cache_argument
from .lower_layers import row_keys


def shared_prompt_logps(model, input_ids, attention_mask, logits_to_keep: int, batch_size: int | None,
                        compute_entropy: bool, autocast, lower=None):
    """TRL's ``(logps, entropies)`` of the last ``logits_to_keep`` tokens, each distinct prompt forwarded once.

    ``model`` is what TRL's loss forwards (PEFT and accelerate wrappers included; its fused LM head is
    TRL's); ``autocast`` TRL's ``accelerator.autocast``. Chunks of ``batch_size`` rows, as TRL's.
    """
    from transformers import DynamicCache

    key = _cache_argument(model)
    prompt_len = input_ids.size(1) - logits_to_keep
    batch_size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        prompt, prompt_mask = ids[:, :prompt_len - 1], mask[:, :prompt_len - 1]
        unique, row_of = torch.unique(torch.cat([prompt, prompt_mask], dim=1), dim=0, return_inverse=True)
        unique_ids, unique_mask = unique[:, :prompt_len - 1], unique[:, prompt_len - 1:]
        keys = (row_keys(unique_ids, unique_mask), row_keys(ids, mask)) if lower is not None else None
        states = [lower.find(k) for k in keys] if keys else [None]
        replay = all(s is not None for s in states)  # both calls of the chunk start above the shared layers
        if lower is not None:
            lower.forwarded += 1
            lower.replayed += int(replay)

        def run(index, call, **inputs):
            if replay:
                inputs = {"inputs_embeds": torch.stack(states[index])}
                scope = lower.replay()
            else:
                scope = lower.capture(keys[index]) if lower is not None else contextlib.nullcontext()
            with autocast(), scope:
                return model(**inputs, **call)

        cache = DynamicCache(config=getattr(model, "config", None))
        run(0, {"attention_mask": unique_mask, "use_cache": True, "logits_to_keep": 1, key: cache},
            input_ids=unique_ids)
        cache.batch_select_indices(row_of)  # row i reads its prompt's cache row (a gather: gradients add up)
        tail = ids[:, prompt_len - 1:]  # the last prompt token predicts the first completion token
        labels = tail.masked_fill(mask[:, prompt_len - 1:] == 0, -100)
        labels[:, 0] = -100
        out = run(1, {"attention_mask": mask, "labels": labels, "fused_lm_head": True, key: cache}, input_ids=tail)
        logps.append(out.log_probs[:, -logits_to_keep:])
        if compute_entropy:
            entropies.append(out.entropy[:, -logits_to_keep:])
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None


__all__ = ["shared_prompt_logps"]
