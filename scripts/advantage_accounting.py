"""Where each estimator's advantage goes at the start model: an accounting by completion kind (exploratory).

    python scripts/advantage_accounting.py --task addition --limit 192 --out accounting.json

Samples ``--n`` completions of ``--limit`` train problems of a task from its start model (temperature 1,
``--max_new_tokens``, seed 0), grades them with the math reward, and hands the same batches (``--prompts`` prompts
each, as in training) to each estimator through the library's own ``Method.advantages``. For each estimator it
reports, as shares of its total |advantage| (so a smaller step size does not count as a weaker push):

- ``truncation_push``: the net advantage on completions cut at the limit, over GRPO's (what ``capo/truncated_adv_share``
  over ``capo/truncated_adv_share_grpo`` logs in training);
- ``standard_share``: the net advantage on completions written exactly as the task's worked solution;
- ``credit_ratio``: a right answer's mean advantage off the standard form over on it;
- ``step``: the mean |advantage| over GRPO's;

with 95% bootstrap intervals over problems for the differences from GRPO. Nothing here trains.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ESTIMATORS = {  # name -> CAPOConfig fields
    "grpo": {"advantage_estimator": "grpo"},
    "capo-preset": {"tau": 0.5, "tau_mode": "relative", "advantage_scale": "matched"},
    "capo-paper": {"tau": 0.6, "tau_mode": "absolute", "advantage_scale": "paper"},
    "capo-paper-answer": {"tau": 0.6, "tau_mode": "absolute", "advantage_scale": "paper", "score_span": "answer"},
    "capo-preset-answer": {"tau": 0.5, "tau_mode": "relative", "advantage_scale": "matched", "score_span": "answer"},
    "capo-paper-tied": {"tau": 0.6, "tau_mode": "absolute", "advantage_scale": "paper", "truncated_pairs": "tied"},
}


def sample(task_name: str, limit: int, n: int, max_new_tokens: int, seed: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo_trl.data.benchmarks import PROMPT_TEMPLATES
    from capo_trl.data.tasks import get_task
    from capo_trl.evaluation.sampling import _eos_ids, _prompt_ids, _sample_transformers
    from capo_trl.grader import default_grader
    from capo_trl.rewards import math_accuracy_reward
    from capo_trl.training.answers import answer_token_mask

    task = get_task(task_name)
    path = task.model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    problems = list(task.dataset("train", limit))
    template = PROMPT_TEMPLATES[task.template]  # the prompt training builds from a problem
    prompts = _prompt_ids(tokenizer, [template(p["prompt"]) for p in problems])
    torch.manual_seed(seed)
    with torch.no_grad():
        drawn = _sample_transformers(model, tokenizer, prompts, n, 1.0, 1.0, 0, max_new_tokens, 64, True)
    eos = set(_eos_ids(model, tokenizer))

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    rows = []
    for k, (ids, logps) in enumerate(drawn):
        problem = problems[k // n]
        text = decode(ids)
        rows.append({"problem": k // n, "text": text, "ids": ids, "logps": logps,
                     "truncated": bool(ids) and ids[-1] not in eos,
                     "standard": text.strip() == str(problem.get("solution", "")).strip()})
    grades = math_accuracy_reward([r["text"] for r in rows], answer=[problems[r["problem"]]["answer"] for r in rows])
    spans = default_grader().answer_spans([r["text"] for r in rows])
    for r, grade, span in zip(rows, grades, spans):
        ids = torch.tensor([r["ids"]])
        mask = answer_token_mask(ids, [len(r["ids"])], [span], decode)[0]
        lp = torch.tensor(r["logps"])
        r.update(reward=float("nan") if grade is None else grade, score=float(lp.mean()),
                 answer_score=float(lp[mask].mean()) if mask.any() else float("nan"))
        del r["ids"], r["logps"]
    return rows


def advantages(rows: list[dict], n: int, prompts: int) -> dict[str, np.ndarray]:
    from capo_trl import CAPOConfig
    from capo_trl.advantages import grpo_advantages
    from capo_trl.methods import AdvantageInputs, resolve_method

    out = {}
    batch = n * prompts
    with tempfile.TemporaryDirectory() as tmp:
        for name, fields in ESTIMATORS.items():
            config = CAPOConfig(output_dir=tmp, use_cpu=True, report_to="none", num_generations=n,
                                per_device_train_batch_size=batch, noise_mask=False, **fields)
            method = resolve_method(config.advantage_estimator)(config)
            parts = []
            for start in range(0, len(rows), batch):
                chunk = rows[start:start + batch]
                rewards = torch.tensor([r["reward"] for r in chunk])
                inputs = AdvantageInputs(
                    rewards=rewards, scores=torch.tensor([r["score"] for r in chunk]), num_generations=n,
                    trl_advantages=grpo_advantages(rewards, n, "group"),
                    truncated=torch.tensor([r["truncated"] for r in chunk]),
                    answer_scores=torch.tensor([r["answer_score"] for r in chunk]))
                parts.append(method.advantages(inputs)[0].numpy())
            out[name] = np.concatenate(parts)
    return out


def measures(rows: list[dict], adv: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, dict[str, float]]:
    """Each estimator's measures over the rows ``keep`` selects."""
    cut = np.array([r["truncated"] for r in rows])[keep]
    standard = np.array([r["standard"] for r in rows])[keep]
    right = np.array([r["reward"] >= 0.5 for r in rows])[keep]
    grpo = adv["grpo"][keep]
    out = {}
    for name, a in adv.items():
        a = a[keep]
        total = np.abs(a).sum()
        share = lambda sel: a[sel].sum() / total if total else float("nan")  # noqa: E731
        grpo_total = np.abs(grpo).sum()
        grpo_cut = grpo[cut].sum() / grpo_total if grpo_total else np.nan
        on, off = a[right & standard], a[right & ~standard]
        values = {"truncation_push": share(cut) / grpo_cut if grpo_cut < 0 else np.nan,
                  "standard_share": share(standard),
                  "credit_ratio": off.mean() / on.mean() if len(on) and len(off) and on.mean() else np.nan,
                  "step": total / grpo_total if grpo_total else np.nan}
        out[name] = {k: float(v) for k, v in values.items()}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--task", default="addition")
    parser.add_argument("--limit", type=int, default=192)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per batch (relative tau is per batch)")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = sample(args.task, args.limit, args.n, args.max_new_tokens, args.seed)
    adv = advantages(rows, args.n, args.prompts)
    everything = np.ones(len(rows), dtype=bool)
    point = measures(rows, adv, everything)
    problems = np.array([r["problem"] for r in rows])
    rng = random.Random(args.seed)
    draws = {name: {k: [] for k in point["grpo"]} for name in adv}
    for _ in range(args.bootstrap):
        picked = [rng.randrange(args.limit) for _ in range(args.limit)]
        keep = np.concatenate([np.flatnonzero(problems == p) for p in picked])
        one = measures([rows[i] for i in keep], {k: v[keep] for k, v in adv.items()}, np.ones(len(keep), bool))
        for name in adv:
            for k, v in one[name].items():
                draws[name][k].append(v - one["grpo"][k])
    summary = {name: {k: {"value": v, "minus_grpo_95": [float(np.nanpercentile(draws[name][k], 2.5)),
                                                         float(np.nanpercentile(draws[name][k], 97.5))]}
                      for k, v in point[name].items()} for name in adv}
    counts = {"samples": len(rows), "right": int(sum(r["reward"] >= 0.5 for r in rows)),
              "truncated": int(sum(r["truncated"] for r in rows)), "standard": int(sum(r["standard"] for r in rows)),
              "answer_found": int(sum(np.isfinite(r["answer_score"]) for r in rows))}
    result = {"settings": vars(args) | {"out": str(args.out)}, "estimators": ESTIMATORS, "counts": counts,
              "measures": summary}
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({"counts": counts, **{n: {k: round(v["value"], 3) for k, v in m.items()}
                                            for n, m in summary.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
