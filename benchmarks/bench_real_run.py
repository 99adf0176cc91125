"""A whole real-model run, before and after the cost levers, side by side: minutes of one core each.

A run is what a study's run is: ``capo-trl train`` of a SmolLM2 recipe for ``--steps`` steps (the study's task and
seed), then ``capo-trl eval`` of the trained model on the first 256 test problems x 8 samples of <= 32 tokens. Two
variants run at once, one process of one thread each (two runs fill a 2-core machine, as a study's queue fills it):

- ``before``: the recipe as the committed studies ran it: float32 weights, the layers below the adapter run twice
  (``share_lower_layers=false``, the computation of every record before it existed), the test in float32 in
  batches of 64;
- ``after``: bf16 weights in training and test (float32 LoRA; pays only on a CPU with AMX, see the recipes), each
  token drawn by inverse CDF (``sampler=inverse_cdf``), the lower layers shared, the test in batches of 128.

    capo-trl fetch-model smollm2-135m-instruct
    python benchmarks/bench_real_run.py [--recipe examples/recipes/capo-smollm2-135m-lora-cpu.yaml] [--steps 100]
        [--task addition-guess-half] [--seed 307] [--out result.json]

Prints each variant's training and test minutes and the ratios; ``--out`` keeps them with each run's endpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "before": {"train": ["--dtype", "float32", "--share_lower_layers", "false"],
               "test": ["--dtype", "float32", "--batch_size", "64"]},
    "after": {"train": ["--dtype", "bfloat16", "--sampler", "inverse_cdf"],
              "test": ["--dtype", "bfloat16", "--sampler", "inverse_cdf", "--batch_size", "128"]},
}
OVERRIDES = ["--mask_truncated_completions", "true", "--learning_rate", "3e-4"]  # the studies' arms at 3e-4


def cpu_flags() -> str:
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return "unknown"
    return ", ".join(f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags) or "none of amx/avx512"


def run(name: str, args, folder: Path) -> subprocess.Popen:
    """One variant's train then test, in a shell of its own, timing each part into ``folder/<name>.times``."""
    run_dir = folder / name
    train = ["capo-trl", "train", "--config", args.recipe, "--dataset_name", args.task, "--seed", str(args.seed),
             "--max_steps", str(args.steps), "--output_dir", str(run_dir), "--save_strategy", "no",
             "--model_name_or_path", args.model, *OVERRIDES, *VARIANTS[name]["train"]]
    test = ["capo-trl", "eval", "--model", str(run_dir), "--benchmark", args.task, "--split", "test", "--limit", "256",
            "--n", "8", "--max_new_tokens", "32", "--seed", "0", "--device", "cpu", "--no_progress", "--out",
            str(run_dir / "test"), *VARIANTS[name]["test"]]
    script = (f"t0=$(date +%s.%N); {' '.join(train)} > {folder}/{name}.train.log 2>&1 || exit 1; "
              f"t1=$(date +%s.%N); {' '.join(test)} > {folder}/{name}.test.log 2>&1 || exit 1; t2=$(date +%s.%N); "
              f"echo $t0 $t1 $t2 > {folder}/{name}.times")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(["bash", "-c", script], env=env)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="examples/recipes/capo-smollm2-135m-lora-cpu.yaml")
    parser.add_argument("--task", default="addition-guess-half")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seed", type=int, default=307)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="real-run-"))
    print(f"{args.recipe} on {args.task}, seed {args.seed}, {args.steps} steps + 256 x 8 test; CPU: {cpu_flags()}; "
          f"both variants at once, one thread each; logs in {folder}", flush=True)
    start = time.time()
    procs = {name: run(name, args, folder) for name in VARIANTS}
    failed = [name for name, p in procs.items() if p.wait() != 0]
    if failed:
        print(f"failed: {failed}; see {folder}", file=sys.stderr)
        return 1
    result = {"recipe": args.recipe, "task": args.task, "seed": args.seed, "steps": args.steps, "cpu": cpu_flags(),
              "machine": platform.processor() or platform.machine(), "wall_s": round(time.time() - start),
              "variants": {}}
    for name in VARIANTS:
        t0, t1, t2 = map(float, (folder / f"{name}.times").read_text().split())
        report = json.loads((folder / name / "test" / "report.json").read_text())
        metrics = report["metrics"]
        result["variants"][name] = {
            "flags": VARIANTS[name], "train_s": round(t1 - t0), "test_s": round(t2 - t1),
            **{k: metrics[k] for k in ("mean@8", "auroc", "auroc_question", "ece", "e_aurc", "mean_tokens")}}
    before, after = result["variants"]["before"], result["variants"]["after"]
    for name, v in result["variants"].items():
        print(f"{name:7s} train {v['train_s'] / 60:5.1f} min, test {v['test_s'] / 60:5.1f} min, run "
              f"{(v['train_s'] + v['test_s']) / 60:5.1f} min; accuracy {v['mean@8']:.3f}, AUROC {v['auroc']:.3f}")
    ratio = (after["train_s"] + after["test_s"]) / (before["train_s"] + before["test_s"])
    print(f"after / before: run {ratio:.2f}x, train {after['train_s'] / before['train_s']:.2f}x, "
          f"test {after['test_s'] / before['test_s']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
