"""Fixed-seed 3-step runs of every method, recorded per step: the reference for "behaviour unchanged".

``python tests/golden.py`` rewrites ``tests/data/golden_steps.json`` (only do that when a change of
behaviour is intended and explained); ``tests/test_golden.py`` replays every run and compares.
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
COMMON = dict(per_device_train_batch_size=16, num_generations=4, max_completion_length=8, max_steps=3,
              learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", gradient_checkpointing=False,
              logging_steps=1, save_strategy="no", seed=5, temperature=1.0, disable_tqdm=True)
LOOSE = dict(ref_high=1e6, ref_low=1.0)
OFF = dict(noise_mask_guard=False)  # the mask as recorded before the guard existed
RUNS = {
    "grpo": dict(advantage_estimator="grpo"),
    "grpo-mask-auto": dict(advantage_estimator="grpo", noise_mask=True, ref_thresholds="auto", **OFF),
    "capo-paper-loose-mask": dict(advantage_estimator="capo", noise_mask=True, **LOOSE, **OFF),
    "capo-mask-auto": dict(advantage_estimator="capo", noise_mask=True, ref_thresholds="auto", tau=1.0,
                           tau_mode="relative", advantage_scale="bounded", **OFF),
    "capo-matched-pairs": dict(advantage_estimator="capo", noise_mask=False, advantage_scale="matched",
                               advantage_normalization="pairs"),
    "capo-linear": dict(advantage_estimator="capo", noise_mask=False, surrogate="linear"),
    "capo-beta": dict(advantage_estimator="capo", noise_mask=True, beta=0.04, **LOOSE, **OFF),
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
    from tiny import digit_reward, tiny_dataset

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


def close(a, b, tol: float = 1e-6) -> bool:
    """Numbers equal to ``tol`` (relative, or absolute near 0), NaN equal to NaN, structures recursively."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    return a == b


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model")
        golden = {name: record(name, model_dir, str(Path(tmp) / name)) for name in RUNS}
    GOLDEN.write_text(json.dumps(golden, indent=1, allow_nan=True) + "\n")
    print(f"wrote {GOLDEN}: {len(golden)} runs")
