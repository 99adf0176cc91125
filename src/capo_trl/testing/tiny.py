"""Builders shared by tests and benchmarks: a tiny offline model, tokenizer and dataset."""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from capo_trl.data.arithmetic import char_tokenizer

CHARS = list("0123456789+-*=.,?!abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ{}\\()")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    return char_tokenizer("".join(CHARS), CHAT_TEMPLATE)


def build_tiny_model(out_dir, seed: int = 0, hidden_size: int = 32, num_hidden_layers: int = 2) -> str:
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def tiny_dataset(n: int = 16) -> Dataset:
    """Prompts whose 'answer' is a digit; the toy reward below has variance under a random model."""
    return Dataset.from_list([{"prompt": f"what is {i % 10}?", "answer": str(i % 10)} for i in range(n)])


def digit_reward(completions, answer, **kwargs):
    """1.0 when the completion contains the answer digit: random models hit it often enough."""
    return [float(a in c) for c, a in zip(completions, answer)]
