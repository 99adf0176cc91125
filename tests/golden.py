"""Fixed-seed 3-step runs of every method, recorded per step: the reference for "behaviour unchanged".

``python tests/golden.py`` rewrites ``tests/data/golden_steps.json`` and the machine it ran on
(``golden_environment.json``; only do that when a change of behaviour is intended and explained);
``tests/test_golden.py`` replays every run and compares: discrete outcomes exactly, real numbers to
the drift measured between CPUs (:func:`differences`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "golden_steps.json"
ENVIRONMENT = HERE / "data" / "golden_environment.json"  # where GOLDEN was recorded
COMMON = dict(per_device_train_batch_size=16, num_generations=4, max_completion_length=8, max_steps=3,
              learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False,
              logging_steps=1, save_strategy="no", seed=5, temperature=1.0, disable_tqdm=True)
LOOSE = dict(ref_high=1e6, ref_low=1.0)
OFF = dict(noise_mask_guard=False)  # the mask as recorded before the guard existed
# the paper's advantage settings, CAPOConfig's defaults when the runs were recorded: named, so that the runs stay the
# recorded ones whatever the defaults become
PAPER_ADV = dict(tau=0.6, tau_mode="absolute", advantage_scale="paper")
RUNS = {
    "grpo": dict(advantage_estimator="grpo"),
    "grpo-mask-auto": dict(advantage_estimator="grpo", noise_mask=True, ref_thresholds="auto", **OFF),
    "capo-paper-loose-mask": dict(advantage_estimator="capo", noise_mask=True, **PAPER_ADV, **LOOSE, **OFF),
    "capo-mask-auto": dict(advantage_estimator="capo", noise_mask=True, ref_thresholds="auto", tau=1.0,
                           tau_mode="relative", advantage_scale="bounded", **OFF),
    "capo-matched-pairs": dict(advantage_estimator="capo", noise_mask=False, tau=0.6, tau_mode="absolute",
                               advantage_scale="matched", advantage_normalization="pairs"),
    "capo-linear": dict(advantage_estimator="capo", noise_mask=False, surrogate="linear", **PAPER_ADV),
    "capo-beta": dict(advantage_estimator="capo", noise_mask=True, beta=0.04, **PAPER_ADV, **LOOSE, **OFF),
    "gspo": dict(advantage_estimator="grpo", importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4,
                 epsilon_high=4e-4),
    "dr_grpo": dict(advantage_estimator="dr_grpo", loss_type="dr_grpo"),
    "codapo-replay": dict(advantage_estimator="codapo", codapo_replay=True),
    "cde": dict(advantage_estimator="cde", cde_stair_steps=1, cde_stairs=4),
    "c2gspg": dict(advantage_estimator="c2gspg"),
    "simko": dict(advantage_estimator="simko"),
    "rlcr": dict(advantage_estimator="rlcr"),
    "dcpo": dict(advantage_estimator="dcpo"),
    "scapo": dict(advantage_estimator="scapo", scapo_steps=2),
}


def record(name: str, model_dir: str, out_dir: str) -> dict:
    """Train one run; per generation: advantages and kept rows; per step: every logged number but timings."""
    sys.path.insert(0, str(HERE))
    import torch
    from capo_trl.testing.tiny import digit_reward, tiny_dataset

    from capo_trl import CAPOConfig, CAPOTrainer

    batches = []

    class Recording(CAPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            batches.append({"advantages": out["advantages"].flatten().tolist(),
                            "completion_mask": out["completion_mask"].sum(1).tolist()})
            return out

    torch.manual_seed(0)
    args = CAPOConfig(output_dir=out_dir, **{**COMMON, **RUNS[name]})
    trainer = Recording(model=model_dir, reward_funcs=digit_reward, args=args, train_dataset=tiny_dataset())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    steps = [{k: v for k, v in row.items() if isinstance(v, (int, float)) and "time" not in k and "per_second" not in k
              and k not in ("epoch", "total_flos", "train_loss")}
             for row in trainer.state.log_history if "loss" in row]
    weights = sum(p.detach().double().abs().sum().item() for p in trainer.model.parameters())
    return {"steps": steps, "batches": batches, "weight_abs_sum": weights}


# What "the same run" means on another machine. Discrete outcomes (lengths, kept rows, counts, rewards,
# schedules) must be equal: any difference is a change of behaviour. Real numbers drift with the CPU's
# kernels (SIMD width, oneDNN/MKL paths, thread count) and package versions; a small relative tau divides
# score differences, so a last-bit change in `s` grows to ~1e-6 or more in an advantage, and 3 training
# steps compound it. Measured against the recording on one machine (python tests/golden.py --drift):
# ATEN_CPU_CAPABILITY=default / avx2 and 2 threads moved advantages by at most 8.9e-5 (scapo; 2.1e-6 for
# capo-mask-auto), logged reals by at most 1.9e-6 absolute (loss near 0) or 1.6e-5 relative
# (capo/score_spread), the weights' |sum| by 1.0e-6 relative. The tolerances are ~10x those: still far
# below what a behaviour change moves (tau 1.0 -> 1.02 moves capo-mask-auto's advantages by > 1e-3).
ADVANTAGE_ABS = 1e-3
STEP_REL, STEP_ABS = 2e-4, 2e-5
WEIGHT_REL = 1e-5
# The std of discrete rewards is a float32 reduction: its last bit differs between CPUs (0.40311288833618164 on an
# Intel Xeon with AMX, 0.40311291813850403 recorded on an AMD EPYC: one ulp, 7.4e-8 relative), so it is compared
# to STD_REL, far below what one changed reward moves it (0.4031 -> 0.3416 at 16 samples).
STD_REL = 1e-6
EXACT_KEYS = ("step", "num_tokens", "learning_rate", "reward", "frac_reward_zero_std",
              "capo/kept_frac", "capo/dropped_correct", "capo/dropped_wrong", "capo/mixed_group_frac",
              "capo/mask_guard_kept", "capo/ref_cache_hit_rate", "codapo/replay_batch",
              "codapo/selected_questions", "cde/omega", "dcpo/format_rate", "rlcr/format_rate", "scapo/strength")
EXACT_PREFIXES = ("completions/", "rewards/")


def is_std(key: str) -> bool:
    return key == "reward_std" or (key.startswith("rewards/") and key.endswith("/std"))


def is_exact(key: str) -> bool:
    return not is_std(key) and (key in EXACT_KEYS or key.startswith(EXACT_PREFIXES))


def close(a, b, rel: float = 0.0, abs_: float = 0.0) -> bool:
    """Numbers within ``rel``/``abs_`` (both 0: equal), NaN equal to NaN, structures recursively."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel, abs_) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    return a == b


