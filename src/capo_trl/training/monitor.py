"""The ``capo/*`` calibration metrics of one rollout batch, logged every step for every method, the signals of a
drift into completions that never end, and the warnings for a rollout that cannot train or is heading there."""

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


def truncation_signals(batch, advantages: torch.Tensor, args, watch: DriftWatch, step: int,
                       training: bool) -> tuple[dict[str, float], list[str]]:
    """The drift signals of one rollout and the warnings due now: every completion truncated and masked out of the
    loss (once), the drift rule (once)."""
    truncated = batch.truncated
    if truncated is None:
        return {}, []
    rewards = batch.rewards
    share = truncated_share(advantages, truncated, rewards)
    grpo = truncated_share(batch.trl_advantages.to(advantages.device, advantages.dtype), truncated, rewards)
    answered = (truncated.to(rewards.device) & (rewards >= args.correct_threshold)).float().mean().item()
    warnings = []
    if training:
        if args.mask_truncated_completions and bool(truncated.all()) and not watch.warned_all:
            watch.warned_all = True
            warnings.append(all_truncated_warning(step, truncated.numel(), args.max_completion_length))
        drift = watch.observe(step, truncated.float().mean().item(), answered, share, grpo,
                              f"advantage_estimator={args.advantage_estimator!r}")
        if drift is not None:
            warnings.append(drift)
    return {"capo/truncated_adv_share": share, "capo/truncated_adv_share_grpo": grpo,
            "capo/answered_truncated_frac": answered}, warnings


def all_truncated_warning(step: int, n: int, max_completion_length: int) -> str:
    """Why a step whose completions all ran to the limit trains nothing, and why a run rarely leaves that state."""
    return (f"global_step {step}: all {n} completions of the rollout ran to max_completion_length="
            f"{max_completion_length} without an EOS, "
            "and mask_truncated_completions leaves every one out of the loss, so they train nothing. A run "
            "that samples only such completions stays there (nothing in the loss pushes it back): watch "
            "completions/clipped_ratio, and stop the run or restart it with a lower learning_rate or a larger "
            "max_completion_length. Warned once per run.")


def truncated_share(advantages: torch.Tensor, truncated: torch.Tensor, rewards: torch.Tensor) -> float:
    """The net advantage on the completions cut at the limit, as a share of the batch's total |advantage| (0 when
    nothing has an advantage), so a smaller step does not count as a weaker push.

    Advantages of a group sum to zero, so the finished completions of those groups carry the opposite: a negative
    share is a push back towards answers that end, which ``mask_truncated_completions`` (leaving the truncated rows
    themselves out of the loss) keeps. GRPO's share on the same batch is the yardstick (:class:`DriftWatch`).
    """
    valid = torch.isfinite(rewards) & torch.isfinite(advantages)
    cut = valid & truncated.to(valid.device)
    total = advantages[valid].abs().sum().item()
    return advantages[cut].sum().item() / total if total > 0 else 0.0


class DriftWatch:
    """Warns once when a run heads for completions that never end while its method barely pushes back.

    The rule (checked against the committed real-model runs, docs/training.md), over the last ``window`` steps:

    - the clipped ratio is at least ``min_clipped`` and ``rise`` times its mean over the run's first ``window``
      steps, or the share of completions that gave a right answer and then ran to the limit is at least
      ``min_answered``;
    - and the method's push against truncated completions is below ``max_push`` of GRPO's: the sum of its
      :func:`truncated_share` over those steps over the sum of GRPO's (GRPO's own is 1 by definition).
    """

    def __init__(self, window: int = 10, min_clipped: float = 0.1, rise: float = 2.0, min_answered: float = 0.02,
                 max_push: float = 0.5):
        self.window, self.min_clipped, self.rise = window, min_clipped, rise
        self.min_answered, self.max_push = min_answered, max_push
        # (clipped, answered, share, grpo share) of the run's first ``window`` steps and of its last ``window``
        self.first: list[tuple[float, float, float, float]] = []
        self.last: list[tuple[float, float, float, float]] = []
        self.steps = 0  # rollouts observed
        self.warned = False
        self.warned_all = False  # the all-truncated warning's own flag

    def state_dict(self) -> dict:
        """What the rule has seen, saved in each checkpoint so that a resumed run warns as an unstopped one would."""
        return {"first": [list(r) for r in self.first], "last": [list(r) for r in self.last], "steps": self.steps,
                "warned": self.warned, "warned_all": self.warned_all}

    def load_state_dict(self, state: dict) -> None:
        self.first, self.last = [tuple(r) for r in state["first"]], [tuple(r) for r in state["last"]]
        self.steps, self.warned, self.warned_all = state["steps"], state["warned"], state["warned_all"]

    def push(self) -> float:
        """The method's push over the last ``window`` steps as a fraction of GRPO's (NaN: GRPO pushed none)."""
        grpo = sum(r[3] for r in self.last)
        return sum(r[2] for r in self.last) / grpo if grpo < 0 else float("nan")

    def observe(self, step: int, clipped: float, answered: float, share: float, grpo: float,
                settings: str) -> str | None:
        """Record one training rollout; the warning's text the first time the rule holds, else None."""
        w, row = self.window, (clipped, answered, share, grpo)
        self.steps += 1
        if len(self.first) < w:
            self.first.append(row)
        self.last = [*self.last, row][-w:]
        if self.warned or self.steps < 2 * w:
            return None
        start = float(np.mean([r[0] for r in self.first]))
        recent, kept_writing = (float(np.mean([r[i] for r in self.last])) for i in (0, 1))
        heading = recent >= max(self.min_clipped, self.rise * start) or kept_writing >= self.min_answered
        push = self.push()
        if not (heading and push < self.max_push):
            return None
        self.warned = True
        return (f"global_step {step}: over the last {w} steps {recent:.2f} of the completions ran to "
                f"max_completion_length (completions/clipped_ratio; {start:.2f} over the first {w}) and {kept_writing:.2f} "
                f"gave a right answer and then kept writing to it (capo/answered_truncated_frac), while {settings} "
                f"pushed against truncated completions {push:.2f} as hard as GRPO would (capo/truncated_adv_share over "
                "capo/truncated_adv_share_grpo). On SmolLM2-135M-Instruct, CAPO runs in this state went on to answers "
                "that all run to the limit, and then trained no more (docs/training.md, 'Drift into answers that never "
                "end'). Settings that restore the push: score_span='answer' (score the answer's own tokens) or "
                "truncated_pairs='tied'; or lower learning_rate. Warned once per run.")


def replay_drift(logs: list[dict], every: int = 5, settings: str = "advantage_estimator='capo'") -> int | None:
    """The logged step at which :class:`DriftWatch` would have warned, replayed from a run's logged means (TRL's
    ``log_history`` or a study record's ``train``), so a finished run's logs say whether the warning came in time.

    Each log stands for the ``every`` steps it averages (``logging_steps``), so a warning counts at the log whose
    steps made it hold. A signal a log lacks counts as none (no right answer kept writing; no push, 0 of GRPO's),
    which is how logs from before these signals are replayed.
    """
    watch = DriftWatch()
    for log in logs:
        if "completions/clipped_ratio" not in log:
            continue
        for _ in range(every):
            if watch.observe(log["step"], log["completions/clipped_ratio"], log.get("capo/answered_truncated_frac", 0.0),
                             log.get("capo/truncated_adv_share", 0.0), log.get("capo/truncated_adv_share_grpo", -1.0),
                             settings):
                return log["step"]
    return None
