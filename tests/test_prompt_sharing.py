"""share_prompt_in_loss: each distinct prompt of a micro-batch runs once in the loss forward, and the trained
weights equal those of TRL's forward of every row.

Tolerance as in test_skipping.py: plain SGD, so a weight differs only by what the gradient differs, and the
gradient only by float32 rounding (the prompt's forward runs over fewer rows, the completion's over a cache).
Measured: <= 4e-9 after 3 steps; ATOL = 1e-7 is one ulp at 1.0, while every run moves its weights by more
than MOVED = 1e-4: a shifted position, a wrong mask or a prompt gradient counted once instead of per row would
be far over it.
"""

import contextlib

import pytest
import torch
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer

ATOL, MOVED = 1e-7, 1e-4
COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=3, learning_rate=5e-2,
    optim="sgd", bf16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=5,
    disable_tqdm=True, activation_checkpointing=False,
)


def mixed(completions, **kwargs):
    """Every group mixed, so every row carries gradient."""
    return [float(i % 2) for i in range(len(completions))]


@contextlib.contextmanager
def counting_shared_forwards(module):
    """The rows of every call of ``module.shared_prompt_logps`` while inside (the name the module calls)."""
    calls, real = [], module.shared_prompt_logps

    def counted(*args, **kwargs):
        calls.append(args[1].size(0))
        return real(*args, **kwargs)

    module.shared_prompt_logps = counted
    try:
        yield calls
    finally:
        module.shared_prompt_logps = real


def train(model, out, peft_config=None, **overrides):
    import capo_trl.training.losses as losses

    trainer = CAPOTrainer(model=model, reward_funcs=mixed, train_dataset=tiny_dataset(), peft_config=peft_config,
                          args=CAPOConfig(output_dir=str(out), **{**COMMON, **overrides}))
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with counting_shared_forwards(losses) as calls:
        trainer.train()
    return trainer, start, calls


@pytest.mark.parametrize("setting", [
    dict(advantage_estimator="capo"),
    dict(advantage_estimator="grpo", num_iterations=2, loss_type="grpo"),
    dict(advantage_estimator="capo", skip_zero_advantage_rows=False, loss_type="dr_grpo"),
    dict(advantage_estimator="capo", lora=True),
], ids=["capo", "grpo-2-iterations", "capo-no-skipping", "capo-lora"])
def test_weights_equal_trls_forward_of_every_row(tiny_model_dir, tmp_path, setting):
    setting = dict(setting)
    peft_config = None
    if setting.pop("lora", False):
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"])
    off, start, unused = train(tiny_model_dir, tmp_path / "off", peft_config, **setting)
    on, _, calls = train(tiny_model_dir, tmp_path / "on", peft_config, share_prompt_in_loss=True, **setting)
    assert not unused and len(calls) >= 3  # the shared forward ran in every step's loss, and only when asked
    moved = 0.0
    for (name, a), b in zip(off.model.state_dict().items(), on.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
        moved = max(moved, (a - start[name]).abs().max().item())
    assert moved > MOVED
    for r_off, r_on in zip(*([r for r in t.state.log_history if "loss" in r] for t in (off, on))):
        assert r_on.get("reward") == r_off.get("reward")  # the same completions were sampled
        assert r_on.get("entropy") == pytest.approx(r_off.get("entropy"), rel=1e-5)


def test_the_shared_forward_equals_trls_on_left_padded_groups(tiny_model_dir, tmp_path):
    """Log-probs and entropies row by row, with groups of different prompt lengths (left padding) interleaved."""
    from capo_trl.training.prompt_sharing import shared_prompt_logps

    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=mixed, train_dataset=tiny_dataset(),
                          args=CAPOConfig(output_dir=str(tmp_path), **COMMON))
    torch.manual_seed(0)
    vocab = trainer.model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,)) for n in (7, 4, 7)]  # the first and third differ, of one length
    width, completion = 9, 5
    ids, mask = [], []
    for row in range(12):  # rows of the three prompts interleaved, as a shuffled batch has them
        p = prompts[row % 3]
        c = torch.randint(3, vocab, (completion,))
        ids.append(torch.cat([torch.zeros(width - len(p), dtype=torch.long), p, c]))
        cmask = torch.ones(completion, dtype=torch.long)
        cmask[completion - row % 3:] = 0  # some completions end early
        mask.append(torch.cat([torch.zeros(width - len(p), dtype=torch.long), torch.ones(len(p), dtype=torch.long),
                               cmask]))
    ids, mask = torch.stack(ids), torch.stack(mask)
    want, want_entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, completion,
                                                                       compute_entropy=True)
    got, entropy = shared_prompt_logps(trainer.model, ids, mask, completion, 5, True, trainer.accelerator.autocast)
    real = mask[:, -completion:].bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy[real], want_entropy[real], rtol=0, atol=1e-5)


def test_it_is_refused_where_it_cannot_work(tmp_path):
    base = {**COMMON, "output_dir": str(tmp_path), "share_prompt_in_loss": True}
    with pytest.raises(ValueError, match="share_prompt_in_loss=True does not work with activation_checkpointing"):
        CAPOConfig(**{**base, "activation_checkpointing": True})
    with pytest.raises(ValueError, match="share_prompt_in_loss=True does not work with advantage_estimator='simko'"):
        CAPOConfig(**{**base, "advantage_estimator": "simko"})


@pytest.mark.parametrize("lora", [False, True], ids=["own-reference", "lora-reference"])
def test_the_masks_reference_forward_shares_prompts_too(tiny_model_dir, tmp_path, lora):
    """With share_prompt_in_loss the noise mask's reference forward runs each prompt once as well: the reference
    scores equal the unshared forward's to float rounding (1e-5 on a mean token log-prob), through a separate
    reference model and through PEFT's reference adapter."""
    import capo_trl.training.scoring as scoring

    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=mixed, train_dataset=tiny_dataset(), peft_config=peft_config,
                          args=CAPOConfig(output_dir=str(tmp_path), noise_mask=True, ref_cache_size=0,
                                          share_prompt_in_loss=True, **COMMON))
    torch.manual_seed(1)
    vocab, rows, prompt, completion = trainer.model.config.vocab_size, 8, 6, 5
    base = torch.randint(3, vocab, (2, prompt)).repeat_interleave(4, dim=0)  # two groups of four rows
    out = {"prompt_ids": base, "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
           "completion_ids": torch.randint(3, vocab, (rows, completion)),
           "completion_mask": torch.ones(rows, completion, dtype=torch.long)}
    out["completion_mask"][::3, 3:] = 0
    loss_mask = out["completion_mask"].float()

    class Record:
        ref_cache_start = None
    with counting_shared_forwards(scoring) as calls:
        shared = trainer._reference_scores(out, loss_mask, Record())
        trainer.args.share_prompt_in_loss = False
        unshared = trainer._reference_scores(out, loss_mask, Record())
    assert calls == [rows]  # the shared forward ran once, for the first call only
    torch.testing.assert_close(shared, unshared, rtol=0, atol=1e-5)
    assert torch.isfinite(shared).all()
