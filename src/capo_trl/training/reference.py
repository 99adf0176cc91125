"""The reference model and the reference-score cache.

CAPO needs, for each completion, its mean token log-prob under the policy that sampled it (the
score ``s``) and, for the noise mask, under the reference model. Both are paid for only when
they cannot be had for free: the rollout's log-probs are recorded while ``generate`` samples
(:mod:`~capo_trl.evaluation.recorder`), and reference scores of completions seen before come from an
LRU cache.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib

import torch
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import (
    add_fused_lm_head,
    create_model_from_path,
    disable_dropout_in_model,
)

from ..cache import LRU
from ..errors import UsageError


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
        self._data = LRU(max_size)  # sequence key -> reference score
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
        return value

    def put(self, key: bytes, value: float) -> None:
        """Store a score, evicting the least recently used entries beyond ``max_size``."""
        self._data.put(key, value)

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

    def load_state_dict(self, state: dict[str, torch.Tensor], merge: bool = False) -> None:
        """Restore :meth:`state_dict`'s entries (the most recent ``max_size`` of them); ``merge`` keeps the current ones."""
        if not merge:
            self._data.clear()
        for key, value in zip(state["keys"], state["values"].tolist()):
            self.put(bytes(key.tolist()), value)


def snapshot(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the initial policy, taken before TRL patches or trains ``model``.

    Under ZeRO-3 a model loaded after the DeepSpeed config exists is already partitioned (every
    parameter has numel 0 on this process), and a deep copy would copy the empty shards: gather the
    full parameters once, into a fresh unpartitioned model that :func:`build_reference` partitions anew.
    """
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        return copy.deepcopy(model)
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    ref = type(model)(copy.deepcopy(model.config))  # a plain constructor: no zero.Init, full tensors
    ref.load_state_dict(state)  # every key: a partial copy would be a wrong reference
    ref.tie_weights()
    return ref.to(next(iter(state.values())).dtype)


def check_peft_reference(peft_config, mask_on: bool) -> None:
    """A prompt-learning adapter (prefix or prompt tuning) has no reference the mask could use: disabling it
    drops its virtual tokens, which are part of the initial policy, and it cannot hold a frozen copy."""
    if mask_on and peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
        raise UsageError(f"peft_config {type(peft_config).__name__}: the noise mask's reference must be the initial "
                         "policy, which a prompt-learning adapter cannot give (disabling it drops its virtual tokens); "
                         "use a LoRA-type adapter, or noise_mask=False.")


def adapter_is_identity(model) -> bool:
    """Whether a fresh PeftModel's active adapter adds nothing yet, so the base model (adapter disabled) is the
    initial policy: LoRA whose B matrices are all zero (PEFT's default init).

    ``init_lora_weights=False`` draws B at random; PiSSA, OLoRA, LoftQ and CorDA put the adapter's share of
    the weights in A and B and take it out of the base; other adapter types are not assumed to start at zero.
    """
    from peft import LoraConfig

    name = model.active_adapter
    if not isinstance(model.peft_config[name], LoraConfig):
        return False
    b = [p for n, p in model.named_parameters()
         if name in n.split(".") and {"lora_B", "lora_embedding_B"} & set(n.split("."))]
    partitioned = [p for p in b if hasattr(p, "ds_id")]  # ZeRO-3: look at the full tensors
    with _gathered(partitioned):
        return bool(b) and all(not bool(p.detach().any()) for p in b)


def _gathered(params):
    """DeepSpeed's gather of partitioned parameters (read only), or nothing to do."""
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def add_reference_adapter(model) -> None:
    """A frozen copy of a PeftModel's active adapter as adapter ``"ref"``: the initial policy is base + adapter.

    Disabling the adapter gives the base model, which is the initial policy only for an adapter that starts
    as the identity (:func:`adapter_is_identity`); a trained one, or one initialised otherwise, must be
    copied. TRL does the same for a trained adapter when beta > 0. The copy is made with the plain init
    (PiSSA and its kin would take their share out of the base a second time), then overwritten.
    """
    name = model.active_adapter
    if any(hasattr(p, "ds_id") for n, p in model.named_parameters() if name in n.split(".")):
        raise UsageError("the noise mask needs a frozen copy of the initial adapter as its reference, which cannot be "
                         "made once ZeRO-3 has partitioned the adapter; use an adapter that starts as the identity "
                         "(LoRA's default init), or noise_mask=False.")
    config = copy.deepcopy(model.peft_config[name])
    for init in ("init_lora_weights", "init_weights"):
        if hasattr(config, init):
            setattr(config, init, True)
    model.add_adapter("ref", config)
    for param_name, param in model.named_parameters():
        parts = param_name.split(".")
        if name in parts:  # e.g. ...q_proj.lora_B.default.weight, or a ParameterDict entry ...hada_w1_a.default
            ref = model.get_parameter(".".join("ref" if part == name else part for part in parts))
            ref.data.copy_(param.data)
            ref.requires_grad_(False)


def shard_blocks(model: torch.nn.Module, **fully_shard_kwargs) -> int:
    """FSDP2-shard each decoder block (``model._no_split_modules``) on its own; returns how many.

    ``fully_shard`` on the root alone (TRL's ``prepare_fsdp``) makes one unit of the whole model, so
    every forward gathers all of it on every process. One unit per block gathers one block at a time.
    """
    from torch.distributed.fsdp import fully_shard

    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    for block in blocks:
        fully_shard(block, **fully_shard_kwargs)
    return len(blocks)


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
        plugin = trainer.accelerator.state.fsdp_plugin
        if plugin.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            mesh = getattr(trainer.accelerator, "torch_device_mesh", None)
            dims = tuple(trainer.accelerator.parallelism_config.fsdp_dim_names) if mesh is not None else None
            shard_blocks(ref, mesh=mesh[dims] if mesh is not None else None, reshard_after_forward=True,
                         mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy())
        return prepare_fsdp(ref, trainer.accelerator)  # the root (and FSDP1's auto-wrap) as TRL does
    return trainer.accelerator.prepare_model(ref, evaluation_mode=True)
