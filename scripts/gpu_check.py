"""CAPO vs GRPO step cost on one GPU, in bf16, with a model of a real size and no download.

Builds a randomly initialised Qwen2 with Qwen2.5-0.5B's shape (~494M parameters) and a synthetic
byte-level tokenizer from configs, saves them to a temp dir, and trains the same few steps in each
variant: GRPO; CAPO without the mask (no reference forward); CAPO with the mask (a frozen reference
copy and its forward); both with a LoRA adapter (the reference is the adapter-disabled base); both
where half of the groups tie (rows CAPO leaves out of the loss forward: `skipped_frac`); and
CAPO with the mask under single-process DeepSpeed ZeRO-3 (the reference partitioned too). Reports
median step time, tokens/s, peak GPU memory and the ratios to GRPO of the same kind, as one JSON.

Why random weights: the check measures what CAPO adds to a step (reference forward, scoring, the
advantage), which does not depend on what the model knows; a download is not possible on the target
machines. Completions of a random model rarely stop early, so both methods process the same tokens.

    python scripts/gpu_check.py --out runs/gpu_check          # on a GPU (about 5 minutes on an H200)
    python scripts/gpu_check.py --cpu-smoke --out /tmp/smoke  # 1 tiny step per method on CPU (tested)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback

from capo_trl import CAPOConfig, CAPOTrainer

# Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936): ~494M parameters.
SIZES = {
    "real": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def synthetic_tokenizer(vocab_size: int):
    """Byte-level BPE whose first 259 ids encode any text and whose remaining ids decode to ``<tN>``.

    A random model samples every id of its vocabulary, so each must decode; no merges are needed because
    prompts only have to encode, not to compress.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for char in bytes_to_unicode().values():
        vocab.setdefault(char, len(vocab))
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"<t{i}>", len(vocab))
        i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(out_dir: Path, size: str, seed: int = 0) -> tuple[str, int]:
    """Save a random Qwen2 of the given size and its tokenizer; returns (path, parameter count)."""
    spec = SIZES[size]
    tokenizer = synthetic_tokenizer(spec["vocab_size"])
    torch.manual_seed(seed)
    config = Qwen2Config(**spec, max_position_embeddings=2048, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir), sum(p.numel() for p in model.parameters())


def coin_reward(completions, **kwargs):
    """A deterministic fair coin per completion: every group has both classes, so every pair carries signal."""
    return [float(hashlib.sha256(str(c).encode()).digest()[0] & 1) for c in completions]


def half_tied_reward(completions, **kwargs):
    """The first half of each batch's groups all right (tied: no gradient, skipped), the rest a fair coin."""
    half = len(completions) // 2
    return [1.0 if i < half else r for i, r in enumerate(coin_reward(completions))]


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (GPU synchronised), generation included."""

    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def _sync(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.times.append(time.perf_counter() - self._start)


# name: (estimator, noise mask, LoRA, ZeRO-3); each CAPO variant is compared with the GRPO of its kind
VARIANTS = {
    "grpo": ("grpo", False, False, False),
    "capo_nomask": ("capo", False, False, False),
    "capo": ("capo", True, False, False),
    "grpo_lora": ("grpo", False, True, False),
    "capo_lora": ("capo", True, True, False),
    "grpo_tied": ("grpo", False, False, False),  # half the groups tie (half_tied_reward): rows CAPO skips
    "capo_tied": ("capo", True, False, False),
    "capo_zero3": ("capo", True, False, True),  # last: DeepSpeed's config stays live in the process
}
TIED = ("grpo_tied", "capo_tied")
BASELINE = {"capo_nomask": "grpo", "capo": "grpo", "capo_lora": "grpo_lora", "capo_tied": "grpo_tied",
            "capo_zero3": "grpo"}


def zero3_config(cpu: bool) -> dict:
    """Single-process ZeRO-3 (no offload): the reference copy is partitioned like the policy."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    if cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return {"zero_optimization": {"stage": 3}, "bf16": {"enabled": not cpu},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}


