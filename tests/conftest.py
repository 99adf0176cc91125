"""Offline fixtures: a tiny Qwen2 and a character-level tokenizer built from scratch, saved to a temp dir."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# On CUDA, transformers swaps in Hub kernels at from_pretrained by default; offline none can be fetched.
os.environ.setdefault("USE_HUB_KERNELS", "NO")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models gain nothing from intra-op threads, and with pytest-xdist on 2 cores extra threads
# oversubscribe the CPU (generation was measured 100x slower under contention).
torch.set_num_threads(1)

from capo_trl.testing.tiny import build_tiny_model  # noqa: E402

# The project's own reporting (the result pages' renderers, the studies' result constants) lives in scripts/, out of
# the package: tests import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a saved tiny Qwen2ForCausalLM + tokenizer (random weights, ~60k parameters)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


def pytest_collection_modifyitems(config, items):
    """The real vLLM engine's module first (it runs on one worker, its xdist group, minutes), then the end-to-end runs
    marked slow: the other worker shares out the rest meanwhile, and no long test starts last."""
    def engine(item):
        return any(mark.args == ("vllm-engine",) for mark in item.iter_markers("xdist_group"))

    items.sort(key=lambda item: (not engine(item), item.get_closest_marker("slow") is None))
