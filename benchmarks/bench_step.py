"""Median wall time per training step: CAPOTrainer vs GRPOTrainer on the same tiny model and data.

Variants are alternated round by round in one process, so drift (thermal, other load) hits all
of them alike. The learning rate is 0, so every variant samples the very same completions (same
seed) and only the per-step overhead differs.
Prints the CAPO/GRPO ratios and where CAPO's extra time goes.

    python benchmarks/bench_step.py [--rounds 5] [--steps 6]
"""

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import build_tiny_model, digit_reward, tiny_dataset  # noqa: E402

from capo_trl import CAPOConfig, CAPOTrainer  # noqa: E402

VARIANTS = {
    "grpo beta=0": (GRPOTrainer, GRPOConfig, dict(beta=0.0)),
    "capo beta=0 (mask, own reference)": (CAPOTrainer, CAPOConfig, dict(beta=0.0, ref_high=1e6, ref_low=1.0)),
    "grpo beta=0.04": (GRPOTrainer, GRPOConfig, dict(beta=0.04)),
    "capo beta=0.04 (mask, TRL reference)": (CAPOTrainer, CAPOConfig, dict(beta=0.04, ref_high=1e6, ref_low=1.0)),
}
TIMED = ["_generate_single_turn", "_rollout_scores", "_reference_scores", "_log_calibration"]


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def timed(trainer, name, sink):
    original = getattr(trainer, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[name].append(time.perf_counter() - start)

    setattr(trainer, name, wrapper)


def run(variant, model_dir, steps, out_dir, parts):
    trainer_cls, config_cls, extra = VARIANTS[variant]
    args = config_cls(
        output_dir=out_dir, per_device_train_batch_size=16, num_generations=8, max_completion_length=32,
        max_steps=steps, learning_rate=0.0, bf16=False, use_cpu=True, report_to="none",
        gradient_checkpointing=False, save_strategy="no", logging_steps=10**6, disable_tqdm=True, seed=0, **extra,
    )
    timer = StepTimer()
    trainer = trainer_cls(model=model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(64),
                          callbacks=[timer])
    for name in TIMED:
        if hasattr(trainer, name):
            timed(trainer, name, parts)
    trainer.train()
    return timer.times[1:]  # the first step warms caches and allocators


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", hidden_size=args.hidden, num_hidden_layers=args.layers)
        times = defaultdict(list)
        parts = {v: defaultdict(list) for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                times[variant] += run(variant, model_dir, args.steps, str(Path(tmp) / "out"), parts[variant])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen2 hidden={args.hidden} "
          f"layers={args.layers}; 16 completions x 32 tokens per step; {args.rounds} rounds x {args.steps - 1} steps")
    med = {v: statistics.median(t) * 1000 for v, t in times.items()}
    for variant, ms in med.items():
        print(f"  {variant:<38} median {ms:7.1f} ms/step  (n={len(times[variant])})")
    print(f"ratio capo/grpo at beta=0:    {med['capo beta=0 (mask, own reference)'] / med['grpo beta=0']:.3f}x")
    print(f"ratio capo/grpo at beta=0.04: {med['capo beta=0.04 (mask, TRL reference)'] / med['grpo beta=0.04']:.3f}x")
    for variant in VARIANTS:
        spent = {k: statistics.median(v) * 1000 for k, v in parts[variant].items() if v}
        print(f"where time goes in '{variant}' (median ms per generation): "
              + ", ".join(f"{k.lstrip('_')} {ms:.1f}" for k, ms in spent.items()))


if __name__ == "__main__":
    main()
