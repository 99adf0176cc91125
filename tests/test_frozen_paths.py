"""A study may reuse another study's GRPO records only if GRPO trains today exactly as at that study's frozen commit.

The check: the committed source of each frozen commit (``git archive``) and today's train the same tiny model for
four steps with the SmolLM2 GRPO recipe's trainer settings (GRPO's advantages, LoRA, mask_truncated_completions,
beta 0, constant learning rate, both prompt sharings, tied rows skipped), each in a fresh process on this machine;
every logged number and every trained weight must be equal, bit for bit. The recipe's settings themselves are
compared too, but for its CAPO fields: the GRPO twin carries the CAPO recipe's, inert under GRPO, so each side
trains with its own (the check that they are inert). A clone without the history cannot run this check: the test
then fails (it never skips).
"""

import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "examples/recipes/grpo-smollm2-135m-lora-cpu.yaml"
# study -> its frozen commit (the commit that added its protocol.md)
FROZEN = {"smollm2-study": "5926248", "smollm2-lr-study": "6e1a6d1"}
# the flags those studies' GRPO arms passed over the recipe of their commit
FLAGS = {"smollm2-study": {"mask_truncated_completions": True}, "smollm2-lr-study": {"learning_rate": 3e-4}}
# the CAPO fields the GRPO twin carries (its CAPO twin's, inert under grpo): each side trains with its own
CAPO_KEYS = ("tau", "tau_mode", "advantage_scale", "noise_mask", "ref_high", "ref_low")
# read by the recipe's trainer settings: what the tiny run copies from it (the model, data and CPU lines aside)
TRAINER_KEYS = ("advantage_estimator", "num_generations",
                "temperature", "mask_truncated_completions", "beta", "lr_scheduler_type", "warmup_steps",
                "share_prompt_prefill", "share_prompt_in_loss", "skip_zero_advantage_rows", "lora_dropout")

SCRIPT = r"""
import json, sys, tempfile, torch
from peft import LoraConfig
from capo_trl import CAPOConfig, CAPOTrainer
from capo_trl.testing.tiny import build_tiny_model, digit_reward, tiny_dataset
torch.set_num_threads(1)
settings = json.loads(sys.argv[1])
out = tempfile.mkdtemp()
model = build_tiny_model(out + "/model")
torch.manual_seed(0)
args = CAPOConfig(output_dir=out + "/run", per_device_train_batch_size=16, max_completion_length=24, max_steps=4,
                  learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", activation_checkpointing=False,
                  logging_steps=1, save_strategy="no", seed=3, disable_tqdm=True, **settings)
lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
trainer = CAPOTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset(), peft_config=lora)
trainer.train()
logs = [{k: v for k, v in row.items() if isinstance(v, (int, float)) and "time" not in k and "per_second" not in k}
        for row in trainer.state.log_history if "loss" in row]
weights = {n: p.detach().double().sum().item() for n, p in trainer.model.named_parameters()}
print("RESULT " + json.dumps({"logs": logs, "weights": weights}))
"""


def source_at(commit: str, into: Path) -> Path:
    """``src/`` of ``commit`` extracted into ``into``; an error saying what is missing when history is absent."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, timeout=120)
    assert archive.returncode == 0, (f"git archive {commit} failed ({archive.stderr.decode()[-300:]}): this check "
                                     "needs the repository's history (a full clone)")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def recipe_at(commit: str | None) -> dict:
    text = (ROOT / RECIPE).read_text() if commit is None else subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{RECIPE}"], capture_output=True, text=True, timeout=60).stdout
    return yaml.safe_load(text)


def trained(src: Path, settings: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(settings)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=src.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("study", sorted(FROZEN))
def test_grpo_trains_as_at_the_studys_frozen_commit(study, tmp_path):
    then = {**recipe_at(FROZEN[study]), **FLAGS[study]}
    now = {**recipe_at(None), **FLAGS[study]}
    assert {k: then.get(k) for k in TRAINER_KEYS} == {k: now.get(k) for k in TRAINER_KEYS}
    assert now["advantage_estimator"] == "grpo"

    def settings(recipe):
        return {**{k: recipe[k] for k in TRAINER_KEYS + CAPO_KEYS if k in recipe and k != "lora_dropout"},
                "num_generations": 4}  # a tiny batch: 4 prompts x 4 samples
    old = trained(source_at(FROZEN[study], tmp_path / "old"), settings(then))
    new = trained(ROOT / "src", settings(now))
    ignore = {"capo/answered_truncated_frac", "capo/truncated_adv_share", "capo/truncated_adv_share_grpo"}  # logged since
    new["logs"] = [{k: v for k, v in row.items() if k not in ignore} for row in new["logs"]]
    assert new == old
    assert any(row.get("grad_norm", 0) > 0 for row in new["logs"])  # it trained
