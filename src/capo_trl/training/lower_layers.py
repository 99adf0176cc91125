"""The decoder layers below a PEFT adapter, run once per row for the reference and the policy.

Why: with LoRA on a model's top layers (the SmolLM2 recipes train the top 4 of 30), the layers below the lowest
adapted one compute the same hidden states for the policy and for the noise mask's reference (the adapter
disabled, or the frozen ``"ref"`` adapter on the same modules): nothing below is trained or adapted, so those
states are a function of the tokens alone. The reference forward records the hidden states entering the lowest
adapted layer; the loss forward of the same rows starts from them and runs only the adapted layers. The mask then
costs the adapted layers and the LM head of one no-grad forward, not a whole one.

Both forwards are :func:`~capo_trl.training.prompt_sharing.shared_prompt_logps` (``share_prompt_in_loss``): a row
is keyed by its token ids and attention mask, and a chunk whose rows were not all recorded runs in full.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch
from torch import nn


def _decoder_layers(model) -> tuple[nn.Module, nn.ModuleList] | None:
    """The decoder (the module whose forward loops over ``layers``) of a PEFT-wrapped causal LM, or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(base, "get_decoder", None)
    decoder = get() if callable(get) else None
    layers = getattr(decoder, "layers", None)
    if decoder is None or not isinstance(layers, nn.ModuleList) or len(layers) < 2:
        return None
    return decoder, layers


def first_adapted_layer(model) -> int | None:
    """Index of the lowest decoder layer holding an adapter or a trainable parameter, when everything below it
    (embeddings included) is frozen, adapter-free and dropout-free; None when there is no such split."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found = _decoder_layers(model)
    if found is None:
        return None
    decoder, layers = found
    types = getattr(decoder.config, "layer_types", None)
    if types is not None and len(set(types)) > 1:
        return None  # the cache's per-layer types would not follow the renumbered top layers

    def touched(module) -> bool:
        return any(p.requires_grad for p in module.parameters()) or any(
            isinstance(m, BaseTunerLayer) for m in module.modules())

    first = next((i for i, layer in enumerate(layers) if touched(layer)), None)
    if not first:  # None (nothing adapted) or 0 (nothing below)
        return None
    below = [decoder.get_input_embeddings(), *layers[:first]]
    if any(touched(m) for m in below):
        return None
    noisy = any((isinstance(m, nn.Dropout) and m.p > 0) or float(getattr(m, "attention_dropout", 0.0) or 0.0) > 0
                for part in below for m in part.modules())
    return None if noisy else first


def _key(ids: torch.Tensor, mask: torch.Tensor) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(ids.cpu().numpy().tobytes())
    digest.update(b"|")
    digest.update(mask.cpu().to(torch.int8).numpy().tobytes())
    return digest.digest()


def row_keys(ids: torch.Tensor, mask: torch.Tensor) -> list[bytes]:
    """One key per row of a forward's inputs: its token ids and attention mask (shapes included in the bytes)."""
    return [_key(ids[i], mask[i]) for i in range(ids.size(0))]


class LowerLayerStates:
    """Hidden states entering the lowest adapted layer, per row, from the reference forward of one batch.

    ``record`` (a context) stores them while the reference runs; :meth:`replay` then lets the policy's forward of
    rows found here run the adapted layers only. :meth:`clear` each generation batch bounds the memory to one
    batch's rows (one hidden state per token, like one layer's input).
    """

    def __init__(self, model, first: int):
        self.model, self.first = model, first
        self._decoder, self._layers = _decoder_layers(model)
        self._states: dict[bytes, torch.Tensor] = {}
        self._recording = False
        self.replayed = self.forwarded = 0  # chunks of the policy's forwards: started from the states / all

    def clear(self) -> None:
        self._states.clear()

    @contextlib.contextmanager
    def recording(self):
        self._recording = True
        try:
            yield self
        finally:
            self._recording = False

    def find(self, keys: list[bytes]) -> list[torch.Tensor] | None:
        """Every key's state, or None when any is missing (or while recording: the reference runs in full)."""
        if self._recording:
            return None
        states = [self._states.get(k) for k in keys]
        return None if any(s is None for s in states) else states

    @contextlib.contextmanager
    def capture(self, keys: list[bytes]):
        """Store, under ``keys`` (one per row), the hidden states entering the first adapted layer in this call."""
        if not self._recording:
            yield
            return
        layer = self._layers[self.first]

        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            for key, row in zip(keys, hidden.detach()):
                self._states[key] = row

        handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def replay(self):
        """The decoder with its adapted layers only, renumbered from 0 (so a fresh cache's first layer is theirs):
        a forward given ``inputs_embeds=`` the recorded states runs what the full forward runs above them."""
        decoder, layers = self._decoder, self._layers
        top = list(layers[self.first:])
        shifted = [(m, m.layer_idx) for layer in top for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)]
        for module, index in shifted:
            module.layer_idx = index - self.first
        decoder.layers = nn.ModuleList(top)
        try:
            yield
        finally:
            decoder.layers = layers
            for module, index in shifted:
                module.layer_idx = index


def lower_layer_states(trainer, args) -> LowerLayerStates | None:
    """The states a :class:`~capo_trl.CAPOTrainer` shares, or None where ``share_lower_layers`` does not apply
    (``True`` there is an error: the config refuses what it can see, this what only the model says)."""
    from ..errors import UsageError

    if args.share_lower_layers is False or not (args.noise_mask and args.beta == 0.0 and args.share_prompt_in_loss):
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    first = None
    if trainer._capo_ref_model is not None or not hasattr(model, "peft_config"):
        why = "the reference is a copy of the model, not the policy with its PEFT adapter disabled"
    elif trainer._sharded:
        why = "ZeRO-3 or FSDP (every forward gathers every layer on every process)"
    else:
        first = first_adapted_layer(model)
        why = ("the adapter starts at layer 0, or something below its lowest layer is trainable or has dropout, "
               "or the model has no decoder layer list" if first is None else "")
    if first is None:
        if args.share_lower_layers:
            raise UsageError(f"CAPOConfig.share_lower_layers=True does not apply: {why}; leave it unset.")
        return None
    return LowerLayerStates(model, first)


__all__ = ["LowerLayerStates", "first_adapted_layer", "lower_layer_states", "row_keys"]
