"""Each distinct prompt prefilled once, its cache shared by the samples drawn from it.

Why: RL draws ``num_generations`` completions of every prompt, and evaluation ``n`` of every
problem; plain ``generate`` runs the prompt's forward once per row. With a few-shot chat prompt of
~100 tokens and completions of ~20, that prompt forward is most of a CPU's generation time. Here
``generate`` is wrapped: rows that repeat the one before them (TRL and :func:`evaluate` keep a
prompt's draws together) are prefilled once, all but the last prompt token, and the cache is
indexed out to every row before transformers' own ``generate`` continues from it. The samples
follow the same distribution; their numbers can differ from unshared generation by float rounding
(a forward over fewer rows), so the bit-for-bit paths leave it off.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """For each row, the index of the first row of its run of identical (ids, mask) rows."""
    same = (input_ids[1:] == input_ids[:-1]).all(-1) & (attention_mask[1:] == attention_mask[:-1]).all(-1)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=input_ids.device), ~same])
    return torch.nonzero(starts).squeeze(1)[torch.cumsum(starts.long(), 0) - 1]


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position ids transformers' ``generate`` gives a left-padded batch."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)


def _cache_argument(model) -> str:
    """The name the model's forward takes its cache by: ``cache`` from transformers 5.24, ``past_key_values`` before."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


@contextmanager
def shared_prefill(model, forward=None):
    """Make ``model.generate`` prefill each run of identical prompt rows once, for the block only.

    ``forward``: what runs the prefill (default ``model`` itself; a wrapper such as a PeftModel's). A
    call it cannot share (no repeated row, a cache or other model inputs already given, a one-token
    prompt) goes to ``generate`` unchanged.
    """
    from transformers import DynamicCache

    original = model.__dict__.get("generate")
    bound = model.generate
    run = forward or model
    key = _cache_argument(model)

    def generate(*args, input_ids=None, attention_mask=None, **kwargs):
        plain = (args or input_ids is None or attention_mask is None or input_ids.size(1) < 2
                 or kwargs.get("past_key_values") is not None or kwargs.get("cache") is not None
                 or set(kwargs) - {"generation_config", "logits_processor"})
        if not plain:
            first = prompt_groups(input_ids, attention_mask)
            unique = torch.unique(first)
            if len(unique) < len(first):
                ids, mask = input_ids[unique, :-1], attention_mask[unique, :-1]
                cache = DynamicCache(config=getattr(model, "config", None))
                with torch.no_grad():
                    run(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=True,
                    logits_to_keep=1, **{key: cache})
                # row i of the batch reads the cache row of its group's first row
                cache.batch_select_indices(torch.searchsorted(unique, first))
                kwargs[key] = cache
        return bound(*args, input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        if original is None:
            del model.generate
        else:
            model.generate = original


__all__ = ["prompt_groups", "shared_prefill"]