# Metrics logged since the recording: they add a number to each step's log and change nothing the run does.
NEW_METRICS = {"capo/answered_truncated_frac", "capo/truncated_adv_share", "capo/truncated_adv_share_grpo"}


def differences(got: dict, expected: dict) -> list[str]:
    """Every way ``got`` is not the same run as ``expected`` (empty: the same), by the rules above."""
    out = []
    if len(got["batches"]) != len(expected["batches"]) or len(got["steps"]) != len(expected["steps"]):
        return [f"{len(got['batches'])} batches / {len(got['steps'])} steps, recorded "
                f"{len(expected['batches'])} / {len(expected['steps'])}"]
    for i, (a, b) in enumerate(zip(got["batches"], expected["batches"])):
        if a["completion_mask"] != b["completion_mask"]:
            out.append(f"batch {i}: kept tokens per row {a['completion_mask']} != {b['completion_mask']}")
        if not close(a["advantages"], b["advantages"], abs_=ADVANTAGE_ABS):
            worst = max(abs(x - y) for x, y in zip(a["advantages"], b["advantages"])) \
                if len(a["advantages"]) == len(b["advantages"]) else "length"
            out.append(f"batch {i}: advantages differ by {worst} (> {ADVANTAGE_ABS})")
    for a, b in zip(got["steps"], expected["steps"]):
        if a.keys() - NEW_METRICS != b.keys():
            out.append(f"step {b['step']}: logged keys {sorted((a.keys() - NEW_METRICS) ^ b.keys())} differ")
        for key in a.keys() & b.keys():
            rel, abs_ = (STD_REL, 0.0) if is_std(key) else (0.0, 0.0) if is_exact(key) else (STEP_REL, STEP_ABS)
            if not close(a[key], b[key], rel, abs_):
                out.append(f"step {b['step']}: {key} = {a[key]!r}, recorded {b[key]!r}")
    if not close(got["weight_abs_sum"], expected["weight_abs_sum"], rel=WEIGHT_REL):
        out.append(f"weights' |sum| {got['weight_abs_sum']!r}, recorded {expected['weight_abs_sum']!r}")
    return out


def environment() -> dict:
    """What the numbers may depend on: package versions, the CPU and the kernels torch picked."""
    import platform
    from importlib.metadata import version

    import torch

    flags = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "sse4")))
                break
    except OSError:
        pass
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"python": platform.python_version(), "machine": platform.machine(), "cpu": model, "cpu_flags": flags,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads(),
            "packages": {name: version(name) for name in ("torch", "transformers", "trl", "accelerate", "numpy")}}


def record_all(model_dir: str, tmp: str) -> dict:
    return {name: record(name, model_dir, str(Path(tmp) / name)) for name in RUNS}


if __name__ == "__main__":
    # python tests/golden.py            rewrite the recording (and ENVIRONMENT next to it)
    # python tests/golden.py --drift    replay every run here and print the largest differences
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("GOLDEN_THREADS", "1")))
    from capo_trl.testing.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model")
        golden = record_all(model_dir, tmp)
    if "--drift" in sys.argv:
        expected = json.loads(GOLDEN.read_text())
        for name in RUNS:
            adv = max(abs(x - y) for a, b in zip(golden[name]["batches"], expected[name]["batches"])
                      for x, y in zip(a["advantages"], b["advantages"]))
            print(f"{name:24s} max |advantage drift| {adv:.2g}; " + ("; ".join(differences(golden[name], expected[name]))
                                                                   or "within tolerance"))
    else:
        GOLDEN.write_text(json.dumps(golden, indent=1, allow_nan=True) + "\n")
        ENVIRONMENT.write_text(json.dumps(environment(), indent=1) + "\n")
        print(f"wrote {GOLDEN}: {len(golden)} runs, and {ENVIRONMENT}")
