"""SCAPO: its math by hand, its settings, and a CPU run on the embedded task through the method hooks alone."""

import math

import pytest
import torch

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.data.arithmetic import arithmetic_dataset, embedded_model_path
from capo_trl.methods.scapo import rewrite_prompt, scapo_strength, semifactual_drift, stability_weights

BASE = dict(output_dir="/tmp/capo-scapo-test", use_cpu=True, bf16=False, report_to="none")


def test_drift_is_the_mean_absolute_change_over_rewrites():
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    rewritten = torch.tensor([[[-1.5, -2.0, -0.5]], [[-0.5, -1.0, -0.5]]])  # K=2
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(semifactual_drift(logps, rewritten, mask), torch.tensor([[0.5, 0.5, 0.0]]))


def test_weights_lower_only_tokens_above_their_response_mean():
    drift = torch.tensor([[0.0, 0.0, 0.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(2, 4)
    w = stability_weights(drift, mask, strength=0.5)
    # row 0: mean 0.75, std 1.299; the drifting token is 1.73 std above: clamped to 1 -> weight 0.5
    torch.testing.assert_close(w[0], torch.tensor([1.0, 1.0, 1.0, 0.5]))
    torch.testing.assert_close(w[1], torch.ones(4))  # equal drift everywhere: nobody is relatively unstable
    assert (w <= 1).all() and (w >= 0.5).all()  # no extra credit for stability, at most `strength` taken away
    half = stability_weights(torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0, 1.0]]), 1.0)
    torch.testing.assert_close(half, torch.tensor([[1.0, 0.0]]))  # one std above: the full reduction


def test_schedule_and_rewrites():
    assert [scapo_strength(t, 0.5, 100) for t in (0, 50, 100, 500)] == [0.5, 0.25, 0.0, 0.0]
    assert rewrite_prompt("2+2=", "Question: {prompt}") == "Question: 2+2="
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert rewrite_prompt(chat, "{prompt}\n")[1]["content"] == "2+2?\n" and chat[1]["content"] == "2+2?"
    with pytest.raises(ValueError, match="last user message"):
        rewrite_prompt([{"role": "system", "content": "x"}], "Q: {prompt}")


@pytest.mark.parametrize("field, value", [("scapo_strength", 1.5), ("scapo_steps", 0),
                                          ("scapo_rewrites", ["no placeholder"]), ("scapo_rewrites", [])])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"CAPOConfig.{field}="):
        CAPOConfig(advantage_estimator="scapo", **{field: value}, **BASE)


def test_scapo_trains_on_the_embedded_task(tmp_path):
    from capo_trl.rewards import math_accuracy_reward

    args = CAPOConfig(output_dir=str(tmp_path), advantage_estimator="scapo", scapo_steps=2, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=24, max_steps=3, learning_rate=1e-3, bf16=False,
                      use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=0, temperature=1.0,
                      disable_tqdm=True)
    trainer = CAPOTrainer(model=embedded_model_path(), reward_funcs=math_accuracy_reward, args=args,
                          train_dataset=arithmetic_dataset("train", 64))
    seen, forwards = [], []
    original_gen, original_fwd = trainer._generate_and_score_completions, trainer._forward_logps

    def gen(inputs):
        out = original_gen(inputs)
        seen.append((out["advantages"].clone(), out["completion_mask"].clone()))
        return out

    def fwd(model, out, rows=None, shared=False):
        forwards.append(trainer.state.global_step)
        return original_fwd(model, out, rows, shared)

    trainer._generate_and_score_completions, trainer._forward_logps = gen, fwd
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert [r["scapo/strength"] for r in rows] == [0.5, 0.25, 0.0]  # early training only
    assert rows[0]["scapo/downweighted_frac"] > 0 and math.isfinite(rows[0]["scapo/drift_mean"])
    # while on: per-token advantages, lowered on some tokens of non-zero-advantage completions, never raised
    adv, mask = seen[0]
    assert adv.dim() == 2
    base = (adv.abs() * mask).amax(1, keepdim=True)  # the GRPO advantage: tokens at or below mean drift keep it
    lowered = (adv.abs() < base - 1e-7) & (mask > 0)
    assert lowered.any() and ((adv.abs() >= 0.5 * base - 1e-7) | (mask == 0)).all()  # at most `strength` off
    # 1 + 3 rewrites = 4 policy forwards per generation batch while on, none after the window
    assert forwards.count(0) == 4 and forwards.count(1) == 4 and forwards.count(2) == 0
    assert seen[2][0].dim() == 1  # plain GRPO advantages once the window is over
