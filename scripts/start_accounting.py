"""What a start model's samples say before any RL (exploratory accountings, nothing trains), for any model and task.

    python scripts/start_accounting.py mask --model M --task T --out calibrate-mask.json
    python scripts/start_accounting.py thresholds --eval EVAL_DIR --task T --ref_high 2.5 --ref_low 1.05 --out F.json
    python scripts/start_accounting.py truncation --eval EVAL_DIR --recipe RECIPE.yaml --out truncation.json

``mask`` runs ``capo_trl.harness.calibrate_mask`` on the task's train split (``--limit`` problems x ``--n`` samples;
the quartile-rule thresholds, the within-group spread of the score, i.e. the absolute tau it suggests) and writes its
report. ``thresholds`` reads the ``samples.csv`` that ``capo-trl eval --out EVAL_DIR`` wrote for the start model (the
start model is the reference, so exp(-s) of a sample is its reference perplexity) and counts what the mask at those
thresholds would drop, with the accuracy by kind of item where the task has guessable items. ``truncation`` takes the
same samples as training batches of a CAPO recipe (its groups per step) and computes GRPO's advantage (TRL's,
group-scaled) and the recipe's CAPO advantage of every sample (also with ``truncated_pairs="tied"``), by kind (right,
wrong and finished, unfinished): under ``mask_truncated_completions`` an unfinished sample leaves the loss, and since
a group's advantages sum to zero, what it carries is what the group's finished samples carry the other way, a net push
towards (or away from) finishing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mask(model: str, task: str, limit: int = 512, n: int = 8, max_new_tokens: int = 32) -> dict:
    import torch

    from capo_trl.data.benchmarks import load_benchmark
    from capo_trl.data.models import resolve_model
    from capo_trl.harness.calibrate_mask import calibrate_mask

    torch.set_num_threads(1)
    start = time.time()
    report = calibrate_mask(resolve_model(model), None, load_benchmark(task, split="train", limit=limit), n=n,
                            max_new_tokens=max_new_tokens, progress=False, device="cpu", batch_size=64)
    report["seconds"] = round(time.time() - start, 1)
    return report


def read_samples(folder: Path) -> list[dict]:
    with open(folder / "samples.csv", newline="") as f:
        return list(csv.DictReader(f))


def thresholds(folder: Path, task: str, ref_high: float, ref_low: float) -> dict:
    """What the mask at ``ref_high`` / ``ref_low`` would drop of the start model's samples (``folder``'s samples.csv)."""
    rows = read_samples(folder)
    correct = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) >= 0.5]
    wrong = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) < 0.5]
    from capo_trl.data.tasks import get_task

    problems = get_task(task).dataset("test", len({r["id"] for r in rows}))  # the eval's ids are TASK/<index>
    guessable = problems["guessable"] if "guessable" in problems.column_names else [False] * len(problems)
    by_kind = {kind: [float(r["grade"]) for r in rows if guessable[int(r["id"].rsplit("/", 1)[1])] == (kind == "guessable")]
               for kind in ("derivable", "guessable")}
    kinds = {f"{kind}/{what}": value for kind, grades in by_kind.items() if grades
             for what, value in (("samples", len(grades)), ("accuracy", sum(grades) / len(grades)))}
    return {"ref_high": ref_high, "ref_low": ref_low, **kinds, "n_correct": len(correct), "n_wrong": len(wrong),
            "dropped_correct": sum(p > ref_high for p in correct) / max(len(correct), 1),
            "dropped_wrong": sum(p < ref_low for p in wrong) / max(len(wrong), 1),
            "ppl_correct_max": max(correct, default=float("nan")), "ppl_wrong_min": min(wrong, default=float("nan"))}


def truncation(folder: Path, recipe_path: Path, preset: str | None = None) -> dict:
    """GRPO's and the recipe's CAPO advantages of ``folder``'s samples taken as training batches, by kind; ``preset``
    (a name in capo_trl.harness.presets.PRESETS) sets the CAPO fields in place of the recipe's, so an accounting of
    one setting stays reproducible when the recipe's method block changes."""
    from types import SimpleNamespace

    import torch
    import yaml

    from capo_trl.advantages import grpo_advantages
    from capo_trl.methods.base import AdvantageInputs
    from capo_trl.methods.capo import CAPO, CAPOArgs

    from capo_trl.harness.presets import PRESETS

    recipe = yaml.safe_load(recipe_path.read_text())
    if preset is not None:
        recipe.update(PRESETS[preset])
    G, batch = recipe["num_generations"], recipe["per_device_train_batch_size"]
    rows = read_samples(folder)
    rows.sort(key=lambda r: (int(r["id"].rsplit("/", 1)[1]), int(r["draw"])))
    R = torch.tensor([float(r["grade"]) for r in rows])
    s = torch.tensor([float(r["score"]) for r in rows])
    finished = torch.tensor([r["finished"] == "True" for r in rows])
    length = torch.tensor([float(r["num_tokens"]) for r in rows])
    names = CAPOArgs.__dataclass_fields__
    settings = {n: recipe.get(n, f.default) for n, f in names.items()}
    grpo = grpo_advantages(R, G, "group")

    def capo(truncated_pairs: str) -> torch.Tensor:
        method = CAPO(SimpleNamespace(**{**settings, "truncated_pairs": truncated_pairs}))
        return torch.cat([method.advantages(AdvantageInputs(R[i:i + batch], s[i:i + batch], G, grpo[i:i + batch],
                                                            truncated=~finished[i:i + batch]))[0]
                          for i in range(0, len(rows), batch)])
    groups = R.view(-1, G)
    mixed = (groups.max(1).values > groups.min(1).values).repeat_interleave(G)
    kinds = {"right": mixed & (R >= 0.5), "wrong_finished": mixed & (R < 0.5) & finished,
             "wrong_unfinished": mixed & (R < 0.5) & ~finished}
    shown = recipe_path.resolve().relative_to(ROOT) if recipe_path.resolve().is_relative_to(ROOT) else recipe_path
    report = {"recipe": str(shown), **({"preset": preset} if preset else {}), "samples": len(rows),
              "mixed_groups": int(mixed.sum()) // G,
              "mixed_groups_with_unfinished": int((mixed & ~finished).view(-1, G).any(1).sum()),
              "n/unfinished": int((mixed & ~finished).sum()),
              **{f"n/{k}": int(m.sum()) for k, m in kinds.items()},
              **{f"score/{k}": s[m].mean().item() for k, m in kinds.items()},
              **{f"length/{k}": length[m].mean().item() for k, m in kinds.items()}}
    for name, adv in (("grpo", grpo), ("capo", capo("ranked")), ("capo_tied", capo("tied"))):
        report.update({f"{name}/advantage/{k}": adv[m].mean().item() for k, m in kinds.items()})
        report.update({f"{name}/corr_length/{k}": torch.corrcoef(torch.stack([adv[m], length[m]]))[0, 1].item()
                       for k, m in kinds.items() if k != "wrong_unfinished"})  # unfinished: all at the limit
        # what the unfinished samples of a mixed group carry (masked out), per mixed group
        report[f"{name}/unfinished_total_per_group"] = adv[mixed & ~finished].sum().item() / report["mixed_groups"]
    return report


