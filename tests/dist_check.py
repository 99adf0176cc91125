"""Run under `accelerate launch --num_processes 2 --cpu`: a prompt group split across processes must get
the advantages a single process computes from the same rewards and scores. Writes a JSON verdict."""

import gc
import json
import os
import sys

from capo_trl.testing.tiny import digit_reward, tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.advantages import capo_advantages

model_dir, out_dir, result_path = sys.argv[1:4]
args = CAPOConfig(
    output_dir=out_dir, per_device_train_batch_size=2, num_generations=4, max_completion_length=6, max_steps=3,
    learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False,
    save_strategy="no", logging_steps=1, seed=3, noise_mask=True, ref_high=1e6, ref_low=1.0, ref_cache_size=0,
    tau=0.6, tau_mode="absolute", advantage_scale="paper",  # the paper's advantage, which the check computes by hand
)
trainer = CAPOTrainer(model=model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
acc = trainer.accelerator
checks = []
original_scores, original_generate = trainer._rollout_scores, trainer._generate_and_score_completions
local = {}


def spy_scores(out, loss_mask, record):
    local["scores"] = original_scores(out, loss_mask, record)
    return local["scores"]


def spy_generate(inputs):
    out = original_generate(inputs)
    rewards = trainer._record.rewards
    all_scores = acc.gather(local["scores"])
    distributed = acc.gather(out["advantages"])
    single = capo_advantages(rewards, all_scores, 4, args.tau, args.advantage_normalization)
    mask_sum = acc.gather(out["completion_mask"].sum()).sum()
    checks.append({
        "max_abs_diff": (distributed - single).abs().max().item(),
        "nonzero": bool((single != 0).any()),
        "items_match": int(mask_sum) == int(out["num_items_in_batch"]),
        "group_spans_processes": acc.num_processes == 2 and len(inputs) == 2,
    })
    return out


trainer._rollout_scores, trainer._generate_and_score_completions = spy_scores, spy_generate
trainer.train()
if acc.is_main_process:
    with open(result_path, "w") as f:
        json.dump({"num_processes": acc.num_processes, "checks": checks}, f)
# Release the DDP-wrapped model before the process group goes (as `capo-trl train` does), then leave without
# interpreter teardown: gloo worker threads still holding tensors at finalization abort a rank with SIGABRT
# ("terminate called without an active exception") after the work is done, even after destroy_process_group.
trainer = original_scores = original_generate = None  # the bound methods hold the trainer too
acc.wait_for_everyone()
acc.free_memory()
gc.collect()
acc.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
