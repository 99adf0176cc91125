"""The real model before any RL, on each of its tasks: what docs/results/smollm2-start/ renders.

    capo-trl eval --model smollm2-135m-instruct --benchmark TASK --split test --limit 256 --n 8 \
        --max_new_tokens 32 --batch_size 64 --out docs/results/smollm2-start/TASK --overwrite
    python scripts/real_start.py mask TASK     # calibrate-mask on 512 train problems x 8: calibrate-mask.json
    python scripts/real_start.py paper TASK    # the paper's thresholds against the test samples: paper-mask.json
    python scripts/real_start.py truncation TASK  # GRPO's and CAPO's advantages of unfinished samples: truncation.json

``mask`` runs ``capo_trl.harness.calibrate_mask`` (the quartile-rule thresholds, the within-group spread of
the score, i.e. the absolute tau it suggests) and writes its report; ``paper`` reads the test split's
samples.csv (the start model is the reference, so exp(-s) of a sample is its reference perplexity) and
counts what the paper's ``ref_high`` 2.5 / ``ref_low`` 1.05 would drop. ``truncation`` takes the same samples as
training batches of the CAPO SmolLM2 recipe (4 groups of 8) and computes GRPO's advantage (TRL's, group-scaled) and
the recipe's CAPO advantage of every sample (also with ``truncated_pairs="tied"``), by kind (right, wrong and finished, unfinished): under
``mask_truncated_completions`` an unfinished sample leaves the loss, and since a group's advantages sum to zero,
what it carries is what the group's finished samples carry the other way, a net push towards (or away from)
finishing.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "docs" / "results" / "smollm2-start"
PAPER = {"ref_high": 2.5, "ref_low": 1.05}


def mask(task: str) -> dict:
    import torch

    from capo_trl.data.benchmarks import load_benchmark
    from capo_trl.data.models import resolve_model
    from capo_trl.harness.calibrate_mask import calibrate_mask

    torch.set_num_threads(1)
    start = time.time()
    report = calibrate_mask(resolve_model("smollm2-135m-instruct"), None,
                            load_benchmark(task, split="train", limit=512), n=8, max_new_tokens=32, progress=False,
                            device="cpu", batch_size=64)
    report["seconds"] = round(time.time() - start, 1)
    return report


def paper(task: str) -> dict:
    with open(ROOT / task / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    correct = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) >= 0.5]
    wrong = [math.exp(-float(r["score"])) for r in rows if float(r["grade"]) < 0.5]
    from capo_trl.data.benchmarks import load_benchmark

    problems = load_benchmark(task, split="test", limit=len({r["id"] for r in rows}))
    hidden = {i for i, p in zip(problems["id"], problems["prompt"]) if p[-1]["content"].endswith("+?.")}
    by_kind = {kind: [float(r["grade"]) for r in rows if (r["id"] in hidden) == (kind == "guessable")]
               for kind in ("derivable", "guessable")}
    kinds = {f"{kind}/{what}": value for kind, grades in by_kind.items() if grades
             for what, value in (("samples", len(grades)), ("accuracy", sum(grades) / len(grades)))}
    return {**PAPER, **kinds, "n_correct": len(correct), "n_wrong": len(wrong),
            "dropped_correct": sum(p > PAPER["ref_high"] for p in correct) / max(len(correct), 1),
            "dropped_wrong": sum(p < PAPER["ref_low"] for p in wrong) / max(len(wrong), 1),
            "ppl_correct_max": max(correct, default=float("nan")), "ppl_wrong_min": min(wrong, default=float("nan"))}


RECIPE = Path(__file__).resolve().parents[1] / "examples" / "recipes" / "capo-smollm2-135m-lora-cpu.yaml"


def truncation(task: str) -> dict:
    from types import SimpleNamespace

    import torch
    import yaml

    from capo_trl.advantages import grpo_advantages
    from capo_trl.methods.base import AdvantageInputs
    from capo_trl.methods.capo import CAPO, CAPOArgs

    recipe = yaml.safe_load(RECIPE.read_text())
    G, batch = recipe["num_generations"], recipe["per_device_train_batch_size"]
    with open(ROOT / task / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
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
    report = {"recipe": str(RECIPE.relative_to(RECIPE.parents[2])), "samples": len(rows),
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


OUTPUTS = {"mask": "calibrate-mask.json", "paper": "paper-mask.json", "truncation": "truncation.json"}


def main(argv: list[str]) -> int:
    what, task = argv
    report = {"mask": mask, "paper": paper, "truncation": truncation}[what](task)
    out = ROOT / task / OUTPUTS[what]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
