"""The loss-changing hooks of a method (``sequence_loss``, ``token_logps``) inside TRL's loss path.

Every other method runs TRL's loss untouched; nothing here is copied from TRL: it calls TRL's own
forward (``_get_per_token_logps_and_entropies``) or, for ``token_logps``, one plain forward.
"""

from __future__ import annotations

import torch

from ..advantages import mean_token_logprob
from .prompt_sharing import shared_prompt_logps
from .skipping import masked_token_mean, rows_to_forward, scatter_rows

# Extra model inputs TRL's forward accepts (multimodal); passed through unchanged when present.
FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


class MethodLosses:
    """Mixin for :class:`~capo_trl.CAPOTrainer`: routes TRL's loss through the method's loss hooks, and leaves
    rows with a zero advantage out of its forward (``skip_zero_advantage_rows``, exact: see ``skipping.py``)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Loss-changing methods hook in here; every other method runs TRL's loss untouched."""
        if self.method.sequence_loss is not None and not return_outputs:
            return self._sequence_loss(model, inputs, self.method.sequence_loss)
        rows = self._forwarded_rows(inputs)
        if self.method.token_logps is None and rows is None and not self.args.share_prompt_in_loss:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._loss_inputs, self._loss_rows = inputs, rows  # read by _get_per_token_logps_and_entropies in TRL's loss
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._loss_inputs = self._loss_rows = None

    def _forwarded_rows(self, inputs) -> torch.Tensor | None:
        """The rows of this micro-batch the loss forward needs (logs ``capo/skipped_frac``); None: all of them."""
        if not self._skip_rows or any(k in inputs for k in FORWARD_KEYS):  # images are not sliced per row
            return None
        rows = rows_to_forward(inputs["advantages"], inputs["completion_mask"] * inputs.get("tool_mask", 1))
        n = inputs["advantages"].size(0)
        self._log_local("train" if self.model.training else "eval", {"capo/skipped_frac": 1.0 - rows.numel() / n},
                        rows.device)
        return None if rows.numel() == n else rows

    def _sequence_loss(self, model, inputs, loss_fn) -> torch.Tensor:
        """A sequence-level loss (C2GSPG) of the current mean token log-probs, through TRL's forward."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        extra = {k: inputs[k] for k in FORWARD_KEYS if k in inputs}
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                              inputs["completion_ids"].size(1), **extra)
        loss, metrics = loss_fn(mean_token_logprob(logps, mask), inputs["advantages"], inputs["capo_rewards"])
        mode = "train" if self.model.training else "eval"
        self._log_local(mode, metrics, loss.device)
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's fused log-probs, except inside the loss: there only the forwarded rows run (the others hold
        constants, see ``skipping.py``), and a ``token_logps`` method (SimKO) gets the full logits."""
        inputs, rows = self._loss_inputs, self._loss_rows
        if inputs is None:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, compute_aux_loss,
                                                              **multimodal)
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        if rows is None:
            return self._loss_logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                                    compute_aux_loss, inputs, mask, **multimodal)
        part = {k: inputs[k][rows] for k in ("advantages", "capo_rewards") if k in inputs}
        logps, entropy, aux = self._loss_logps(model, input_ids[rows], attention_mask[rows], logits_to_keep,
                                               batch_size, compute_entropy, compute_aux_loss, part, mask[rows],
                                               **multimodal)
        # Skipped rows: the old log-probs (importance ratio 1) or, when TRL uses the current ones detached, 0.
        fill = inputs.get("old_per_token_logps")
        logps = scatter_rows(logps, rows, torch.zeros_like(mask, dtype=logps.dtype) if fill is None else fill)
        if entropy is not None:  # read only by the logged `entropy` here: the forwarded rows' token mean
            entropy = scatter_rows(entropy, rows, masked_token_mean(entropy, mask[rows]).expand(mask.shape))
        return logps, entropy, aux

    def _loss_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                    compute_aux_loss, inputs, mask, **multimodal):
        """The loss's log-probs of these rows: TRL's, or one plain forward and the ``token_logps`` hook."""
        if self.method.token_logps is None:
            if (self.args.share_prompt_in_loss and not compute_aux_loss and input_ids.size(1) - logits_to_keep >= 2
                    and all(v is None for v in multimodal.values())):
                lower, counts = self._lower, None
                if lower is not None:
                    counts = (lower.replayed, lower.forwarded)
                logps, entropy = shared_prompt_logps(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                                     compute_entropy, self.accelerator.autocast, lower)
                if counts is not None:  # chunks of this forward that started above the shared layers
                    share = (lower.replayed - counts[0]) / max(lower.forwarded - counts[1], 1)
                    self._log_local("train" if self.model.training else "eval", {"capo/lower_layers_shared": share},
                                    logps.device)
                return logps, entropy, None
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, compute_aux_loss,
                                                              **multimodal)
        if compute_aux_loss or any(v is not None for v in multimodal.values()):
            raise NotImplementedError(f"advantage_estimator={self.args.advantage_estimator!r} needs full logits and "
                                      "supports text-only models without a router aux loss.")
        with self.accelerator.autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                           logits_to_keep=logits_to_keep + 1).logits
        advantages = inputs["advantages"]
        negative = (advantages if advantages.dim() == 1 else advantages.sum(1)) < 0
        correct = inputs["capo_rewards"] >= self.args.correct_threshold
        logps, entropy, stats = self.method.token_logps(
            logits[:, :-1] / self.temperature, input_ids[:, -logits_to_keep:], mask, correct, negative)
        self._log_local("train" if self.model.training else "eval", stats, logps.device)
        return logps, entropy if compute_entropy else None, None

    def _log_local(self, mode, metrics: dict[str, float], device) -> None:
        """Average per-process metrics over processes, then log them."""
        for name, value in metrics.items():
            value = self.accelerator.gather(torch.tensor([value], device=device)).mean().item()
            self._metrics[mode][name].append(value)
