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
