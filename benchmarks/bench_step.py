"""Median wall time per training step: CAPOTrainer vs GRPOTrainer on the same tiny model and data.

Variants are alternated round by round in one process, so drift (thermal, other load) hits all
of them alike. The learning rate is 0, so every variant samples the very same completions (same
seed) and only the per-step overhead differs.
Prints the CAPO/GRPO ratios, CAPO's own overhead ``(CAPO - GRPO - reference forward) / GRPO``,
where the time goes, and (``--memory``) the peak resident memory of each variant, one process each.

``--tied``: instead, the workload of late math RL, where half of the groups tie (every completion of
a prompt right): a 4-layer, 384-wide Qwen2, 64 completions of up to 40 tokens a step. It prints
CAPO (defaults: beta 0, mask on) / TRL GRPO and ``advantage_estimator="grpo"`` / TRL GRPO (default,
and with ``skip_zero_advantage_rows=True``), with the fraction of rows the loss forward skipped.

    python benchmarks/bench_step.py [--rounds 5] [--steps 6] [--memory]
    python benchmarks/bench_step.py --tied [--rounds 3] [--steps 5] [--tied-hidden 384] [--tied-layers 4]
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
from transformers import Qwen2ForCausalLM, TrainerCallback
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.testing.tiny import build_tiny_model, digit_reward, tiny_dataset

MASK = dict(noise_mask=True, ref_high=1e6, ref_low=1.0)
VARIANTS = {
    "grpo beta=0": (GRPOTrainer, GRPOConfig, dict(beta=0.0)),
    "capo beta=0 (no mask)": (CAPOTrainer, CAPOConfig, dict(beta=0.0, noise_mask=False)),
    "capo beta=0 (mask, own reference, all)": (CAPOTrainer, CAPOConfig, dict(beta=0.0, ref_scoring="all", **MASK)),
    "capo beta=0 (mask, own reference, needed)": (CAPOTrainer, CAPOConfig, dict(beta=0.0, ref_scoring="needed", **MASK)),
    "grpo beta=0.04": (GRPOTrainer, GRPOConfig, dict(beta=0.04)),
    "capo beta=0.04 (mask, TRL reference)": (CAPOTrainer, CAPOConfig, dict(beta=0.04, **MASK)),
}
PAIRS = [  # (CAPO variant, its GRPO baseline)
    ("capo beta=0 (no mask)", "grpo beta=0"),
    ("capo beta=0 (mask, own reference, all)", "grpo beta=0"),
    ("capo beta=0 (mask, own reference, needed)", "grpo beta=0"),
    ("capo beta=0.04 (mask, TRL reference)", "grpo beta=0.04"),
]
TIED = {  # the --tied workload's variants
    "TRL GRPO": (GRPOTrainer, GRPOConfig, dict(beta=0.0)),
    "CAPO defaults (mask on)": (CAPOTrainer, CAPOConfig, dict(beta=0.0)),
    # loss_type grpo's normaliser ignores dropped rows, so the mask's reference skips the tied rows too
    "CAPO mask on, loss grpo": (CAPOTrainer, CAPOConfig, dict(beta=0.0, loss_type="grpo")),
    "CAPO grpo mode (default)": (CAPOTrainer, CAPOConfig, dict(beta=0.0, advantage_estimator="grpo")),
    "CAPO grpo mode, skip on": (CAPOTrainer, CAPOConfig, dict(beta=0.0, advantage_estimator="grpo",
                                                              skip_zero_advantage_rows=True)),
}
TIMED = ["_generate_single_turn", "_rollout_scores", "_reference_scores", "_log_calibration"]


class StepTimer(TrainerCallback):
    """Wall time of each step, and CPU time (what a shared machine's load does not inflate as much)."""

    def __init__(self):
        self.times, self.cpu_times = [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)
        self.cpu_times.append(time.process_time() - self.cpu_start)


def timed(trainer, name, sink):
    original = getattr(trainer, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[name].append(time.perf_counter() - start)

    setattr(trainer, name, wrapper)


def half_tied(completions, **kwargs):
    """The first half of the groups (8 completions each) all right, tied; in the others every other one right."""
    half = len(completions) // 2
    return [1.0 if i < half else float(i % 2 == 0) for i in range(len(completions))]


def run(variant, model_dir, steps, out_dir, parts, tied=False):
    trainer_cls, config_cls, extra = (TIED if tied else VARIANTS)[variant]
    batch = dict(per_device_train_batch_size=64, max_completion_length=40) if tied else dict(
        per_device_train_batch_size=16, max_completion_length=32)
    args = config_cls(
        output_dir=out_dir, num_generations=8, max_steps=steps, learning_rate=0.0, bf16=False, use_cpu=True,
        report_to="none", gradient_checkpointing=False, save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=0, **batch, **extra,
    )
    timer = StepTimer()
    trainer = trainer_cls(model=model_dir, reward_funcs=half_tied if tied else digit_reward, args=args,
                          train_dataset=tiny_dataset(64), callbacks=[timer])
    quiet = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "PrinterCallback"]
    for callback in quiet:  # the timings, not a metric dict per step
        trainer.remove_callback(callback)
    for name in TIMED:
        if hasattr(trainer, name):
            timed(trainer, name, parts)
    trainer.train()
    tied = [r["capo/mixed_group_frac"] for r in trainer.state.log_history if "capo/mixed_group_frac" in r]
    scored = [r["capo/ref_scored_frac"] for r in trainer.state.log_history if "capo/ref_scored_frac" in r]
    parts["_mixed_group_frac"] += tied
    parts["_ref_scored_frac"] += scored
    parts["_skipped_frac"] += [r["capo/skipped_frac"] for r in trainer.state.log_history if "capo/skipped_frac" in r]
    parts["_cpu"] += timer.cpu_times[1:]
    return timer.times[1:]  # the first step warms caches and allocators


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--memory", action="store_true", help="also measure peak memory, one process per variant")
    parser.add_argument("--memory-hidden", type=int, default=512)
    parser.add_argument("--memory-layers", type=int, default=4)
    parser.add_argument("--tied", action="store_true", help="the tied-groups workload (64 x 40 tokens a step)")
    parser.add_argument("--tied-hidden", type=int, default=384)
    parser.add_argument("--tied-layers", type=int, default=4)
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    if args.tied:
        return tied_workload(args.rounds, args.steps, args.tied_hidden, args.tied_layers)
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
    for capo, grpo in PAIRS:
        ref_ms = statistics.median(parts[capo]["_reference_scores"]) * 1000 if parts[capo]["_reference_scores"] else 0.0
        if "0.04" in capo:
            ref_ms = 0.0  # TRL computes the reference log-probs for its KL term in both variants
        own = (med[capo] - med[grpo] - ref_ms) / med[grpo]
        print(f"{capo:<44} {med[capo] / med[grpo]:.3f}x GRPO; reference forward {ref_ms:5.1f} ms; "
              f"CAPO's own overhead (CAPO - GRPO - reference) / GRPO = {100 * own:+.1f}%")
    for variant in VARIANTS:
        spent = {k: statistics.median(v) * 1000 for k, v in parts[variant].items() if v and k not in ("_mixed_group_frac", "_ref_scored_frac")}
        print(f"where time goes in '{variant}' (median ms per generation): "
              + ", ".join(f"{k.lstrip('_')} {ms:.1f}" for k, ms in spent.items()))
    mixed = parts["capo beta=0 (no mask)"]["_mixed_group_frac"]
    scored = parts["capo beta=0 (mask, own reference, needed)"]["_ref_scored_frac"]
    if mixed:
        print(f"groups with mixed rewards: {statistics.mean(mixed):.2f} of all (tied: {1 - statistics.mean(mixed):.2f}); "
              f"ref_scoring='needed' scored {statistics.mean(scored):.2f} of the completions")
    recorder_cost(args.hidden, args.layers)
    if args.memory:
        memory(args)


def tied_workload(rounds, steps, hidden=384, layers=4):
    """Half the groups tie: CAPO's and GRPO mode's median step over TRL GRPO's, variants alternated."""
    times, parts = defaultdict(list), {v: defaultdict(list) for v in TIED}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", hidden_size=hidden, num_hidden_layers=layers)
        for _ in range(rounds):
            for variant in TIED:
                times[variant] += run(variant, model_dir, steps, str(Path(tmp) / "out"), parts[variant], tied=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen2 hidden={hidden} layers={layers}; "
          f"64 completions x 40 tokens a step, half of the groups tied; {rounds} rounds x {steps - 1} steps")
    med = {v: statistics.median(t) for v, t in times.items()}
    cpu = {v: statistics.median(parts[v]["_cpu"]) for v in times}
    grpo, grpo_cpu = med["TRL GRPO"], cpu["TRL GRPO"]
    for variant, seconds in med.items():
        skipped = parts[variant]["_skipped_frac"]
        note = f"; skipped {statistics.mean(skipped):.2f} of the rows" if skipped else ""
        print(f"  {variant:<26} median {seconds:6.3f} s/step  {seconds / grpo:.3f}x TRL GRPO;  CPU "
              f"{cpu[variant]:6.3f} s/step  {cpu[variant] / grpo_cpu:.3f}x  (n={len(times[variant])}{note})")
    return {v: med[v] / grpo for v in med}, {v: statistics.mean(parts[v]["_skipped_frac"])
                                             for v in med if parts[v]["_skipped_frac"]}


def recorder_cost(hidden, layers, reps=30):
    """generate() alone vs with the rollout log-prob recorder, alternated: the recorder's share of sampling."""
    from capo_trl.evaluation.recorder import RolloutLogprobRecorder

    with tempfile.TemporaryDirectory() as tmp:
        model = Qwen2ForCausalLM.from_pretrained(build_tiny_model(Path(tmp) / "m", hidden_size=hidden,
                                                                  num_hidden_layers=layers)).eval()
    ids = torch.randint(3, 60, (16, 12))
    kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=True, pad_token_id=0)
    plain, recorded = [], []
    with torch.no_grad():
        for i in range(reps):
            torch.manual_seed(i)
            t = time.perf_counter()
            model.generate(ids, **kw)
            plain.append(time.perf_counter() - t)
            torch.manual_seed(i)
            with RolloutLogprobRecorder(1.0).attached(model):
                t = time.perf_counter()
                model.generate(ids, **kw)
                recorded.append(time.perf_counter() - t)
    a, b = statistics.median(plain) * 1000, statistics.median(recorded) * 1000
    print(f"rollout recorder: generate 16 x 32 tokens {a:.1f} ms, with the recorder {b:.1f} ms "
          f"(+{b - a:.1f} ms, {100 * (b - a) / a:+.1f}%)")


