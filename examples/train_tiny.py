"""Train CAPO for a few steps on a tiny randomly initialised model, fully offline on CPU.

This is a smoke run that shows the API and the logged calibration metrics; it learns nothing useful.
    python examples/train_tiny.py [--steps 5]
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from capo_trl import CAPOConfig, CAPOTrainer  # noqa: E402
from capo_trl.data.arithmetic import char_tokenizer  # noqa: E402


def tiny_model(path: str) -> str:
    tokenizer = char_tokenizer("0123456789+=? abcdefghijklmnopqrstuvwxyz")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         pad_token_id=0, eos_token_id=1))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def contains_answer(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Dataset.from_list([{"prompt": f"{i}+{i}=", "answer": str(i % 10)} for i in range(32)])
        config = CAPOConfig(
            output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=8, num_generations=4,
            max_completion_length=8, max_steps=args.steps, learning_rate=1e-3, logging_steps=1,
            bf16=False, use_cpu=True, activation_checkpointing=False, report_to="none", save_strategy="no",
            # a random model's reference perplexity is ~40: the paper's thresholds (2.5 / 1.05) would drop
            # every correct answer, so they are opened up here (the trainer warns when that happens).
            ref_high=1e6, ref_low=1.0,
        )
        trainer = CAPOTrainer(model=tiny_model(os.path.join(tmp, "model")), reward_funcs=contains_answer,
                              args=config, train_dataset=dataset)
        trainer.train()
        for row in trainer.state.log_history:
            if "capo/auroc" in row:
                print({k: row[k] for k in ("reward", "capo/auroc", "capo/mixed_group_frac", "capo/adv_abs_mean")})


if __name__ == "__main__":
    main()
