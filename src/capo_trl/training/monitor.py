"""The ``capo/*`` calibration metrics of one rollout batch, logged every step for every method, and the warning
for a rollout that cannot train."""

from __future__ import annotations

import numpy as np
import torch

from ..advantages import mixed_groups
from ..evaluation.calibration import auroc_per_question


def rollout_metrics(rewards: torch.Tensor, scores: torch.Tensor, advantages: torch.Tensor, num_generations: int,
                    correct_threshold: float, keep: torch.Tensor | None = None,
                    ref_ppl: torch.Tensor | None = None) -> dict[str, float]:
    """AUROC of the score vs correctness (pooled and within groups), signal and mask statistics.

    All inputs are the global batch: ``(N,)`` rewards (NaN = unscorable), scores ``s`` and
    per-sample advantages; ``keep`` the mask's verdict (None: off); ``ref_ppl`` the reference PPL.
    """
    valid = torch.isfinite(rewards) & torch.isfinite(scores)
    correct = rewards >= correct_threshold
    groups = torch.arange(rewards.numel(), device=rewards.device) // num_generations
    s, c, g = scores[valid].cpu().numpy(), correct[valid].cpu().numpy(), groups[valid].cpu().numpy()
    kept = keep if keep is not None else torch.ones_like(valid)
    out = {
        # pooled AUROC = the Mann-Whitney statistic of a single group: 20x cheaper than sklearn per step
        "capo/auroc": auroc_per_question(s, c, np.zeros_like(g))[0],
        "capo/auroc_group": auroc_per_question(s, c, g)[0],
        "capo/mixed_group_frac": mixed_groups(rewards, valid, num_generations, correct_threshold).float().mean().item(),
        "capo/adv_abs_mean": advantages[valid].abs().mean().item() if valid.any() else 0.0,
        "capo/kept_frac": kept.float().mean().item(),
        "capo/dropped_correct": (~kept & correct).float().mean().item(),
        "capo/dropped_wrong": (~kept & ~correct & torch.isfinite(rewards)).float().mean().item(),
    }
    if ref_ppl is not None:
        out["capo/ref_ppl_mean"] = torch.nanmean(ref_ppl).item()
    return out


def all_truncated_warning(step: int, n: int, max_completion_length: int) -> str:
    """Why a step whose completions all ran to the limit trains nothing, and why a run rarely leaves that state."""
    return (f"global_step {step}: all {n} completions of the rollout ran to max_completion_length="
            f"{max_completion_length} without an EOS, "
            "and mask_truncated_completions leaves every one out of the loss, so they train nothing. A run "
            "that samples only such completions stays there (nothing in the loss pushes it back): watch "
            "completions/clipped_ratio, and stop the run or restart it with a lower learning_rate or a larger "
            "max_completion_length. Warned once per run.")
