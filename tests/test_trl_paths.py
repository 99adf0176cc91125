"""TRL's less common paths where they meet CAPO: truncated completions, scale_rewards, the mask's reference
with a model object or a non-identity adapter, the scoring pass of a dropout model, C2GSPG's refusals."""

import json
import math
import shutil
import warnings

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.testing.tiny import digit_reward, tiny_dataset

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2, learning_rate=1e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1,
    save_strategy="no", seed=7, temperature=1.0,
)
LOOSE = dict(noise_mask=True, ref_high=1e6, ref_low=1.0)  # the mask on; a random tiny model has reference PPL ~75: keep all
EOS = 1  # the tiny tokenizer's eos (pad is 0)


def capo_by_hand(rewards, scores, tau):
    """CAPO's advantage of one group, pair by pair (docs: A_i = sum_b w_ib sigma((s_b - s_i)/tau)/tau
    - sum_a w_ai sigma((s_i - s_a)/tau)/tau, divided by the group size)."""
    def sigma(x):
        return 1.0 / (1.0 + math.exp(-x))

    n = len(rewards)
    out = []
    for i in range(n):
        gain = sum(max(rewards[i] - rewards[b], 0) * sigma((scores[b] - scores[i]) / tau) / tau for b in range(n))
        loss = sum(max(rewards[a] - rewards[i], 0) * sigma((scores[i] - scores[a]) / tau) / tau for a in range(n))
        out.append((gain - loss) / n)
    return out


# ------------------------------------------------------------------------ mask_truncated_completions
# CAPO.md's worked example (tau 0.6): R = [1, 1, 0, 0, 0], s = [-0.2, -0.6, -0.3, -0.1, -0.9]. Here every wrong
# answer ran out of tokens: rows 2-4 have no EOS within max_completion_length.
WORKED_R = [1.0, 1.0, 0.0, 0.0, 0.0]
WORKED_S = [-0.20, -0.60, -0.30, -0.10, -0.90]
WORKED_GROUP = [0.4125, 0.5657, -0.3603, -0.4129, -0.2050]  # CAPO.md's table, "group (/5)"
COMPLETIONS = [[5, 6, EOS], [7, EOS], [5, 6, 7, 8], [8, 7, 6, 5], [9, 9, 9, 9]]


def scored_worked_example(tmp_path, monkeypatch, tiny_model_dir, **overrides):
    """One generation batch of the worked example through CAPOTrainer's own hooks: the completions are fixed,
    and the policy's token log-probs are s_i at every token of row i (so any forward scores them by hand)."""
    seen = {}

    def fixed_completions(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [list(c) for c in COMPLETIONS], None

    def designed_logps(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                       compute_aux_loss=False, **kw):
        rows = []
        for ids, attention in zip(input_ids, attention_mask):
            completion = ids[-logits_to_keep:].tolist()
            i = next(k for k, c in enumerate(COMPLETIONS) if completion[: len(c)] == c)
            seen.setdefault("attended", {})[i] = int(attention[-logits_to_keep:].sum())
            rows.append(torch.full((logits_to_keep,), WORKED_S[i]))
        return torch.stack(rows), None, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", fixed_completions)
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, "per_device_train_batch_size": 5, "num_generations": 5,
                                                   "max_completion_length": 4, "mask_truncated_completions": True,
                                                   "repetition_penalty": 1.1,  # no recording: CAPO's forward scores
                                                   "noise_mask": False, "tau": 0.6, "tau_mode": "absolute",
                                                   "advantage_scale": "paper", **overrides})  # the worked example's
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=lambda completions, **kw: list(WORKED_R), args=args,
                          train_dataset=tiny_dataset())
    trainer._get_per_token_logps_and_entropies = designed_logps
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"prompt": "what is 1?", "answer": "1"}] * 5)
    return trainer, out, seen


def test_truncated_completions_keep_their_place_in_capos_comparisons(tmp_path, monkeypatch, tiny_model_dir):
    trainer, out, seen = scored_worked_example(tmp_path, monkeypatch, tiny_model_dir)
    assert out["completion_mask"][2:].sum() == 0  # TRL left the truncated rows out of the loss...
    assert trainer._record.scores.tolist() == pytest.approx(WORKED_S)  # ...but s covers every generated token,
    assert [seen["attended"][i] for i in range(2, 5)] == [4, 4, 4]  # scored with the completion attended to
    by_hand = capo_by_hand(WORKED_R, WORKED_S, 0.6)
    assert out["advantages"].tolist() == pytest.approx(by_hand, abs=1e-6)
    assert by_hand == pytest.approx(WORKED_GROUP, abs=1e-4)


