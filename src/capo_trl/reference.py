"""Sequence scoring: rollout log-probs recorded during generation, and the reference-score cache.

CAPO needs, for each completion, its mean token log-prob under the policy that sampled it (the
score ``s``) and, for the noise mask, under the reference model. Both are paid for only when
they cannot be had for free: the rollout's log-probs are recorded while ``generate`` samples (no
second forward), and reference scores of completions seen before come from an LRU cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from contextlib import contextmanager

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import add_fused_lm_head, create_model_from_path, disable_dropout_in_model


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


def sequence_keys(prompt_ids, prompt_mask, completion_ids, loss_mask) -> list[bytes]:
    """A collision-resistant key per row: the unpadded prompt, the completion and its loss mask."""
    keys = []
    p_ids, p_mask = prompt_ids.cpu(), prompt_mask.cpu().bool()
    c_ids, l_mask = completion_ids.cpu(), loss_mask.cpu()
    for i in range(p_ids.size(0)):
        n = int(l_mask[i].nonzero().max()) + 1 if bool(l_mask[i].any()) else 0
        h = hashlib.blake2b(digest_size=16)
        h.update(p_ids[i][p_mask[i]].numpy().tobytes())
        h.update(b"|")
        h.update(c_ids[i, :n].numpy().tobytes())
        h.update(l_mask[i, :n].to(torch.int8).numpy().tobytes())
        keys.append(h.digest())
    return keys


class ReferenceScoreCache:
    """Bounded LRU map from a sequence key to its reference score (mean token log-prob).

    Each process caches what it scores. The reference must be frozen while entries live: call
    :meth:`clear` whenever it changes.
    """

    def __init__(self, max_size: int):
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}.")
        self.max_size = max_size
        self._data: OrderedDict[bytes, float] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: bytes) -> float | None:
        """The cached score, or None (counted as a lookup, so the hit rate can be logged)."""
        self.lookups += 1
        value = self._data.get(key)
        if value is not None:
            self.hits += 1
            self._data.move_to_end(key)
        return value

    def put(self, key: bytes, value: float) -> None:
        """Store a score, evicting the least recently used entries beyond ``max_size``."""
        if self.max_size == 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_size:
            self._data.popitem(last=False)

    def clear(self) -> None:
        """Forget every score: required whenever the reference model changes."""
        self._data.clear()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Entries in LRU order as tensors (checkpointed, so a resumed run hits the cache as the original did)."""
        keys = b"".join(self._data)
        key_size = len(next(iter(self._data))) if self._data else 16
        return {"keys": torch.frombuffer(bytearray(keys), dtype=torch.uint8).view(-1, key_size).clone()
                if keys else torch.zeros(0, key_size, dtype=torch.uint8),
                "values": torch.tensor(list(self._data.values()), dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`'s entries (the most recent ``max_size`` of them)."""
        self._data.clear()
        for key, value in zip(state["keys"], state["values"].tolist()):
            self.put(bytes(key.tolist()), value)


def build_reference(trainer, source) -> torch.nn.Module:
    """A frozen copy of the initial policy for ``trainer`` (a CAPOTrainer), prepared the way TRL prepares its own."""
    if isinstance(source, str):
        init_kwargs = dict(trainer.args.model_init_kwargs or {})
        if trainer.args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            init_kwargs["device_map"] = None
        if trainer._quantization_config is not None:
            init_kwargs["quantization_config"] = trainer._quantization_config
        init_kwargs.setdefault("trust_remote_code", trainer.args.trust_remote_code)
        init_kwargs.setdefault("dtype", trainer.model.dtype)
        init_kwargs.setdefault("attn_implementation", trainer.model.config._attn_implementation)
        ref = create_model_from_path(source, **init_kwargs)
    else:
        ref = source
    ref.requires_grad_(False)
    ref.eval()
    disable_dropout_in_model(ref)
    add_fused_lm_head(ref, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(ref, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        return prepare_fsdp(ref, trainer.accelerator)
    return trainer.accelerator.prepare_model(ref, evaluation_mode=True)
