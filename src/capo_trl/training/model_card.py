"""The model card credits CAPO (not GRPO's DeepSeekMath) and records the settings a model was trained with."""

from __future__ import annotations

CAPO_CITATION = """\
@inproceedings{wang2026capo,
    title        = {{Calibration-Aware Policy Optimization for Reasoning LLMs}},
    author       = {Ziqi Wang and Xingzhou Lou and Meiqi Wu and Zhengqi Wen and Junge Zhang and others},
    booktitle    = {Proceedings of the 64th Annual Meeting of the Association for Computational Linguistics (ACL)},
    year         = 2026,
    eprint       = {arXiv:2604.12632},
}"""

CAPO_PAPER = {"title": "Calibration-Aware Policy Optimization for Reasoning LLMs", "id": "2604.12632",
              "citation": CAPO_CITATION}


def settings_section(args, method_args) -> str:
    """A Markdown table of the method and mask settings, appended to TRL's card."""
    fields = {"advantage_estimator": args.advantage_estimator, **(vars(method_args) if method_args else {}),
              "noise_mask": args.noise_mask, "beta": args.beta, "loss_type": args.loss_type,
              "num_generations": args.num_generations}
    if args.noise_mask:
        fields.update(ref_thresholds=args.ref_thresholds, ref_high=args.ref_high, ref_low=args.ref_low,
                      correct_threshold=args.correct_threshold, noise_mask_side=args.noise_mask_side,
                      noise_mask_normalizer=args.noise_mask_normalizer)
    if args.method_kwargs:
        fields["method_kwargs"] = args.method_kwargs
    rows = "\n".join(f"| `{k}` | `{v!r}` |" for k, v in fields.items())
    return f"\n## CAPO settings\n\nTrained with capo-trl's `CAPOTrainer`:\n\n| field | value |\n|---|---|\n{rows}\n"


def name_local_models(card: str, base: str | None, output_dir: str) -> str:
    """TRL's card names a model loaded from a local folder ``None`` ("a fine-tuned version of [None](...)",
    ``pipeline(model="None")``): name the folders instead."""
    if base:
        card = card.replace("a fine-tuned version of [None](https://huggingface.co/None)",
                            f"a fine-tuned version of the local model `{base}`")
    return card.replace('pipeline("text-generation", model="None",', f'pipeline("text-generation", model={output_dir!r},')
