"""Where ``s`` and the reference come from on the less travelled paths: a PeftModel with a trained adapter,
logits processors that change the sampling distribution, the entropy bonus, multimodal row subsets, and
the collective rule of sharded forwards."""

import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from capo_trl.testing.tiny import digit_reward, tiny_dataset
from transformers import AutoModelForCausalLM, GenerationConfig

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.advantages import mean_token_logprob
from capo_trl.evaluation.recorder import PRE_CUSTOM_PROCESSORS, distribution_changes
from capo_trl.training.scoring import collective_rows

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2, learning_rate=1e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1, save_strategy="no",
    seed=7, noise_mask=True, ref_high=1e6, ref_low=1.0,
)


def make(model, tmp_path, peft_config=None, **overrides):
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, **overrides})
    return CAPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                       peft_config=peft_config)


def trained_adapter(model_dir):
    """A PeftModel whose LoRA is not zero (as after an earlier fine-tuning run)."""
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return model


def test_a_trained_adapter_is_part_of_the_reference(tiny_model_dir, tmp_path):
    model = trained_adapter(tiny_model_dir)
    trainer = make(model, tmp_path)
    seen = {}
    original = trainer._reference_scores

    def spy(out, loss_mask, record, want=None):
        ref = original(out, loss_mask, record, want)
        if "initial" not in seen:  # the first batch: the policy has not moved yet, so reference == policy
            seen["initial"] = mean_token_logprob(trainer._forward_logps(trainer.model, out), loss_mask)
            seen["ref"] = ref
        return ref

    trainer._reference_scores = spy
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".ref." in n}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert before and all(not p.requires_grad for n, p in trainer.model.named_parameters() if ".ref." in n)
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in before)  # frozen
    torch.testing.assert_close(seen["ref"], seen["initial"], atol=1e-5, rtol=1e-5)
    assert trainer.model.active_adapter == "default"


@pytest.mark.parametrize("setting", [
    {"min_new_tokens": 3}, {"no_repeat_ngram_size": 2}, {"suppress_tokens": [5, 6]}, {"bad_words_ids": [[7]]},
    {"repetition_penalty": 1.3},
])
def test_processors_that_change_the_distribution_turn_the_recorder_off(tiny_model_dir, tmp_path, setting):
    trainer = make(tiny_model_dir, tmp_path, noise_mask=False, generation_kwargs=setting)
    assert not trainer._records_rollout_logps()
    seen = []
    original = trainer._rollout_scores

    def spy(out, loss_mask, record):
        s = original(out, loss_mask, record)
        seen.append((s, mean_token_logprob(trainer._forward_logps(trainer.model, out), loss_mask)))
        return s

    trainer._rollout_scores = spy
    trainer.train()
    for s, forward in seen:  # s is TRL's log softmax(logits / T), not the processed distribution
        torch.testing.assert_close(s, forward, atol=1e-5, rtol=1e-5)


def test_the_recorder_stays_on_for_plain_sampling_and_reads_the_models_own_config(tiny_model_dir, tmp_path):
    assert make(tiny_model_dir, tmp_path, noise_mask=False)._records_rollout_logps()
    assert distribution_changes(GenerationConfig(), GenerationConfig(no_repeat_ngram_size=3)) == [
        "no_repeat_ngram_size=3"]  # generate fills unset fields from the model's generation config
    assert distribution_changes(GenerationConfig(repetition_penalty=1.0), GenerationConfig(repetition_penalty=1.2)) == []


def test_the_list_covers_every_processor_transformers_runs_before_a_custom_one(tiny_model_dir):
    """Each listed field, set, adds a processor ahead of ours; with none set, only sampling warpers follow."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    values = {"repetition_penalty": 1.2, "encoder_repetition_penalty": 1.2, "no_repeat_ngram_size": 2,
              "encoder_no_repeat_ngram_size": 2, "bad_words_ids": [[3]], "min_length": 3, "min_new_tokens": 2,
              "sequence_bias": {(3,): -1.0}, "guidance_scale": 1.5, "forced_bos_token_id": 1,
              "forced_eos_token_id": 1, "exponential_decay_length_penalty": (2, 1.1), "suppress_tokens": [4],
              "begin_suppress_tokens": [4], "remove_invalid_values": True}
    assert set(values) == set(PRE_CUSTOM_PROCESSORS)
    class Marker:
        def __call__(self, input_ids, scores):
            return scores

    plain = GenerationConfig(do_sample=True, eos_token_id=1, max_length=20)
    plain._eos_token_tensor = torch.tensor([1])
    base = model._get_logits_processor(plain, input_ids_seq_length=4, encoder_input_ids=torch.ones(1, 4).long(),
                                       logits_processor=[Marker()], device="cpu")
    assert type(base[0]).__name__ == "Marker"  # nothing before the custom processor when nothing is set
    for name, value in values.items():
        config = GenerationConfig(do_sample=True, eos_token_id=1, max_length=20, **{name: value})
        config._eos_token_tensor = torch.tensor([1])
        try:
            procs = model._get_logits_processor(config, input_ids_seq_length=4,
                                                encoder_input_ids=torch.ones(1, 4).long(),
                                                logits_processor=[Marker()], device="cpu",
                                                model_kwargs={"use_cache": True})
        except (ValueError, TypeError):
            continue  # a setting this decoder-only model refuses cannot reach the recorder either
        before = [type(p).__name__ for p in procs[: [type(p).__name__ for p in procs].index("Marker")]]
        if name not in ("encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "guidance_scale"):
            assert before, f"{name}: no processor ahead of the custom one"
        assert distribution_changes(config) == [f"{name}={value!r}"]


@pytest.mark.parametrize("entropy", [dict(entropy_coef=0.01), dict(use_adaptive_entropy=True)])
def test_auto_does_not_skip_reference_rows_with_an_entropy_bonus(tiny_model_dir, tmp_path, entropy):
    assert make(tiny_model_dir, tmp_path, loss_type="grpo")._ref_scoring == "needed"
    assert make(tiny_model_dir, tmp_path, loss_type="grpo", **entropy)._ref_scoring == "all"


def test_multimodal_batches_score_every_row(tiny_model_dir, tmp_path):
    trainer = make(tiny_model_dir, tmp_path, loss_type="grpo")
    advantages = torch.tensor([0.0, 1.0, -1.0, 0.0])
    assert trainer._ref_rows({}, advantages, "train").tolist() == [False, True, True, False]
    out = {"pixel_values": torch.zeros(3, 8), "image_grid_thw": torch.ones(2, 3)}  # per image, not per row
    assert trainer._ref_rows(out, advantages, "train") is None
    with pytest.raises(ValueError, match="not per row"):
        trainer._forward_logps(trainer.model, {**out, "prompt_ids": torch.ones(4, 2).long()}, rows=advantages != 0)


def test_collective_rows_equalises_the_row_counts():
    want = torch.tensor([True, False, False, True, False])
    assert collective_rows(want, torch.tensor([2, 4])).sum() == 4
    assert collective_rows(want, torch.tensor([2, 4]))[want].all()  # every wanted row stays
    assert torch.equal(collective_rows(want, torch.tensor([2, 0])), want)
    assert collective_rows(torch.zeros(3, dtype=torch.bool), torch.tensor([0, 3])).all()
