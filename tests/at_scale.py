"""Run under `accelerate launch` (DeepSpeed on its CPU accelerator over gloo, or plain multi-CPU):
train CAPOTrainer the way a multi-GPU user does and write what the test compares as JSON.

    at_scale.py SPEC_JSON RESULT_JSON

SPEC: {"model_dir", "out", "model": "path"|"memory", "peft": bool, "vllm": bool, "resume": bool,
       "reward": "tied_on_rank_zero" (else digit_or_tie), "config": {CAPOConfig overrides}}.
RESULT (written by the main process): the logged rows, the number of reference forwards and rows
each process ran, the rows of each loss forward, the mask thresholds each process holds, and a
checksum of the trained weights.
"""

import faulthandler
import json
import os
import sys
import warnings

import torch
import vllm_standin
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.testing.deepspeed_cpu import skip_shm_comm_op

skip_shm_comm_op()  # an inference-only op DeepSpeed would compile first (minutes of CPU): see its module
faulthandler.dump_traceback_later(int(os.environ.get("AT_SCALE_DEADLINE", "240")), exit=True)  # a hang: stacks, fail
spec = json.loads(sys.argv[1])
result_path = sys.argv[2]
if spec.get("vllm"):
    vllm_standin.install()


seen = []  # (prompt, completion) pairs this process graded


def digit_or_tie(prompts, completions, answer, **kwargs):
    """Even answers: always right (a tied group, whose rows ref_scoring may skip); odd: right when the
    completion holds a digit, about half the time for a random tiny model (a mixed group)."""
    seen.extend(zip(prompts, completions))
    return [1.0 if int(a) % 2 == 0 else float(any(ch.isdigit() for ch in c)) for c, a in zip(completions, answer)]


def tied_on_rank_zero(completions, **kwargs):
    """Process 0's group all right (tied: every row skippable); process 1's mixed (no row skippable)."""
    if int(os.environ.get("RANK", "0")) == 0:
        return [1.0] * len(completions)
    return [float(i % 2 == 0) for i in range(len(completions))]


config = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=6, max_steps=2,
              learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False,
              logging_steps=1, save_strategy="no", seed=3, disable_tqdm=True, noise_mask=True, ref_high=1e6, ref_low=1.0)
config.update({"use_vllm": True} if spec.get("vllm") else {}, **spec.get("config", {}))
args = CAPOConfig(output_dir=spec["out"], **config)  # before the model: ZeRO-3's zero.Init needs the DS config

model = spec["model_dir"]
peft_config = None
if spec.get("model") == "memory":
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"])  # partitioned at load under ZeRO-3
if spec.get("peft"):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])

reward = tied_on_rank_zero if spec.get("reward") == "tied_on_rank_zero" else digit_or_tie
trainer = CAPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=tiny_dataset(),
                      peft_config=peft_config)
acc = trainer.accelerator
if spec.get("vllm"):
    trainer.vllm_generation.step_of = lambda: trainer.state.global_step  # a resumed run samples as an unbroken one
forwards = []  # (rows) of every reference forward this process ran
original = trainer._forward_logps


def counting(model_, out, rows=None, shared=False, lower=None):
    if model_ is trainer._capo_ref_model or trainer._capo_ref_model is None and model_ is trainer.model:
        forwards.append(out["completion_ids"].size(0) if rows is None else int(rows.numel()))
    return original(model_, out, rows, shared, lower)


trainer._forward_logps = counting
loss_forwards = []  # rows of every forward with gradient (the loss's) through the policy on this process
acc.unwrap_model(trainer.model).register_forward_pre_hook(
    lambda module, args, kwargs: loss_forwards.append(int(kwargs["input_ids"].size(0))) if torch.is_grad_enabled()
    else None, with_kwargs=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trainer.train(resume_from_checkpoint=True if spec.get("resume") else None)

with torch.no_grad():
    unwrapped = acc.unwrap_model(trainer.model_wrapped)
    if trainer.is_deepspeed_enabled and trainer._dist.is_zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(unwrapped.parameters())):
            checksum = sum(float(p.double().abs().sum()) for p in unwrapped.parameters())
    else:
        checksum = sum(float(p.double().abs().sum()) for p in unwrapped.parameters())
mine = {"graded": seen, "forwards": forwards, "loss_forwards": loss_forwards, "thresholds": list(trainer._mask.measured or []) if trainer._mask else None}
everyone = [None] * acc.num_processes
torch.distributed.all_gather_object(everyone, mine) if acc.num_processes > 1 else everyone.__setitem__(0, mine)
if acc.is_main_process:
    rows = [{k: v for k, v in r.items() if isinstance(v, (int, float)) or v is None} for r in trainer.state.log_history]
    with open(result_path, "w") as f:
        json.dump({"num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type),
                   "zero3": bool(trainer._dist.is_zero3), "ref_scoring": trainer._ref_scoring,
                   "own_reference": trainer._capo_ref_model is not None, "rows": rows, "processes": everyone,
                   "checksum": checksum, "global_step": trainer.state.global_step}, f)
if torch.distributed.is_initialized():
    torch.distributed.barrier()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # DeepSpeed's and gloo's teardown at interpreter exit can hang or abort a rank after the work is done
