"""sampler="inverse_cdf": the next token drawn from the distribution torch.multinomial draws from, by a cumulative
sum and a binary search; torch's own draws everywhere else.

The frequency test draws 200,000 tokens from fixed weights with a fixed seed (so it is one outcome, the same on
every run); each frequency must lie within 5 binomial standard deviations of its probability (a false alarm per
token has odds below 1 in 1.7 million), and a zero-weight token is never drawn.
"""

import math

import pytest
import torch
from capo_trl.testing.tiny import tiny_dataset

from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.evaluation.evaluate import evaluate
from capo_trl.evaluation.sampler import inverse_cdf, sampling

WEIGHTS = torch.tensor([0.0, 3.0, 1.0, 0.5, 0.0, 5.5, 1e-3])  # unnormalised, as multinomial accepts


def test_frequencies_follow_the_weights():
    draws = 200_000
    generator = torch.Generator().manual_seed(0)
    picks = inverse_cdf(WEIGHTS.expand(draws, -1), generator).squeeze(1)
    counts = torch.bincount(picks, minlength=len(WEIGHTS)).double()
    p = WEIGHTS.double() / WEIGHTS.sum()
    for token, (count, prob) in enumerate(zip(counts.tolist(), p.tolist())):
        if prob == 0:
            assert count == 0, f"token {token} has weight 0 but was drawn {count} times"
        else:
            sd = math.sqrt(draws * prob * (1 - prob))
            assert abs(count - draws * prob) <= 5 * sd, (token, count, draws * prob, sd)


def test_the_block_swaps_only_generates_draw():
    probs = torch.softmax(torch.randn(4, 50), -1)
    original = torch.multinomial
    with sampling("inverse_cdf"):
        torch.manual_seed(1)
        drawn = torch.multinomial(probs, num_samples=1)
        torch.manual_seed(1)
        assert torch.equal(drawn, inverse_cdf(probs))
        assert torch.multinomial(probs, 3).shape == (4, 3)  # other calls: torch's own
    assert torch.multinomial is original
    with sampling("multinomial"):
        assert torch.multinomial is original
    with pytest.raises(ValueError, match="sampler='gumbel'; use one of"):
        with sampling("gumbel"):
            pass


def test_evaluation_and_training_draw_with_it(tiny_model_dir, tmp_path):
    problems = [{"prompt": "Q: 1+1?", "answer": "2"}, {"prompt": "Q: 2+2?", "answer": "4"}]
    runs = {s: evaluate(tiny_model_dir, None, problems, n=4, max_new_tokens=6, sampler=s, progress=False, bootstrap=10)
            for s in ("multinomial", "inverse_cdf")}
    texts = {s: [x["completion"] for x in r.samples] for s, r in runs.items()}
    assert runs["inverse_cdf"].config["sampler"] == "inverse_cdf" and len(texts["inverse_cdf"]) == 8
    assert texts["multinomial"] != texts["inverse_cdf"]  # other random numbers, other draws
    trainer = CAPOTrainer(model=tiny_model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          train_dataset=tiny_dataset(), args=CAPOConfig(
                              output_dir=str(tmp_path), sampler="inverse_cdf", per_device_train_batch_size=4,
                              num_generations=4, max_completion_length=4, max_steps=1, use_cpu=True, bf16=False,
                              report_to="none", save_strategy="no", disable_tqdm=True))
    calls = []
    real = torch.searchsorted
    torch.searchsorted = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        trainer.train()
    finally:
        torch.searchsorted = real
    assert len(calls) >= 1  # every token of the rollout was drawn by the inverse CDF


def test_bad_settings_are_refused(tmp_path):
    cpu = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError, match="sampler='gumbel' is invalid"):
        CAPOConfig(**cpu, sampler="gumbel")
    with pytest.raises(ValueError, match="vLLM samples by itself"):
        CAPOConfig(**cpu, sampler="inverse_cdf", use_vllm=True)
    with pytest.raises(ValueError, match="vLLM samples by itself"):
        evaluate("unused", None, [{"prompt": "x", "answer": "1"}], n=1, sampler="inverse_cdf", backend="vllm")