def test_matched_scale_counts_truncated_rows_on_both_sides(tmp_path, monkeypatch, tiny_model_dir):
    trainer, out, _ = scored_worked_example(tmp_path, monkeypatch, tiny_model_dir, advantage_scale="matched")
    mean = sum(WORKED_R) / 5
    std = math.sqrt(sum((r - mean) ** 2 for r in WORKED_R) / 4)  # TRL's unbiased group std
    grpo_l1 = sum(abs(r - mean) for r in WORKED_R) / (std + 1e-4)
    by_hand = capo_by_hand(WORKED_R, WORKED_S, 0.6)
    expected = [a * grpo_l1 / sum(abs(b) for b in by_hand) for a in by_hand]
    assert out["advantages"].tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("path", ["recorded", "forward", "old_logps"])
def test_truncated_rows_are_scored_over_every_generated_token_end_to_end(tiny_model_dir, tmp_path, path):
    """Real sampling on the tiny model: s of a truncated completion is the mean token log-prob of all its tokens
    under the sampling policy (an independent forward here), whichever way CAPO gets the log-probs."""
    extra = {"forward": dict(repetition_penalty=1.1), "old_logps": dict(num_iterations=2, max_steps=2)}.get(path, {})
    args = CAPOConfig(output_dir=str(tmp_path), mask_truncated_completions=True, **{**COMMON, **LOOSE, **extra})
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    seen = []
    original = trainer._rollout_scores

    def spy(out, loss_mask, record):
        s = original(out, loss_mask, record)
        ids = out["completion_ids"]
        generated = ((ids == EOS).cumsum(1) - (ids == EOS).long()) == 0  # up to and with the first EOS
        model = trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad():
            was = model.training
            model.eval()
            logits = model(input_ids=torch.cat([out["prompt_ids"], ids], 1),
                           attention_mask=torch.cat([out["prompt_mask"], generated.long()], 1)).logits
            model.train(was)
        logps = logits[:, out["prompt_ids"].size(1) - 1: -1].log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        by_hand = (logps * generated).sum(1) / generated.sum(1)
        seen.append((s, by_hand, out["completion_mask"].sum(1) == 0, "old_per_token_logps" in out,
                     record.rollout_logps is not None))
        return s

    trainer._rollout_scores = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    truncated = torch.cat([t for _, _, t, _, _ in seen])
    assert 0 < truncated.sum() < truncated.numel()  # both kinds of row in these batches
    for s, by_hand, _, from_trl, recorded in seen:
        assert (from_trl, recorded) == (path == "old_logps", path == "recorded")
        torch.testing.assert_close(s, by_hand, atol=1e-4, rtol=1e-4)
    assert all(math.isfinite(v) for v in (h["loss"] for h in trainer.state.log_history if "loss" in h))


# ------------------------------------------------------------------------ the scoring pass, dropout
def dropout_model(tiny_model_dir, tmp_path):
    path = tmp_path / "tiny-dropout"
    shutil.copytree(tiny_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.1}))
    return str(path)


def test_grpo_with_a_scoring_pass_and_dropout_is_bit_identical_to_grpotrainer(tiny_model_dir, tmp_path):
    """repetition_penalty != 1: CAPO scores the rollout with one forward of its own; it must not change training."""
    model = dropout_model(tiny_model_dir, tmp_path)
    settings = {**COMMON, "repetition_penalty": 1.1, "max_steps": 3}
    ours = CAPOTrainer(model=model, reward_funcs=digit_reward, train_dataset=tiny_dataset(),
                       args=CAPOConfig(output_dir=str(tmp_path / "capo"), advantage_estimator="grpo", **settings))
    assert not ours._records_rollout_logps()
    ours.train()  # build and train one after the other: a trainer's __init__ reseeds the global RNG
    theirs = GRPOTrainer(model=model, reward_funcs=digit_reward, train_dataset=tiny_dataset(),
                         args=GRPOConfig(output_dir=str(tmp_path / "grpo"), **settings))
    theirs.train()
    assert any(g > 0 for g in (h["grad_norm"] for h in theirs.state.log_history if "grad_norm" in h))
    mine, reference = ours.model.state_dict(), theirs.model.state_dict()
    assert all(torch.equal(mine[n], reference[n]) for n in reference)


def test_the_scoring_forward_leaves_rng_and_modes_as_it_found_them(tiny_model_dir, tmp_path):
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, "noise_mask": False})
    trainer = CAPOTrainer(model=dropout_model(tiny_model_dir, tmp_path), reward_funcs=digit_reward, args=args,
                          train_dataset=tiny_dataset())
    model = trainer.model
    model.train()
    model.model.layers[0].eval()  # a mixed state is restored module by module
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = {"prompt_ids": ids[:, :3], "prompt_mask": torch.ones(1, 3, dtype=torch.long),
           "completion_ids": ids[:, 3:], "completion_mask": torch.ones(1, 3, dtype=torch.long)}
    rng = torch.get_rng_state()
    first = trainer._forward_logps(model, out)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training
    assert torch.equal(trainer._forward_logps(model, out), first)  # no dropout noise in a score


