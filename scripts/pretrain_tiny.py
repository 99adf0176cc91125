"""Build the embedded default model: a tiny Qwen2 supervised-fine-tuned on the arithmetic task.

Reproducible on CPU from a seed, in a few minutes. It saves checkpoints along the way, evaluates
each on the validation split (accuracy and calibration of mean token log-prob) and copies the
chosen one into the package (`src/capo_trl/assets/arith-tiny`), where every `capo-trl` command finds
it when no model is given.

    python scripts/pretrain_tiny.py --out runs/pretrain [--steps 900] [--install-step 600]

``--task guess`` builds the start model of the guessable-items task instead (`capo_trl.data.guessing`:
the arithmetic task with a quarter of its problems' last operand hidden): its tokenizer adds ``?``,
each guessable training row shows a hidden value drawn at random (so the model learns to guess
uniformly, i.e. starts calibrated on those items), validation also reports accuracy and the modal
answer's share on guessable items, and the chosen checkpoint goes to `src/capo_trl/assets/guess-tiny`.

The target is a *moderate* starting point for RL: accuracy well below the ceiling (so there is
something to learn) and non-trivial calibration (so there is something to keep or lose).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    set_seed,
)
from trl import SFTConfig, SFTTrainer

from capo_trl.data.arithmetic import ARITHMETIC_CHARS, arithmetic_dataset, char_tokenizer
from capo_trl.data.guessing import (
    GUESS_CHARS,
    guess_breakdown,
    guess_dataset,
    sft_completions,
)

ASSETS = Path(__file__).resolve().parents[1] / "src" / "capo_trl" / "assets"
PACKAGE_ASSET = ASSETS / "arith-tiny"
# --task: (characters of the tokenizer, dataset of a split, package directory of the installed model)
TASKS = {"arithmetic": (ARITHMETIC_CHARS, arithmetic_dataset, PACKAGE_ASSET),
         "guess": (GUESS_CHARS, guess_dataset, ASSETS / "guess-tiny")}
# Renders the last user message as is, so a conversational prompt and the plain-text prompt
# "Compute 3+4." tokenise identically; the model answers after it.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def build_tokenizer(task: str = "arithmetic") -> PreTrainedTokenizerFast:
    return char_tokenizer(TASKS[task][0], CHAT_TEMPLATE)


def build_model(vocab_size: int, seed: int) -> Qwen2ForCausalLM:
    set_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def validate(model_dir: str, n_problems: int, n_samples: int, seed: int, task: str = "arithmetic") -> dict:
    """Accuracy and calibration of a checkpoint on the validation split (sampling at temperature 1)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo_trl.evaluation.evaluate import evaluate

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = TASKS[task][1]("validation", n_problems, seed=seed)
    set_seed(seed)
    result = evaluate(model, tokenizer, problems, n=n_samples, max_new_tokens=48, temperature=1.0, progress=False)
    keep = (f"mean@{n_samples}", "auroc", "auroc_question", "ece")
    report = {k: result.metrics[k] for k in keep}
    if task == "guess":
        report.update(e_aurc=result.metrics["e_aurc"], **guess_breakdown(result.samples, problems, n_samples))
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/pretrain")
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic",
                        help="arithmetic (the embedded model) or guess (the guessable-items task)")
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--save-every", type=int, default=150)
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-problems", type=int, default=128)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--validate-only", action="store_true", help="reuse the checkpoints already in --out")
    parser.add_argument("--install-step", type=int, default=None,
                        help="copy this checkpoint into the package (default: only report)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    tokenizer = build_tokenizer(args.task)
    if not args.validate_only:
        sft(args, tokenizer)
    validate_and_install(args, tokenizer)


def sft(args, tokenizer):
    model = build_model(len(tokenizer), args.seed)
    # prompt/completion pairs: SFTTrainer computes the loss on the completion (the solution) only
    if args.task == "guess":
        train = sft_completions(guess_dataset("train", args.train_size, seed=args.seed), seed=args.seed)
    else:
        train = arithmetic_dataset("train", args.train_size, seed=args.seed)
        train = train.map(lambda r: {"completion": " " + r["solution"]},
                          remove_columns=["answer", "solution", "num_operands"])
    config = SFTConfig(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=64, learning_rate=2e-3,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, logging_steps=50,
        save_steps=args.save_every, save_strategy="steps", save_only_model=True, report_to="none",
        bf16=False, use_cpu=True, seed=args.seed, max_length=96, dataloader_num_workers=0,
        gradient_checkpointing=False,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=train, processing_class=tokenizer)
    trainer.train()


def validate_and_install(args, tokenizer):
    report = {}
    for ckpt in sorted(Path(args.out).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        tokenizer.save_pretrained(ckpt)
        report[ckpt.name] = validate(str(ckpt), args.eval_problems, args.eval_samples, args.seed, args.task)
        print(ckpt.name, json.dumps(report[ckpt.name]))
    (Path(args.out) / "validation.json").write_text(json.dumps(report, indent=2))

    if args.install_step is not None:
        chosen = Path(args.out) / f"checkpoint-{args.install_step}"
        asset = TASKS[args.task][2]
        shutil.rmtree(asset, ignore_errors=True)
        asset.mkdir(parents=True)
        model = Qwen2ForCausalLM.from_pretrained(chosen)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(asset)
        tokenizer.save_pretrained(asset)
        task_flags = (f" --task guess --save-every {args.save_every} --eval-problems {args.eval_problems} "
                      f"--eval-samples {args.eval_samples}" if args.task == "guess" else "")
        (asset / "PROVENANCE.json").write_text(json.dumps({
            "command": f"python scripts/pretrain_tiny.py --out {args.out} --steps {args.steps} "
                       f"--seed {args.seed} --install-step {args.install_step}{task_flags}",
            "validation": report.get(chosen.name),
        }, indent=2))
        print(f"installed {chosen} -> {asset}")


if __name__ == "__main__":
    main()
