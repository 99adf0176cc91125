"""Shared prompt prefill: each distinct prompt forwarded once, the same samples as unshared generation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from capo_trl.data.arithmetic import embedded_model_path
from capo_trl.evaluation.prefill import prompt_groups, shared_prefill


def test_prompt_groups_point_each_row_at_the_first_row_of_its_run():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [0, 5, 6]])
    mask = torch.ones_like(ids)
    assert prompt_groups(ids, mask).tolist() == [0, 0, 2, 3, 3, 3]  # runs, not sets: row 3 starts a new one
    mask[1, 0] = 0
    assert prompt_groups(ids, mask).tolist() == [0, 1, 2, 3, 3, 3]  # the mask is part of the row


@pytest.fixture(scope="module")
def model_and_batch():
    path = embedded_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    rows = [tok(t).input_ids for t in ("Compute 12+34.", "Compute 5+7-3.", "Compute 40-2.") for _ in range(4)]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return model, tok, ids, mask


def _forwards(model):
    """Count the model's forwards and the rows of the prompt-length ones."""
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, k: seen.append(k["input_ids"].shape), with_kwargs=True)
    return seen, handle


@pytest.mark.parametrize("sample", [False, True])
def test_shared_prefill_draws_the_same_samples_with_one_prompt_forward_per_prompt(model_and_batch, sample):
    model, tok, ids, mask = model_and_batch
    config = GenerationConfig(max_new_tokens=12, do_sample=sample, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id, output_scores=True, return_dict_in_generate=True)
    torch.manual_seed(0)
    plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    seen, handle = _forwards(model)
    torch.manual_seed(0)
    try:
        with shared_prefill(model):
            shared = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        handle.remove()
    assert torch.equal(plain.sequences, shared.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(plain.scores, shared.scores)) < 1e-4  # rounding only
    assert seen[0] == (3, ids.shape[1] - 1)  # 3 distinct prompts, all but their last token
    assert all(shape[1] == 1 for shape in seen[1:])  # then one token per row and step
    assert "generate" not in model.__dict__  # unpatched after the block


def test_a_batch_without_repeats_or_with_other_inputs_goes_to_generate_unchanged(model_and_batch):
    model, tok, ids, mask = model_and_batch
    config = GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
    seen, handle = _forwards(model)
    try:
        with shared_prefill(model):
            model.generate(input_ids=ids[::4], attention_mask=mask[::4], generation_config=config)
    finally:
        handle.remove()
    assert seen[0] == ids[::4].shape  # the plain prefill: every row, every token


def test_capo_trainer_with_shared_prefill_trains_as_without(tmp_path):
    """Same seed, learning rate 0: the rollouts are the same completions with and without sharing."""
    from transformers import set_seed

    from capo_trl import CAPOConfig, CAPOTrainer
    from capo_trl.testing.tiny import build_tiny_model, digit_reward, tiny_dataset

    path = build_tiny_model(tmp_path / "m")
    completions = {}
    for share in (False, True):
        set_seed(0)
        args = CAPOConfig(output_dir=str(tmp_path / str(share)), num_generations=4, per_device_train_batch_size=8,
                          max_completion_length=8, max_steps=2, learning_rate=0.0, use_cpu=True, bf16=False,
                          report_to="none", save_strategy="no", logging_steps=1, activation_checkpointing=False,
                          noise_mask=False, share_prompt_prefill=share, log_completions=True)
        trainer = CAPOTrainer(model=path, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
        seen, handle = _forwards(trainer.model)
        trainer.train()
        handle.remove()
        assert seen[0][0] == (2 if share else 8)  # the first forward is the prompt's: 2 prompts, or all 8 rows
        completions[share] = list(trainer._logs["completion"])
        rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
        completions[(share, "rewards")] = rewards
    assert completions[True] == completions[False] and completions[(True, "rewards")] == completions[(False, "rewards")]