def main(argv: list[str]) -> int:
    from capo_trl.harness.presets import PRESETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("mask", allow_abbrev=False)
    m.add_argument("--model", required=True, help="the start model: a path or a capo-trl fetch-model short name")
    m.add_argument("--task", required=True)
    m.add_argument("--limit", type=int, default=512)
    m.add_argument("--n", type=int, default=8)
    m.add_argument("--max_new_tokens", type=int, default=32)
    t = sub.add_parser("thresholds", allow_abbrev=False)
    t.add_argument("--task", required=True)
    t.add_argument("--ref_high", type=float, required=True)
    t.add_argument("--ref_low", type=float, required=True)
    c = sub.add_parser("truncation", allow_abbrev=False)
    c.add_argument("--recipe", type=Path, required=True, help="a CAPO recipe: its groups per batch and CAPO settings")
    c.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="a capo-trl preset (e.g. capo, the embedded one) whose CAPO fields replace the recipe's "
                        "(default: none, the recipe's own)")
    for p in (t, c):
        p.add_argument("--eval", type=Path, required=True, help="the folder `capo-trl eval --out` wrote (samples.csv)")
    for p in (m, t, c):
        p.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    args = parser.parse_args(argv)
    if args.what == "mask":
        report = mask(args.model, args.task, args.limit, args.n, args.max_new_tokens)
    elif args.what == "thresholds":
        report = thresholds(args.eval, args.task, args.ref_high, args.ref_low)
    else:
        report = truncation(args.eval, args.recipe, args.preset)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