def _peak_rss_child(variant, hidden, layers, steps):
    """Train one variant in a fresh process; its peak resident set size (MiB)."""
    import subprocess

    code = (
        "import resource, sys, tempfile, warnings; warnings.filterwarnings('ignore');"
        "sys.path.insert(0, 'benchmarks'); import bench_step as b;"
        "from transformers.utils import logging; logging.set_verbosity_error();"
        "from collections import defaultdict; from pathlib import Path;"
        "d = tempfile.mkdtemp(); m = b.build_tiny_model(Path(d) / 'm', hidden_size=%d, num_hidden_layers=%d);"
        "b.run(%r, m, %d, d + '/o', defaultdict(list));"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    ) % (hidden, layers, variant, steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def memory(args):
    """Peak RSS of GRPO and CAPO at beta 0 on a larger model, and the reference copy's share of it."""
    hidden, layers = args.memory_hidden, args.memory_layers
    with tempfile.TemporaryDirectory() as tmp:
        model = Qwen2ForCausalLM.from_pretrained(build_tiny_model(Path(tmp) / "m", hidden_size=hidden,
                                                                  num_hidden_layers=layers))
        n_params = sum(p.numel() for p in model.parameters())
    names = ["grpo beta=0", "capo beta=0 (no mask)", "capo beta=0 (mask, own reference, all)"]
    peaks = {v: _peak_rss_child(v, hidden, layers, 3) for v in names}
    print(f"\npeak RSS, one process per variant, Qwen2 hidden={hidden} layers={layers} ({n_params / 1e6:.1f}M params, "
          f"fp32 copy {4 * n_params / 2**20:.0f} MiB):")
    for v, mib in peaks.items():
        print(f"  {v:<44} {mib:8.0f} MiB  ({mib - peaks['grpo beta=0']:+.0f} MiB vs GRPO)")


if __name__ == "__main__":
    main()
