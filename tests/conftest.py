"""Offline fixtures: a tiny Qwen2 and a character-level tokenizer built from scratch, saved to a temp dir."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# On CUDA, transformers swaps in Hub kernels at from_pretrained by default; offline none can be fetched.
os.environ.setdefault("USE_HUB_KERNELS", "NO")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models gain nothing from intra-op threads, and with pytest-xdist on 2 cores extra threads
# oversubscribe the CPU (generation was measured 100x slower under contention).
torch.set_num_threads(1)

from capo_trl.testing.tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a saved tiny Qwen2ForCausalLM + tokenizer (random weights, ~60k parameters)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
