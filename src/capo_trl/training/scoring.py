"""Scoring completions for CAPO: ``s`` under the rollout policy, and the reference perplexity of the mask.

A mixin of :class:`~capo_trl.CAPOTrainer`. Every forward goes through TRL's own log-prob routine
(same temperature and masking as the loss). Under ZeRO-3 and FSDP every forward through a sharded
model gathers parameters from all processes, so when only some rows are scored
(``ref_scoring="needed"``) each process still runs the same number of forwards: see
:func:`collective_rows`.
"""

from __future__ import annotations

import contextlib
import math

import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter

from ..advantages import mean_token_logprob
from .answers import answer_token_mask, checked_spans
from .losses import FORWARD_KEYS
from .prompt_sharing import shared_prompt_logps
from .reference import sequence_keys


def collective_rows(want: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``want`` widened with unwanted rows until it selects ``counts.max()`` rows (``counts``: every process's).

    TRL's forward runs one chunk per ``batch_size`` rows, so equal row counts mean equal numbers of
    parameter all-gathers on every process: none waits for a forward another never runs. The extra
    rows are scored too (a sharded forward costs the same either way) and simply unused.
    """
    target = int(counts.max())
    missing = target - int(want.sum())
    if missing <= 0:
        return want
    out = want.clone()
    out[(~want).nonzero().squeeze(1)[:missing]] = True
    return out


@contextlib.contextmanager
def scoring_mode(model: torch.nn.Module, device: torch.device):
    """Eval mode and a forked RNG for one scoring forward, then every module's mode and the RNG as found.

    A score is then a function of the completion alone (no dropout noise), and the training that
    follows draws the same random numbers as without the forward: with a dropout model, ``"grpo"``
    stays bit for bit GRPOTrainer even when CAPO must score the rollout itself.
    """
    modes = [(module, module.training) for module in model.modules()]
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], device_type=device.type):
        model.eval()
        try:
            yield
        finally:
            for module, training in modes:
                module.training = training


class ReferenceScoring:
    """Mixin for :class:`~capo_trl.CAPOTrainer`: the policy's and the reference's scores of a batch."""

    @property
    def _sharded(self) -> bool:
        """Forwards through the model are collectives (ZeRO-3 or FSDP)."""
        return bool(self._dist.is_zero3 or self.is_fsdp_enabled)

    def _forward_logps(self, model, out, rows: torch.Tensor | None = None, shared: bool = False,
                       lower=None) -> torch.Tensor:
        """One no-grad forward through TRL's own log-prob routine (same temperature and masking as the loss).

        ``shared``: each distinct prompt runs once (:func:`shared_prompt_logps`, the loss's ``share_prompt_in_loss``
        forward): the same log-probs up to float rounding, for a fraction of the prompt's cost; ``lower`` records
        its rows' states below the adapter for that forward (:mod:`~capo_trl.training.lower_layers`).
        """
        extra = {k: out[k] for k in FORWARD_KEYS if k in out}
        if rows is not None and extra:
            raise ValueError("multimodal inputs (images) are not per row: score every row (rows=None)")
        take = (lambda t: t) if rows is None else (lambda t: t[rows])
        input_ids = torch.cat([take(out["prompt_ids"]), take(out["completion_ids"])], dim=1)
        attention_mask = torch.cat([take(out["prompt_mask"]), take(out["completion_mask"])], dim=1)
        width, batch_size = out["completion_ids"].size(1), self.args.per_device_train_batch_size
        with (torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
              scoring_mode(model, self.accelerator.device)):
            if shared and not extra and out["prompt_ids"].size(1) >= 2:
                logps, _ = shared_prompt_logps(model, input_ids, attention_mask, width, batch_size, False,
                                               self.accelerator.autocast, lower)
            else:
                logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, width,
                                                                      batch_size=batch_size, **extra)
        return logps

    def _rollout_scores(self, out, loss_mask, record) -> torch.Tensor:
        """s_i under the policy that sampled: TRL's old log-probs, else the recorded ones, else a forward.

        s averages every generated token (tool output excluded), also those of a completion that
        ``mask_truncated_completions`` leaves out of the loss: a truncated answer still takes part in
        CAPO's comparisons, as its reward does in GRPO's group baseline. The token log-probs stay on ``record``
        for :meth:`_answer_scores`.
        """
        record.token_logps = self._rollout_token_logps(out, loss_mask, record)
        return mean_token_logprob(*record.token_logps)

    def _answer_scores(self, out, record, inputs) -> torch.Tensor | None:
        """The same average over each final answer's own tokens (NaN: no answer), where the reward function that
        reports spans reads it; None when the method does not ask for it."""
        if self._answer_spans is None:
            return None
        spans_of, name = self._answer_spans
        per_token, score_mask = record.token_logps

        def decode(ids):  # as TRL decodes the completions the reward functions see
            return self._tokenizer.decode(ids, skip_special_tokens=True)

        ids = out["completion_ids"]
        lengths = record.completion_lengths or [int(n) for n in out["completion_mask"].sum(dim=1).tolist()]
        texts = [decode(ids[i, :n].tolist()) for i, n in enumerate(lengths)]
        columns = {k: [row[k] for row in inputs] for k in inputs[0] if k not in ("prompt", "completion")}
        spans = checked_spans(spans_of(completions=texts, prompts=[row["prompt"] for row in inputs], **columns),
                              texts, name)
        answer = answer_token_mask(ids, lengths, spans, decode)
        return mean_token_logprob(per_token, score_mask * answer.to(score_mask.dtype))

    def _rollout_token_logps(self, out, loss_mask, record) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, T)`` token log-probs of the rollout under the policy that sampled it, and the mask s averages."""
        attend, score_mask = self._generated_masks(out, loss_mask, record)
        if "old_per_token_logps" in out:  # TRL scored truncated rows with their completion hidden: redo those
            per_token = self._rescored(out, attend, out["old_per_token_logps"])
        elif record.rollout_logps is not None:
            width = out["completion_ids"].size(1)
            per_token = torch.zeros(len(record.rollout_logps), width, device=loss_mask.device)
            for i, row in enumerate(record.rollout_logps):
                per_token[i, : len(row)] = torch.tensor(row[:width])
        else:
            per_token = self._forward_logps(self.model, {**out, "completion_mask": attend})
        return per_token, score_mask

    def _generated_masks(self, out, loss_mask, record) -> tuple[torch.Tensor, torch.Tensor]:
        """(completion attention mask, score mask) over every generated token: TRL's masks as they were before
        ``mask_truncated_completions`` zeroed the truncated rows (the same masks when it is off)."""
        if not self.mask_truncated_completions or record.completion_lengths is None:
            return out["completion_mask"], loss_mask
        width = out["completion_ids"].size(1)
        lengths = torch.tensor(record.completion_lengths, device=loss_mask.device)
        attend = torch.arange(width, device=loss_mask.device).unsqueeze(0) < lengths.unsqueeze(1)
        score_mask = attend.to(loss_mask.dtype)
        for i, tool_mask in enumerate(record.tool_masks or []):  # tool output is not the policy's
            score_mask[i, : len(tool_mask)] *= torch.tensor(tool_mask, dtype=score_mask.dtype, device=lengths.device)
        return attend.to(out["completion_mask"].dtype), score_mask

    def _rescored(self, out, attend: torch.Tensor, per_token: torch.Tensor) -> torch.Tensor:
        """``per_token`` with the rows whose attention mask ``attend`` changes scored again under it (one forward)."""
        if not self.mask_truncated_completions:
            return per_token
        hidden = (attend != out["completion_mask"]).any(dim=1).cpu()
        rows = hidden
        if self._sharded:  # every process runs as many forwards as the one with the most rows
            counts = self.accelerator.gather(torch.tensor([int(hidden.sum())], device=attend.device))
            rows = collective_rows(hidden, counts.cpu())
        if not rows.any():
            return per_token
        full = {**out, "completion_mask": attend}
        if any(k in out for k in FORWARD_KEYS):  # images are not per row: score every row
            fresh, rows = self._forward_logps(self.model, full), torch.ones_like(rows)
        else:
            fresh = self._forward_logps(self.model, full, rows.nonzero().squeeze(1).to(attend.device))
        used = hidden[rows].to(fresh.device)  # rows scored only to keep the forwards collective keep TRL's values
        per_token = per_token.clone()
        per_token[rows.nonzero().squeeze(1)[used.cpu()].to(per_token.device)] = fresh[used].to(per_token.dtype)
        return per_token

    def _ref_rows(self, out, advantages: torch.Tensor, mode: str) -> torch.Tensor | None:
        """Global rows whose reference score can change the loss (``ref_scoring``); None: every row."""
        if self._ref_scoring == "all" or "ref_per_token_logps" in out:
            return None
        if any(k in out for k in FORWARD_KEYS):
            return None  # images are not sliced per row (pixel_values are per image): score every row
        if self.args.ref_thresholds == "auto" and self._mask.measured is None:
            return None  # the quartile rule measures on every completion
        return advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=1)

    def _reference_ppl(self, out, loss_mask, record, advantages, local: slice, mode: str) -> torch.Tensor:
        """Reference perplexity of the global batch; NaN (kept by the mask) where ``ref_scoring`` skipped it."""
        rows = self._ref_rows(out, advantages, mode)
        gather = self.accelerator.gather
        ref = gather(self._reference_scores(out, loss_mask, record, None if rows is None else rows[local]))
        if rows is not None:
            more = self._mask.unresolved(record.rewards, torch.exp(-ref))  # the guard's decision hangs on them
            if more.any():  # the same answer on every process: `more` is global
                ref = torch.where(more, gather(self._reference_scores(out, loss_mask, record, more[local])), ref)
            self._metrics[mode]["capo/ref_scored_frac"].append(torch.isfinite(ref).float().mean().item())
        return torch.exp(-ref)

    def _reference_scores(self, out, loss_mask, record, want: torch.Tensor | None = None) -> torch.Tensor:
        """Mean token log-prob under the reference: TRL's when beta > 0, else cached or one forward.

        ``want``: score only these rows (the others stay NaN).
        """
        if "ref_per_token_logps" in out:
            return mean_token_logprob(out["ref_per_token_logps"], loss_mask)
        n = loss_mask.size(0)
        want = torch.ones(n, dtype=torch.bool) if want is None else want.cpu()
        if record.ref_cache_start is None:
            record.ref_cache_start = (self._ref_cache.hits, self._ref_cache.lookups)
        scores = torch.full((n,), float("nan"), device=loss_mask.device)
        multimodal = any(k in out for k in FORWARD_KEYS)
        cached = self._ref_cache_usable and not multimodal
        keys = sequence_keys(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], loss_mask) if cached else []
        if cached:
            for i, key in enumerate(keys):
                hit = self._ref_cache.get(key) if want[i] else None
                if hit is not None:
                    scores[i] = hit
        todo = forward = torch.isnan(scores).cpu() & want
        if self._sharded:  # the cache is off here: widen the forward to every process's row count
            counts = self.accelerator.gather(torch.tensor([int(todo.sum())], device=loss_mask.device))
            forward = collective_rows(todo, counts.cpu())
        missing = forward.nonzero().squeeze(1).to(loss_mask.device)
        if missing.numel() == 0:
            return scores
        rows = None if missing.numel() == n else missing
        shared = self.args.share_prompt_in_loss  # the rows of a group share their prompt here too
        if self._capo_ref_model is not None:
            logps = self._forward_logps(self._capo_ref_model, out, rows, shared)
        else:  # PEFT: the "ref" adapter (a frozen copy of the initial one), or the base model for a fresh adapter
            unwrapped = self.accelerator.unwrap_model(self.model)
            recording = self._lower.recording() if self._lower is not None else contextlib.nullcontext()
            with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None), recording:
                logps = self._forward_logps(self.model, out, rows, shared, self._lower)
        fresh = mean_token_logprob(logps, loss_mask[missing])
        used = todo[forward]  # rows scored only to keep the forwards collective stay NaN, as without sharding
        missing, fresh = missing[used.to(missing.device)], fresh[used.to(fresh.device)]
        scores[missing] = fresh
        if cached:
            for i, value in zip(missing.tolist(), fresh.tolist()):
                if not math.isnan(value):
                    self._ref_cache.put(keys[i], value)
        return scores