def installed(name: str) -> str:
    """The version the check ran with (the GPU machine's image mixes its own packages with carried wheels)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def run_method(variant: str, model_path: str, out_dir: Path, opts) -> dict:
    """Train ``warmup + steps`` steps of one variant; statistics over the steps after warm-up."""
    estimator, mask, lora, zero3 = VARIANTS[variant]
    cpu = opts.cpu_smoke
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    args = CAPOConfig(
        output_dir=str(out_dir), advantage_estimator=estimator, noise_mask=mask,
        deepspeed=zero3_config(cpu) if zero3 else None,
        ref_high=1e9, ref_low=1.0,  # the mask and its reference forward run, but a random model's PPL drops nothing
        per_device_train_batch_size=opts.prompts * opts.num_generations, num_generations=opts.num_generations,
        max_completion_length=opts.completion_length, max_steps=opts.warmup + opts.steps, learning_rate=1e-6,
        temperature=1.0, beta=0.0, bf16=not cpu, use_cpu=cpu, gradient_checkpointing=False, report_to="none",
        save_strategy="no", logging_steps=1, seed=opts.seed, disable_tqdm=True,
    )
    dataset = Dataset.from_list([{"prompt": f"Compute {i}+{2 * i + 1}.", "answer": str(3 * i + 1)}
                                 for i in range(opts.prompts * (opts.warmup + opts.steps) * 2)])
    gc.collect()  # the previous method's trainer must not count in this one's peak
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    reward = half_tied_reward if variant in TIED else coin_reward
    trainer = CAPOTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=dataset,
                          peft_config=peft_config)
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "num_tokens" in row]
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip([{"num_tokens": 0}] + logs, logs)]
    skipped = [row["capo/skipped_frac"] for row in trainer.state.log_history if "capo/skipped_frac" in row]
    measured = slice(opts.warmup, None)
    times, toks = timer.times[measured], tokens[measured]
    step_time = statistics.median(times) if times else float("nan")
    result = {
        "variant": variant,
        "estimator": estimator,
        "noise_mask": mask,
        "lora": lora,
        "zero3": zero3,
        "steps_measured": len(times),
        "step_time_s": step_time,
        "step_times_s": times,
        "tokens_per_step": statistics.median(toks) if toks else float("nan"),
        "tokens_per_s": (sum(toks) / sum(times)) if times and sum(times) > 0 else float("nan"),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "deepspeed": trainer.is_deepspeed_enabled,
        "has_reference_copy": trainer._capo_ref_model is not None,
        "ref_ppl_logged": any("capo/ref_ppl_mean" in row for row in trainer.state.log_history),
        "skipped_frac": statistics.mean(skipped) if skipped else 0.0,  # rows left out of the loss forward
        "final_step": trainer.state.global_step,
    }
    del trainer
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny model, 1 step per method on CPU: checks the script, measures nothing")
    parser.add_argument("--out", default="runs/gpu_check", help="directory for gpu_check.json")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per method (default 4; smoke 1)")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured first steps (default 1; smoke 0)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8; smoke 2)")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=None, help="max new tokens (default 128; smoke 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    opts = parser.parse_args(argv)
    smoke = opts.cpu_smoke
    opts.steps = opts.steps if opts.steps is not None else (1 if smoke else 4)
    opts.warmup = opts.warmup if opts.warmup is not None else (0 if smoke else 1)
    opts.prompts = opts.prompts if opts.prompts is not None else (2 if smoke else 8)
    opts.completion_length = opts.completion_length or (8 if smoke else 128)
    if smoke:
        from capo_trl.testing.deepspeed_cpu import skip_shm_comm_op

        opts.num_generations = min(opts.num_generations, 4)
        torch.set_num_threads(1)
        skip_shm_comm_op()  # its ZeRO-3 variant on the CPU accelerator: an inference-only op not compiled
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --cpu-smoke to check the script on a CPU.", file=sys.stderr)
        return 2

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: dict = {}
    n_params = 0

    def ratio(a, b, key):
        x, y = results.get(a, {}).get(key), results.get(b, {}).get(key)
        return x / y if x and y else None

    def write_report() -> dict:
        """Written after every variant: a run stopped at its time limit keeps what it measured."""
        ratios = {f"{name}_over_{base}": {"step_time": ratio(name, base, "step_time_s"),
                                           "peak_memory": ratio(name, base, "peak_memory_gib")}
                  for name, base in BASELINE.items() if name in results and base in results}
        report = {
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not smoke else "cpu",
            "mode": "cpu-smoke" if smoke else "gpu",
            "versions": {name: installed(name) for name in ("torch", "transformers", "trl", "accelerate", "peft",
                                                            "deepspeed", "capo-trl")},
            "parameters": n_params,
            "settings": {k: getattr(opts, k) for k in ("steps", "warmup", "prompts", "num_generations",
                                                       "completion_length", "seed")},
            "results": results,
            "ratios": ratios,
            "wall_s": time.time() - started,
        }
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
        return report

    with tempfile.TemporaryDirectory() as tmp:
        model_path, n_params = build_model(Path(tmp) / "model", "tiny" if smoke else "real", opts.seed)
        for name in [v for v in VARIANTS if v in opts.variants.split(",")]:
            try:
                results[name] = run_method(name, model_path, Path(tmp) / name, opts)
            except Exception as err:  # one failing variant must not lose the others' numbers
                results[name] = {"variant": name, "error": f"{type(err).__name__}: {err}"[:2000]}
                print(f"gpu_check: {name} failed: {results[name]['error']}", file=sys.stderr)
            print(f"gpu_check: {name} done at {time.time() - started:.0f} s", flush=True)
            write_report()
    report = write_report()
    ratios = report["ratios"]
    print(f"gpu_check ({report['mode']}, {report['device']}, {n_params / 1e6:.0f}M parameters, "
          f"{opts.prompts} prompts x {opts.num_generations} completions of <= {opts.completion_length} tokens)")
    print(f"{'variant':>12} {'step s':>8} {'tokens/s':>10} {'peak GiB':>9}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:>12} failed: {r['error'][:100]}")
            continue
        mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:>12} {r['step_time_s']:8.3f} {r['tokens_per_s']:10.0f} {mem:>9}  skipped {r['skipped_frac']:.2f}")
    for name, r in ratios.items():
        time_ratio = f"{r['step_time']:.3f}x" if r["step_time"] else "-"
        mem_ratio = f"{r['peak_memory']:.3f}x" if r["peak_memory"] else "-"
        print(f"{name}: step time {time_ratio}, peak memory {mem_ratio}")
    print(f"wrote {out / 'gpu_check.json'}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
