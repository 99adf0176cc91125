"""The rollout's log-probs, recorded while ``model.generate`` samples (no second forward).

The trainer scores its rollouts with it (CAPO's ``s``) and :mod:`~capo_trl.evaluation.sampling`
scores evaluation samples with the same recorder, so training and evaluation measure one quantity.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList


class RolloutLogprobRecorder(LogitsProcessor):
    """Records ``log softmax(logits / T)`` of each sampled token while ``model.generate`` runs.

    Custom logits processors run after transformers' own penalties and *before* the sampling
    warpers (temperature, top-k, top-p), so the recorded value is the same quantity TRL's
    ``_get_per_token_logps_and_entropies`` computes with a full forward (logits divided by the
    temperature, full-vocabulary softmax). The token sampled at step t is only known at step t+1
    (it is then the last input id), so one ``(B, V)`` distribution is kept pending at a time; the
    last step is resolved from the returned completion ids.
    """

    def __init__(self, temperature: float = 1.0):
        self.temperature = float(temperature)
        self.steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None  # logits / T of the last step (a new tensor, never mutated)
        self._pending_lse: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1) - self._pending_lse)
        # log softmax at one token = logit - logsumexp: no (B, V) log-prob tensor per step
        self._pending = scores.float() / self.temperature
        self._pending_lse = torch.logsumexp(self._pending, dim=-1)
        return scores

    @contextmanager
    def attached(self, model):
        """Make ``model.generate`` pass this recorder, for the duration of the block only."""
        original = model.__dict__.get("generate")
        bound = model.generate

        def generate(*args, **kwargs):
            processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
            processors.append(self)
            return bound(*args, logits_processor=processors, **kwargs)

        model.generate = generate
        try:
            yield self
        finally:
            if original is None:
                del model.generate
            else:
                model.generate = original

    def per_sequence(self, completion_ids: list[list[int]]) -> list[list[float]] | None:
        """Log-prob of each completion token; ``None`` if generation never called the recorder."""
        if self._pending is None:
            return None
        last = self._pending
        table = torch.stack(self.steps, dim=1) if self.steps else last.new_zeros((last.size(0), 0))
        num_steps = table.size(1) + 1  # the last step's token is resolved below
        if table.size(0) != len(completion_ids):
            return None
        out = []
        for i, ids in enumerate(completion_ids):
            n = len(ids)
            if n > num_steps:
                return None  # the completion was extended after generation (tools): not ours to score
            row = table[i, :n].tolist()
            if n == num_steps:
                row.append((last[i, ids[n - 1]] - self._pending_lse[i]).item())
            out.append(row)
        return out


# GenerationConfig fields whose logits processors transformers runs *before* a custom one (its
# ``_get_logits_processor``), with their neutral values: any other value changes the scores the
# recorder sees, so what it records would no longer be TRL's log softmax(logits / T).
PRE_CUSTOM_PROCESSORS = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0, "min_new_tokens": 0,
    "sequence_bias": None, "guidance_scale": 1.0, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "remove_invalid_values": False,
}


def distribution_changes(config: GenerationConfig | None, model_config: GenerationConfig | None = None) -> list[str]:
    """The settings that make the recorder inexact: ``config``'s (TRL's), or the model's own where
    ``config`` leaves a field unset (``generate`` fills those from the model's generation config)."""
    changed = []
    for name, neutral in PRE_CUSTOM_PROCESSORS.items():
        value = getattr(config, name, None)
        if value is None:
            value = getattr(model_config, name, None)
        if value is None or value == neutral or (isinstance(value, (list, tuple, dict)) and not value):
            continue
        changed.append(f"{name}={value!r}")
    return changed