# ------------------------------------------------------------------------ the mask's reference is the initial policy
def first_batch_ppl_gap(trainer) -> float:
    """Train one step; the largest |PPL_ref / PPL_policy - 1| over the first batch, which the initial policy
    sampled and scored: 0 (up to rounding) when the mask's reference is the initial policy."""
    seen = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        if not seen:
            seen.append((torch.exp(-trainer._record.scores), trainer._record.ref_ppl))
        return out

    trainer._generate_and_score_completions = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    policy, ref = seen[0]
    assert torch.isfinite(ref).all()
    return (ref / policy - 1).abs().max().item()


def test_beta_positive_with_a_model_object_references_the_model_as_passed(tiny_model_dir, tmp_path):
    """TRL reloads its reference from config._name_or_path; weights changed in memory must be in it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    initial = {n: p.clone() for n, p in model.state_dict().items()}
    args = CAPOConfig(output_dir=str(tmp_path), beta=0.04, **{**COMMON, **LOOSE, "max_steps": 1})
    trainer = CAPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    ref = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
    assert max((ref[n] - initial[n]).abs().max().item() for n in initial) == 0
    assert sum(m is trainer.ref_model for m in trainer.accelerator._models) <= 1  # TRL's reloaded copy is let go
    assert not any(m is not trainer.ref_model and m is not trainer.model for m in trainer.accelerator._models)
    assert first_batch_ppl_gap(trainer) < 1e-4


@pytest.mark.parametrize("init", [False, "pissa", "olora", "loha"])
def test_an_adapter_that_does_not_start_as_identity_is_copied_for_the_reference(tiny_model_dir, tmp_path, init):
    from peft import LoHaConfig, LoraConfig

    args = CAPOConfig(output_dir=str(tmp_path), ref_scoring="all", **{**COMMON, **LOOSE, "max_steps": 1})
    peft_config = (LoHaConfig(r=4, target_modules=["q_proj", "v_proj"], init_weights=False) if init == "loha" else
                   LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init))
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                          peft_config=peft_config)
    gap = first_batch_ppl_gap(trainer)
    assert gap < 1e-4, gap
    assert "ref" in trainer.model.peft_config


def test_a_fresh_lora_adapter_still_uses_the_base_model(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    args = CAPOConfig(output_dir=str(tmp_path), ref_scoring="all", **{**COMMON, **LOOSE, "max_steps": 1})
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert "ref" not in trainer.model.peft_config  # B = 0: the base is the initial policy, no copy needed
    assert first_batch_ppl_gap(trainer) < 1e-4


def test_a_prompt_learning_adapter_with_the_mask_is_refused_in_one_line(tiny_model_dir, tmp_path):
    from peft import PromptTuningConfig

    from capo_trl.errors import UsageError

    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, **LOOSE})
    with pytest.raises(UsageError, match=r"peft_config PromptTuningConfig: the noise mask's reference") as err:
        CAPOTrainer(model=tiny_model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(),
                    peft_config=PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------ settings a method would ignore
BASE = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none")


@pytest.mark.parametrize("scale", ["none", "batch", False])
def test_scale_rewards_that_paper_scale_would_ignore_is_refused(scale):
    with pytest.raises(ValueError, match=r"scale_rewards='(none|batch)' has no effect under advantage_scale='paper'"):
        CAPOConfig(scale_rewards=scale, tau_mode="absolute", advantage_scale="paper", **BASE)
    for advantage_scale in ("bounded", "matched"):  # these honour it
        assert CAPOConfig(scale_rewards=scale, advantage_scale=advantage_scale, **BASE).scale_rewards == \
            {False: "none"}.get(scale, scale)
    CAPOConfig(scale_rewards=scale, advantage_estimator="grpo", **BASE)  # TRL's own advantages honour it too


@pytest.mark.parametrize("setting", [
    dict(loss_type="grpo"), dict(loss_type="sapo"), dict(epsilon=0.3), dict(epsilon_high=0.28), dict(delta=2.0),
    dict(importance_sampling_level="sequence"), dict(entropy_coef=0.01), dict(use_adaptive_entropy=True),
    dict(top_entropy_quantile=0.2), dict(off_policy_mask_threshold=0.5),
])
def test_c2gspg_refuses_what_its_own_loss_ignores(setting):
    (name, value), = setting.items()
    with pytest.raises(ValueError, match=rf"^CAPOConfig\.{name}={value!r} is ignored by advantage_estimator='c2gspg'"):
        CAPOConfig(advantage_estimator="c2gspg", **setting, **BASE)
    CAPOConfig(advantage_estimator="grpo", **setting, **BASE)  # TRL's loss reads it


def test_c2gspg_refuses_the_vllm_importance_sampling_correction_it_would_ignore():
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_correction=True is ignored by advantage_estimator"):
        CAPOConfig(advantage_estimator="c2gspg", use_vllm=True, **BASE)
    CAPOConfig(advantage_estimator="c2gspg", use_vllm=True, vllm_importance_sampling_correction=False, **BASE)
    CAPOConfig(advantage_estimator="c2gspg", **BASE)  # the defaults: no vLLM, every loss field untouched
