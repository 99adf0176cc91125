"""CAPO vs GRPO step cost on one GPU, with a mid-size model of a real architecture and no download.

Builds a randomly initialised Qwen2 (~170M parameters) and a synthetic byte-level tokenizer from
configs, saves them to a temp dir, and trains the same few steps with ``advantage_estimator="capo"``
(noise mask on, so the frozen reference copy and its forward are paid for) and ``"grpo"``. Reports
median step time, tokens/s, peak GPU memory and the CAPO/GRPO ratios, and writes them as JSON.

Why random weights: the check measures what CAPO adds to a step (reference forward, scoring, the
advantage), which does not depend on what the model knows; a download is not possible on the target
machines. Completions of a random model rarely stop early, so both methods process the same tokens.

    python scripts/gpu_check.py --out runs/gpu_check          # on a GPU (about 2-4 minutes)
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402

from capo_trl import CAPOConfig, CAPOTrainer  # noqa: E402

# hidden 1024, 12 layers, 16 heads of 64 (4 KV heads), vocab 32768: ~170M parameters, Qwen2 as shipped.
SIZES = {
    "mid": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                num_key_value_heads=4, vocab_size=32768),
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


def run_method(estimator: str, model_path: str, out_dir: Path, opts) -> dict:
    """Train ``warmup + steps`` steps with one estimator; statistics over the steps after warm-up."""
    cpu = opts.cpu_smoke
    args = CAPOConfig(
        output_dir=str(out_dir), advantage_estimator=estimator, noise_mask=estimator == "capo",
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
    trainer = CAPOTrainer(model=model_path, reward_funcs=coin_reward, args=args, train_dataset=dataset)
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "num_tokens" in row]
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip([{"num_tokens": 0}] + logs, logs)]
    measured = slice(opts.warmup, None)
    times, toks = timer.times[measured], tokens[measured]
    step_time = statistics.median(times) if times else float("nan")
    result = {
        "estimator": estimator,
        "steps_measured": len(times),
        "step_time_s": step_time,
        "step_times_s": times,
        "tokens_per_step": statistics.median(toks) if toks else float("nan"),
        "tokens_per_s": (sum(toks) / sum(times)) if times and sum(times) > 0 else float("nan"),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "has_reference_copy": trainer._capo_ref_model is not None,
        "ref_ppl_logged": any("capo/ref_ppl_mean" in row for row in trainer.state.log_history),
        "final_step": trainer.state.global_step,
    }
    del trainer
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny model, 1 step per method on CPU: checks the script, measures nothing")
    parser.add_argument("--out", default="runs/gpu_check", help="directory for gpu_check.json")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per method (default 5; smoke 1)")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured first steps (default 1; smoke 0)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8; smoke 2)")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=None, help="max new tokens (default 256; smoke 8)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    smoke = opts.cpu_smoke
    opts.steps = opts.steps if opts.steps is not None else (1 if smoke else 5)
    opts.warmup = opts.warmup if opts.warmup is not None else (0 if smoke else 1)
    opts.prompts = opts.prompts if opts.prompts is not None else (2 if smoke else 8)
    opts.completion_length = opts.completion_length or (8 if smoke else 256)
    if smoke:
        opts.num_generations = min(opts.num_generations, 4)
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --cpu-smoke to check the script on a CPU.", file=sys.stderr)
        return 2

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model_path, n_params = build_model(Path(tmp) / "model", "tiny" if smoke else "mid", opts.seed)
        results = {m: run_method(m, model_path, Path(tmp) / m, opts) for m in ("grpo", "capo")}
    capo, grpo = results["capo"], results["grpo"]
    report = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not smoke else "cpu",
        "mode": "cpu-smoke" if smoke else "gpu",
        "parameters": n_params,
        "settings": {k: getattr(opts, k) for k in ("steps", "warmup", "prompts", "num_generations",
                                                   "completion_length", "seed")},
        "results": results,
        "capo_over_grpo_step_time": capo["step_time_s"] / grpo["step_time_s"],
        "capo_over_grpo_peak_memory": (capo["peak_memory_gib"] / grpo["peak_memory_gib"]
                                       if capo["peak_memory_gib"] and grpo["peak_memory_gib"] else None),
        "wall_s": time.time() - started,
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"gpu_check ({report['mode']}, {report['device']}, {n_params / 1e6:.0f}M parameters, "
          f"{opts.prompts} prompts x {opts.num_generations} completions of <= {opts.completion_length} tokens)")
    print(f"{'method':>6} {'step s':>8} {'tokens/s':>10} {'peak GiB':>9}")
    for name in ("grpo", "capo"):
        r = results[name]
        mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:>6} {r['step_time_s']:8.3f} {r['tokens_per_s']:10.0f} {mem:>9}")
    ratio_mem = report["capo_over_grpo_peak_memory"]
    print(f"CAPO/GRPO step time {report['capo_over_grpo_step_time']:.3f}x"
          + (f", peak memory {ratio_mem:.3f}x" if ratio_mem else "") + f"; wrote {out / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
