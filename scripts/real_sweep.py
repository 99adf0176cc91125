"""The real model's exploratory sweep (docs/results/smollm2-sweep/protocol.md): one arm's run, kept as a file.

    python scripts/real_sweep.py ARM RUN_DIR     # e.g. S1 runs/sweep/S1: writes docs/results/smollm2-sweep/ARM.json

Reads the newest checkpoint's ``trainer_state.json`` (every logged row: the training rows every
``logging_steps`` and the CalibrationCallback's validation points, ``val/*``) and the wall time the
launcher wrote beside the run (``RUN_DIR.times``: ``start ...`` / ``end ... wall_s=N``). The arm's
settings are the protocol's (:data:`ARMS`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "smollm2-sweep"
VAL = ("val/mean@4", "val/mean@4_ci_low", "val/mean@4_ci_high", "val/auroc", "val/auroc_question", "val/ece",
       "val/mean_tokens", "val/finished_frac")
ARMS = {"S1": {"learning_rate": 1e-3, "layers": "top 4 (26-29)"}, "S2": {"learning_rate": 3e-3, "layers": "top 4 (26-29)"},
        "S3": {"learning_rate": 1e-3, "layers": "top 8 (22-29)"}}
TRAIN = ("reward", "completions/mean_length", "completions/clipped_ratio", "grad_norm", "step_time", "capo/skipped_frac")


def newest_checkpoint(run: Path) -> Path:
    found = sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not found:
        sys.exit(f"{run} has no checkpoint-* folder: nothing to collect")
    return found[-1]


def wall_seconds(times: Path) -> list[int]:
    """Each finished segment's wall time (a resumed run has several)."""
    return [int(m) for m in re.findall(r"wall_s=(\d+)", times.read_text())] if times.is_file() else []


def collect(arm: str, run: Path) -> dict:
    checkpoint = newest_checkpoint(run)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    history = state["log_history"]
    val, seen = [], set()
    for r in history:  # a run resumed on an evaluation step by the code the sweep froze measured it again
        if "val/mean@4" in r and r["step"] not in seen:
            seen.add(r["step"])
            val.append({"step": r["step"], **{k: r[k] for k in VAL if k in r}})
    train = [{"step": r["step"], **{k: r[k] for k in TRAIN if k in r}} for r in history if "reward" in r]
    return {"arm": arm, **ARMS[arm], "global_step": state["global_step"], "checkpoint": checkpoint.name, "validation": val,
            "train": train, "wall_s": wall_seconds(run.parent / f"{run.name}.times")}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    result = collect(sys.argv[1], Path(sys.argv[2]))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{sys.argv[1]}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT / (sys.argv[1] + '.json')}: step {result['global_step']}, {len(result['validation'])} validations")
