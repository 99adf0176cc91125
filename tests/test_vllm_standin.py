"""TRL's own vLLM branch of GRPOTrainer, run on a CPU through a stand-in engine (``vllm_standin.py`` says
what the stand-in does not cover), for what the real engine's tests (``test_vllm_engine.py``: colocated, one
configuration per engine start) do not run: every built-in method, the importance-sampling correction off, beta > 0,
and server mode's gather, main-process generation and broadcast in training. Without vLLM installed these are the
only vLLM tests that run."""

import math
import warnings

import pytest
import torch
import vllm_standin
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.advantages import mean_token_logprob
from capo_trl.methods import BUILTIN

COMMON = dict(
    per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=2, learning_rate=1e-2,
    bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False, logging_steps=1, save_strategy="no",
    seed=7, use_vllm=True, noise_mask=True, ref_high=1e6, ref_low=1.0,
)


def any_digit(completions, **kwargs):
    """Right about half the time for a random tiny model: groups mix, so advantages are not all zero."""
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


@pytest.fixture(autouse=True)
def standin(monkeypatch):
    vllm_standin.StandInVLLMGeneration.instances.clear()
    vllm_standin.install(monkeypatch)


def train(model_dir, tmp_path, **overrides):
    args = CAPOConfig(output_dir=str(tmp_path), **{**COMMON, **overrides})
    trainer = CAPOTrainer(model=model_dir, reward_funcs=any_digit, args=args, train_dataset=tiny_dataset())
    seen = []
    original = trainer._rollout_scores

    def spy(out, loss_mask, record):  # s as CAPO takes it, next to the policy's own forward of the same rows
        s = original(out, loss_mask, record)
        seen.append((s, mean_token_logprob(trainer._forward_logps(trainer.model, out), loss_mask),
                     "old_per_token_logps" in out, record.rollout_logps is not None))
        return s

    trainer._rollout_scores = spy
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    changed = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    return trainer, seen, changed


def logged(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h]


# correction on at beta 0 (TRL's defaults) runs on the real engine (test_vllm_engine.py)
@pytest.mark.parametrize("correction, beta", [(False, 0.0), (True, 0.04), (False, 0.04)])
def test_capo_with_the_mask_trains_through_trls_vllm_branch(tiny_model_dir, tmp_path, correction, beta):
    trainer, seen, changed = train(tiny_model_dir, tmp_path, beta=beta, vllm_importance_sampling_correction=correction,
                                   noise_mask=True)
    engine = vllm_standin.StandInVLLMGeneration.instances[-1]
    assert trainer.use_vllm and engine.calls == 2 and engine.syncs >= 1
    assert not trainer._records_rollout_logps() and len(seen) == 2
    for s, forward, from_trl, recorded in seen:
        assert from_trl == correction and not recorded  # IS correction: TRL's old log-probs; else one forward
        # s is the sampling policy's own mean token log-prob (the same weights scored the same rows)
        torch.testing.assert_close(s, forward, atol=1e-5, rtol=1e-5)
    assert changed > 0
    assert len(logged(trainer, "capo/ref_ppl_mean")) == 2 and len(logged(trainer, "capo/kept_frac")) == 2
    assert (trainer._capo_ref_model is None) == (beta > 0)  # beta > 0: TRL's reference log-probs serve the mask


@pytest.mark.parametrize("method", [m.name for m in BUILTIN if m.name != "capo"])
def test_every_method_with_the_mask_trains_through_trls_vllm_branch(tiny_model_dir, tmp_path, method):
    # C2GSPG's loss has no importance ratio: it refuses TRL's correction, so CAPO scores with its own forward
    extra = {"beta": 0.0, "vllm_importance_sampling_correction": False} if method == "c2gspg" else {}
    trainer, seen, changed = train(tiny_model_dir, tmp_path, advantage_estimator=method, noise_mask=True, **extra)
    assert vllm_standin.StandInVLLMGeneration.instances[-1].calls == 2
    assert all(math.isfinite(v) for v in logged(trainer, "loss")) and len(logged(trainer, "capo/kept_frac")) == 2
    for s, forward, from_trl, _ in seen:
        assert from_trl == (method != "c2gspg")
        torch.testing.assert_close(s, forward, atol=1e-5, rtol=1e-5)


def test_server_mode_single_process(tiny_model_dir, tmp_path):
    trainer, seen, changed = train(tiny_model_dir, tmp_path, vllm_mode="server")
    assert vllm_standin.StandInVLLMGeneration.instances[-1].mode == "server" and changed > 0
    assert all(from_trl for _, _, from_trl, _ in seen)
