"""One RL step on a real model (SmolLM2-135M-Instruct, LoRA, CPU): CAPOTrainer against TRL's GRPOTrainer, and the levers.

Every variant trains the SmolLM2 recipes' setting (``examples/recipes/capo-smollm2-135m-lora-cpu.yaml``:
LoRA r 16 on the top 4 layers, 32 completions of <= 32 tokens a step, the ``addition`` task's
two-shot chat prompt) for ``--steps`` steps at learning rate 0, so every variant draws the same
completions and only the cost differs; variants run round by round in one process, one thread
(one core), so drift hits them alike. The first step of each variant is a warm-up and is not
counted. Printed per variant: seconds per step and its parts (generation, split into prompt
prefill and decoding; the rollout's scoring and rewards; the loss forward; backward and the
optimizer), then the ratios the targets name: CAPO's recipe / GRPO's recipe (the same levers), each
against TRL's GRPOTrainer at its defaults, and each lever turned off against the recipe.

    capo-trl fetch-model smollm2-135m-instruct
    python benchmarks/bench_real_step.py [--steps 2] [--rounds 1] [--variants NAME,NAME] [--tied]

``--tied``: half of the groups tie (their prompts are made answerable by every sample: the reward of
a tied prompt is 1 whatever the completion), the workload of late RL, where CAPO's loss skips them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import torch
from transformers.utils import logging as hf_logging

from capo_trl.data.benchmarks import load_benchmark
from capo_trl.data.models import resolve_model
from capo_trl.rewards import math_accuracy_reward

TOP4 = [f"layers.{layer}.{module}" for layer in range(26, 30) for module in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj")]
# the "CAPO recipe" variants: the recipe's method block when docs/training.md measured them, the embedded preset's
# (no noise mask); the recipe now has the paper's settings, the "CAPO paper settings" variant
CAPO = dict(advantage_estimator="capo", tau=0.5, tau_mode="relative", advantage_scale="matched", noise_mask=False)
# CAPOConfig's defaults, the paper's settings: the noise mask adds a reference forward to every step
PAPER = dict(advantage_estimator="capo", tau=0.6, tau_mode="absolute", advantage_scale="paper", noise_mask=True,
             ref_high=2.5, ref_low=1.05, ref_cache_size=0)
RECIPE = dict(num_generations=8, per_device_train_batch_size=32, max_completion_length=32, temperature=1.0, beta=0.0,
              learning_rate=0.0, lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
              logging_steps=100, save_strategy="no", activation_checkpointing=False, disable_tqdm=True)
SHARED = {"share_prompt_prefill": True, "share_prompt_in_loss": True}
# name -> (trainer, its config's extra fields, LoRA target modules, weights' dtype). "recipe": as the SmolLM2
# recipes ship (each prompt prefilled once for its samples and forwarded once in the loss, tied rows skipped).
VARIANTS = {
    "TRL GRPOTrainer": ("trl", {}, TOP4, torch.float32),
    "GRPO recipe": ("capo", {"advantage_estimator": "grpo", **SHARED, "skip_zero_advantage_rows": True}, TOP4,
                    torch.float32),
    "CAPO recipe": ("capo", {**CAPO, **SHARED}, TOP4, torch.float32),
    "CAPO recipe w/o prompt sharing in the loss": ("capo", {**CAPO, "share_prompt_prefill": True}, TOP4, torch.float32),
    "CAPO recipe w/o prompt sharing": ("capo", CAPO, TOP4, torch.float32),
    # activation checkpointing and sharing the prompt in the loss exclude each other
    "CAPO recipe + activation checkpointing": ("capo", {**CAPO, "share_prompt_prefill": True,
                                                       "activation_checkpointing": True}, TOP4, torch.float32),
    "CAPO recipe + LoRA on all layers": ("capo", {**CAPO, **SHARED}, "all-linear", torch.float32),
    "CAPO recipe + 16 completions": ("capo", {**CAPO, **SHARED, "per_device_train_batch_size": 16}, TOP4,
                                    torch.float32),
    "CAPO recipe + bf16 weights": ("capo", {**CAPO, **SHARED}, TOP4, torch.bfloat16),
    # the reference forward shares each prompt as the loss does (share_prompt_in_loss): both on, or both off
    "CAPO paper settings": ("capo", {**PAPER, **SHARED}, TOP4, torch.float32),
    "CAPO paper settings w/o prompt sharing in the loss": ("capo", {**PAPER, "share_prompt_prefill": True}, TOP4,
                                                           torch.float32),
    # the layers below the adapters run once per row for the reference and the loss (share_lower_layers, on by
    # default wherever it applies): off, as every step ran before it
    "CAPO paper settings w/o sharing the lower layers": ("capo", {**PAPER, **SHARED, "share_lower_layers": False},
                                                         TOP4, torch.float32),
    "GRPO recipe + bf16 weights": ("capo", {"advantage_estimator": "grpo", **SHARED, "skip_zero_advantage_rows": True},
                                   TOP4, torch.bfloat16),
    "CAPO paper settings + bf16 weights": ("capo", {**PAPER, **SHARED}, TOP4, torch.bfloat16),
}
PAIRS = [("CAPO recipe", "GRPO recipe"), ("GRPO recipe", "TRL GRPOTrainer"), ("CAPO recipe", "TRL GRPOTrainer"),
         ("CAPO recipe w/o prompt sharing in the loss", "CAPO recipe"),
         ("CAPO recipe w/o prompt sharing", "CAPO recipe"),
         ("CAPO recipe w/o prompt sharing", "CAPO recipe w/o prompt sharing in the loss"),
         ("CAPO recipe + activation checkpointing", "CAPO recipe w/o prompt sharing in the loss"),
         ("CAPO recipe + LoRA on all layers", "CAPO recipe"), ("CAPO recipe + 16 completions", "CAPO recipe"),
         ("CAPO recipe + bf16 weights", "CAPO recipe"), ("CAPO paper settings", "CAPO recipe"),
         ("CAPO paper settings w/o prompt sharing in the loss", "CAPO paper settings"),
         ("CAPO paper settings", "GRPO recipe"), ("CAPO paper settings w/o sharing the lower layers", "GRPO recipe"),
         ("CAPO paper settings", "CAPO paper settings w/o sharing the lower layers"),
         ("GRPO recipe + bf16 weights", "GRPO recipe"), ("CAPO paper settings + bf16 weights", "CAPO paper settings"),
         ("CAPO paper settings + bf16 weights", "GRPO recipe + bf16 weights")]
assert not any("," in name for name in VARIANTS)  # --variants splits on commas
# the default set; bf16 only where the CPU computes it natively (else ask for it by name)
DEFAULT = ["TRL GRPOTrainer", "GRPO recipe", "CAPO recipe", "CAPO recipe w/o prompt sharing in the loss",
           "CAPO recipe w/o prompt sharing", "CAPO recipe + activation checkpointing", "CAPO recipe + 16 completions"]


def cpu_has_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class Timer:
    """Wall time of named trainer methods, and of the prompt forwards inside generation (prefill)."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def wrap(self, obj, name, label):
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t

        setattr(obj, name, timed)

    def prefill(self, model):
        """Time every forward of more than one new token while generating: the prompt's."""
        timer = self

        def pre(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            module._bench_t = time.perf_counter() if ids is not None and ids.shape[-1] > 1 else None

        def post(module, args, kwargs, out):
            if getattr(module, "_bench_t", None) is not None and not torch.is_grad_enabled():
                timer.seconds["  prefill"] += time.perf_counter() - module._bench_t

        model.register_forward_pre_hook(pre, with_kwargs=True)
        model.register_forward_hook(post, with_kwargs=True)


def tied_reward(tied_ids):
    def reward(prompts, completions, id, **kwargs):
        base = math_accuracy_reward(prompts=prompts, completions=completions, **kwargs)
        return [1.0 if i in tied_ids else r for i, r in zip(id, base)]
    return reward


def build(name, model_path, dataset, reward, out):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from capo_trl import CAPOConfig, CAPOTrainer

    kind, extra, targets, dtype = VARIANTS[name]
    fields = {**RECIPE, **extra, "output_dir": out, "seed": 0}
    if kind == "trl":
        fields = {k: v for k, v in fields.items() if k in GRPOConfig.__dataclass_fields__}
    config = (GRPOConfig if kind == "trl" else CAPOConfig)(**fields)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
    cls = GRPOTrainer if kind == "trl" else CAPOTrainer
    trainer = cls(model=model, reward_funcs=reward, args=config, train_dataset=dataset, peft_config=lora)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the table below is the output
    if dtype != torch.float32:  # LoRA's own parameters stay float32, as PEFT's autocast_adapter_dtype makes them
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)
    timer = Timer()
    timer.wrap(trainer, "_generate_single_turn", " generation")
    timer.wrap(trainer, "_generate_and_score_completions", "rollout (generation, rewards, scoring)")
    timer.wrap(trainer, "compute_loss", "loss forward")
    if hasattr(trainer, "_reference_scores"):  # inside the rollout: the mask's reference forward (CAPOTrainer)
        timer.wrap(trainer, "_reference_scores", "  reference forward")
    timer.wrap(trainer, "training_step", "step")
    # generate() runs the base model's forward, not the PeftModel's: hook the base, which every forward reaches
    timer.prefill(trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model)
    return trainer, timer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="steps per variant and round (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", default=None, help=f"comma-separated (default: {', '.join(DEFAULT)}"
                        "; bf16 added where the CPU has AVX512-BF16 or AMX)")
    parser.add_argument("--tied", action="store_true", help="half of the groups tie")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", default=None, help="also write the medians, parts and ratios here as JSON")
    args = parser.parse_args(argv)
    names = args.variants.split(",") if args.variants else DEFAULT + (["CAPO recipe + bf16 weights"] * cpu_has_bf16())
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or args.steps < 2:
        sys.exit(f"unknown variants {unknown} (choose from {list(VARIANTS)}), or --steps < 2")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    model_path = resolve_model(args.model)
    dataset = load_benchmark("addition", split="train", limit=4 * (args.steps + 1) * args.rounds * 2)
    tied = set(dataset["id"][::2]) if args.tied else set()
    reward = tied_reward(tied)
    print(f"bf16 natively on this CPU: {cpu_has_bf16()}; torch threads: {torch.get_num_threads()}; "
          f"{'half of the groups tied' if args.tied else 'rewards as graded'}")
    per_step = defaultdict(list)
    parts = defaultdict(lambda: defaultdict(list))
    for _ in range(args.rounds):
        for name in names:
            with tempfile.TemporaryDirectory() as out:
                trainer, timer = build(name, model_path, dataset, reward, out)
                trainer.args.max_steps = args.steps
                durations = []

                class Clock:
                    last = None

                from transformers import TrainerCallback

                class Steps(TrainerCallback):
                    def on_step_begin(self, *a, **k):
                        Clock.last = (time.perf_counter(), dict(timer.seconds))

                    def on_step_end(self, *a, **k):
                        start, before = Clock.last
                        durations.append((time.perf_counter() - start,
                                          {k: v - before.get(k, 0.0) for k, v in timer.seconds.items()}))

                trainer.add_callback(Steps())
                trainer.train()
                skipped = [e["capo/skipped_frac"] for e in trainer.state.log_history if "capo/skipped_frac" in e]
            for seconds, split in durations[1:]:  # the first step warms caches up
                per_step[name].append(seconds)
                for label, value in split.items():
                    parts[name][label].append(value)
            parts[name]["skipped rows (frac)"] = skipped or [0.0]  # logged once, over the run's steps
            print(f"  {name}: {[round(s, 1) for s, _ in durations]} s per step", flush=True)
    print()
    labels = ["rollout (generation, rewards, scoring)", " generation", "  prefill", "  reference forward",
              "loss forward"]
    print(f"{'variant':44s} {'s/step':>7s} " + " ".join(f"{lab.strip()[:16]:>16s}" for lab in labels)
          + f" {'backward':>12s} {'skipped':>8s}")
    med = {}
    for name in names:
        med[name] = statistics.median(per_step[name])
        p = {lab: statistics.median(parts[name].get(lab, [0.0])) for lab in labels + ["step"]}
        backward = p["step"] - p["rollout (generation, rewards, scoring)"] - p["loss forward"]
        print(f"{name:44s} {med[name]:7.1f} " + " ".join(f"{p[lab]:16.1f}" for lab in labels)
              + f" {backward:12.1f} {statistics.median(parts[name]['skipped rows (frac)']):8.2f}")
    print()
    ratios = {}
    for a, b in PAIRS:
        if a in med and b in med:
            ratios[f"{a} / {b}"] = round(med[a] / med[b], 3)
            print(f"{a} / {b}: {med[a] / med[b]:.2f}x")
    if args.out:
        import json

        table = {name: {"s_per_step": round(med[name], 2), "steps": [round(s, 2) for s in per_step[name]],
                        **{lab.strip(): round(statistics.median(parts[name].get(lab, [0.0])), 2) for lab in labels}}
                 for name in names}
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "bf16_native": cpu_has_bf16(), "tied": args.tied,
                       "variants": table, "ratios": ratios}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
