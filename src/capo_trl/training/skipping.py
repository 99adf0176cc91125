"""Rows that carry no gradient: which ones the policy's loss forward may leave out, and when that is exact.

A row whose advantage is exactly zero (a group whose rewards all tie under CAPO or GRPO, a row the
noise mask dropped) adds exactly zero to every built-in loss type and to its gradient, *provided*
nothing else in the loss reads that row's log-probs: no KL term, no entropy bonus, no statistic over
the whole batch. The loss then runs TRL's own code on a full-shaped batch whose skipped rows hold
constant log-probs (the old ones, so every importance ratio is 1), which keeps every normaliser
(``num_items_in_batch``, the ``grpo`` row count, ``dr_grpo``'s ``max_completion_length``) as it was.
Pure functions only: the trainer's glue is in ``losses.py``.
"""

from __future__ import annotations

import torch

SKIP_FIELD = "skip_zero_advantage_rows"


def skip_blockers(config, method) -> list[str]:
    """Why leaving zero-advantage rows out of the loss forward would change the update (empty: it would not)."""
    reasons = []
    if config.beta != 0.0:
        reasons.append(f"beta={config.beta} (the KL term reads every row's log-probs); set beta=0")
    if config.entropy_coef != 0.0 or getattr(config, "use_adaptive_entropy", False):
        reasons.append("an entropy bonus (it averages the entropy of every row); set entropy_coef=0 and "
                       "use_adaptive_entropy=False")
    if config.top_entropy_quantile < 1.0:
        reasons.append(f"top_entropy_quantile={config.top_entropy_quantile} (a quantile over the whole batch); "
                       "set it to 1.0")
    reason = method.zero_rows_matter()
    if reason:
        reasons.append(f"advantage_estimator={config.advantage_estimator!r}: {reason}")
    return reasons


def resolve_skipping(config, method) -> bool:
    """``skip_zero_advantage_rows``: None means on wherever exact, except under ``"grpo"`` (its promise is
    bit-for-bit GRPOTrainer, and skipping reorders float sums); True refuses a setting where it is not exact."""
    value = getattr(config, SKIP_FIELD)
    if value not in (None, True, False):
        raise ValueError(f"CAPOConfig.{SKIP_FIELD}={value!r} is invalid; use true, false, or leave it unset.")
    blockers = skip_blockers(config, method)
    if value is True and blockers:
        raise ValueError(f"CAPOConfig.{SKIP_FIELD}=True is not exact with {blockers[0]}; or set {SKIP_FIELD}=False.")
    if value is None:
        return not blockers and config.advantage_estimator != "grpo"
    return bool(value)


def rows_to_forward(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Indices of the rows whose advantage is not exactly zero (NaN counts as non-zero), plus at most one more.

    The extra row keeps two things true. Every micro-batch still runs one forward and one backward through
    the whole model: data-parallel gradient reductions and ZeRO-3/FSDP parameter gathers stay collective,
    and the loss keeps a graph; its zero advantage adds exactly zero to the gradient. And whenever the
    micro-batch has loss tokens (``mask``), some forwarded row has them, so the logged entropy, which TRL
    averages over every row's tokens, is the forwarded rows' mean and never a made-up 0.
    """
    nonzero = advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=1)
    has_tokens = mask.sum(dim=1) > 0
    if not (nonzero & has_tokens).any():
        extra = has_tokens if has_tokens.any() else torch.ones_like(has_tokens)
        nonzero = nonzero.clone()
        nonzero[extra.nonzero()[0, 0]] = True
    return nonzero.nonzero().squeeze(1)


def scatter_rows(values: torch.Tensor, rows: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """A full ``fill``-shaped tensor: ``values`` (with their gradient) at ``rows``, the detached ``fill`` elsewhere."""
    out = fill.detach().to(values.dtype).clone()
    out[rows] = values
    return out


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the tokens of ``mask``, without gradient (0 when there are none: then no row of
    the micro-batch has tokens, see ``rows_to_forward``, and TRL's token mean reads no filled value)."""
    mask = mask.to(values.dtype)
    return ((values.detach() * mask).sum() / mask.sum().clamp(min=1.0)).reshape(())
