"""Renderers of what the real model's runs cost on a CPU, from the benchmarks' committed output files.

The files in docs/results/smollm2-cpu/ are the ``--out`` files of ``benchmarks/bench_real_step.py`` (a step of each
variant), ``benchmarks/bench_real_run.py`` (a whole run before and after the levers) and
``benchmarks/bench_vllm_cpu.py`` (sampling against vLLM's CPU engine), each run once as its page says.
"""

from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "results" / "smollm2-cpu"
PARTS = ("generation", "prefill", "reference forward", "loss forward")


def _load(name: str) -> dict:
    return json.loads((FOLDER / name).read_text())


def render_step_cost() -> str:
    data = _load("step-cost.json")
    lines = ["| variant | s / step | generation (prefill) | reference forward | loss forward | steps measured |",
             "|---|---|---|---|---|---|"]
    for name, v in data["variants"].items():
        lines.append(f"| {name} | {v['s_per_step']:.1f} | {v['generation']:.1f} ({v['prefill']:.1f}) | "
                     f"{v['reference forward']:.1f} | {v['loss forward']:.1f} | {len(v['steps'])} |")
    lines += ["", "| ratio | |", "|---|---|"]
    lines += [f"| {pair} | {value:.2f}x |" for pair, value in data["ratios"].items()]
    return "\n".join(lines) + "\n"


def render_run_cost() -> str:
    data = _load("run-cost.json")
    lines = ["| variant | training, min | test, min | run, min | accuracy | pooled AUROC | ECE |",
             "|---|---|---|---|---|---|---|"]
    for name, v in data["variants"].items():
        lines.append(f"| {name} | {v['train_s'] / 60:.1f} | {v['test_s'] / 60:.1f} | "
                     f"{(v['train_s'] + v['test_s']) / 60:.1f} | {v['mean@8']:.3f} | {v['auroc']:.3f} | "
                     f"{v['ece']:.3f} |")
    before, after = (data["variants"][k] for k in ("before", "after"))
    ratio = (after["train_s"] + after["test_s"]) / (before["train_s"] + before["test_s"])
    return "\n".join(lines) + (f"\n\nAfter / before: {ratio:.2f}x the run ({after['train_s'] / before['train_s']:.2f}x "
                               f"training, {after['test_s'] / before['test_s']:.2f}x the test); the CPU had "
                               f"{data['cpu']}.\n")


def render_sampling() -> str:
    data = _load("sampling.json")

    def mean(xs):
        return sum(xs) / len(xs)

    rate, step = data["tokens_per_s"], data["step_s"]
    engine = mean(rate["vLLM"])
    lines = ["| sampler | tokens / s | / vLLM engine | CAPO recipe step, s |", "|---|---|---|---|"]
    for name in rate:
        lines.append(f"| {name} | {mean(rate[name]):.0f} | {mean(rate[name]) / engine:.2f} | {mean(step[name]):.2f} |")
    return "\n".join(lines) + (f"\n\n{data['prompts']} prompts x {data['n']} samples x <= {data['tokens']} tokens, "
                               f"{data['rounds']} rounds each after a warm-up; {data['steps']} steps each after a "
                               f"warm-up step; the engine's start-up took {data['engine_startup_s']:.0f} s.\n")


COST_RENDER = {"smollm2-step-cost": render_step_cost, "smollm2-run-cost": render_run_cost,
               "smollm2-sampling": render_sampling}


def render_rerun() -> str:
    """A committed record rerun under newer code (``scripts/rerun_record.py --out``): each endpoint, and how far the
    logged training values moved."""
    data = _load("rerun-capo-paper-307.json")
    old = json.loads((FOLDER.parent.parent.parent / data["record"]).read_text())
    new = data["rerun"]
    lines = ["| endpoint | record | rerun | difference |", "|---|---|---|---|"]
    for key in [k for k in old if k in ("accuracy", "auroc", "auroc_question", "ece", "e_aurc", "mean_tokens",
                                        "finished_frac", "answered_frac") or "/" in k]:
        a, b = old[key], new[key]
        lines.append(f"| {key} | {a:.10g} | {b:.10g} | {abs(a - b):.1e} |")
    pairs = [(a[k], b[k]) for a, b in zip(old["train"], new["train"]) for k in a
             if k not in ("step", "step_time") and isinstance(a[k], float)]
    moved = [abs(a - b) / max(abs(a), 1e-12) for a, b in pairs if a != b]
    steps = data["step5_grad_norm_on_this_machine"]
    return "\n".join(lines) + (
        f"\n\nLogged training values (every 5 steps, wall times aside): {len(pairs)} compared, {len(moved)} not equal, "
        f"the largest relative difference {max(moved, default=0):.1e}. The record's grad_norm at step 5 was "
        f"{steps['record']!r}; on this machine the frozen commit gave {steps['frozen commit a8963a0']!r}, and the new "
        f"code {steps['new code, share_lower_layers on']!r} with `share_lower_layers` on and "
        f"{steps['new code, share_lower_layers off']!r} with it off. The frozen commit's whole run on this machine "
        f"({data['frozen_commit_rerun_on_this_machine']['commit'][:7]}, trained and tested as the study's runner does) "
        f"differed from the new code's rerun in {len(data['differences_from_frozen_commit_rerun'])} of these values "
        f"and endpoints.\n")


COST_RENDER["smollm2-rerun"] = render_rerun
