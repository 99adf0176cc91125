"""share_lower_layers: the layers below a top-layer LoRA adapter run once per row, for the mask's reference and
the loss forward, and training is the same as running them twice.

Tolerance as in test_prompt_sharing.py: plain SGD, so a weight differs only by what the gradient differs, and the
gradient only by float32 rounding. Every run moves its weights by more than MOVED = 1e-4; a wrong state (another
row's, a shifted position, the reference's layers above the split) would be far over ATOL = 1e-7.
"""

import pytest
import torch
from capo_trl.testing.tiny import build_tiny_model, tiny_dataset
from peft import LoraConfig

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.errors import UsageError
from capo_trl.training.lower_layers import first_adapted_layer

ATOL, MOVED = 1e-7, 1e-4
COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=5e-2,
    optim="sgd", bf16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=5,
    disable_tqdm=True, activation_checkpointing=False, share_prompt_in_loss=True, noise_mask=True,
    ref_thresholds="fixed", ref_high=1e9, ref_low=1.0,  # the mask keeps every row: each one reaches the loss
)
CPU = dict(use_cpu=True, bf16=False, activation_checkpointing=False, share_prompt_in_loss=True, report_to="none")


def top(layers, first):
    return [f"layers.{i}.{m}" for i in range(first, layers) for m in ("self_attn.q_proj", "self_attn.v_proj")]


def mixed(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-3"), num_hidden_layers=3)


def train(model, out, lora, **overrides):
    trainer = CAPOTrainer(model=model, reward_funcs=mixed, train_dataset=tiny_dataset(), peft_config=lora,
                          args=CAPOConfig(output_dir=str(out), **{**COMMON, **overrides}))
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return trainer, start


def test_training_equals_running_the_lower_layers_twice(three_layers, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=top(3, 2))
    off, start = train(three_layers, tmp_path / "off", lora, share_lower_layers=False)
    on, _ = train(three_layers, tmp_path / "on", lora)
    assert off._lower is None and on._lower is not None and on._lower.first == 2
    shared = [r["capo/lower_layers_shared"] for r in on.state.log_history if "capo/lower_layers_shared" in r]
    assert shared == [1.0, 1.0, 1.0]  # every loss chunk of every step started above layer 2
    moved = 0.0
    for (name, a), b in zip(off.model.state_dict().items(), on.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
        moved = max(moved, (a - start[name]).abs().max().item())
    assert moved > MOVED
    ppl = [[r[k] for k in r if k.startswith("capo/ref_ppl")] for t in (off, on) for r in t.state.log_history[:1]]
    assert ppl[0] == pytest.approx(ppl[1], rel=1e-6)


def test_where_it_does_not_apply(three_layers, tmp_path):
    with pytest.raises(UsageError, match="share_lower_layers=True does not apply: the adapter starts at layer 0"):
        train(three_layers, tmp_path / "a", LoraConfig(r=4, target_modules=top(3, 0)), share_lower_layers=True)
    with pytest.raises(UsageError, match="share_lower_layers=True does not apply: the reference is a copy"):
        train(three_layers, tmp_path / "b", None, share_lower_layers=True)
    with pytest.raises(ValueError, match="share_lower_layers=True does not apply with share_prompt_in_loss=False"):
        CAPOConfig(output_dir=str(tmp_path), **{**CPU, "share_prompt_in_loss": False}, share_lower_layers=True)
    with pytest.raises(ValueError, match="share_lower_layers=True does not apply with beta=0.1"):
        CAPOConfig(output_dir=str(tmp_path), **CPU, share_lower_layers=True, beta=0.1)
    unset, _ = train(three_layers, tmp_path / "c", LoraConfig(r=4, target_modules=top(3, 0)), max_steps=1)
    assert unset._lower is None  # unset: off where it does not apply, and training runs


def test_split_layer(three_layers):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    def split(targets, **extra):
        model = AutoModelForCausalLM.from_pretrained(three_layers)
        return first_adapted_layer(get_peft_model(model, LoraConfig(r=2, target_modules=targets, **extra)))

    assert split(top(3, 1)) == 1
    assert split(["layers.2.mlp.down_proj"]) == 2
    assert split(top(3, 0)) is None
    assert split(top(3, 2), modules_to_save=["embed_tokens"]) is None  # a trained embedding changes every layer
