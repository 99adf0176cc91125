"""Advantage estimators and the noise mask, as pure tensor functions.

Everything here works on the *global* batch laid out as contiguous prompt groups of
``num_generations`` completions (TRL's layout), is vectorised over groups, and has no trainer,
no I/O and no state. The CAPO formulas (``docs/concepts.md``) live in :func:`capo_advantages`.

Conventions shared by every function:

* ``rewards`` is a float tensor of shape ``(N,)``; ``NaN`` marks an unscorable completion (every
  reward function returned ``None``). Such rows get advantage ``0`` and take part in no pair.
* ``scores`` is ``s_i``, the mean completion-token log-prob under the rollout policy
  (``-log PPL``), detached. Non-finite scores are treated like NaN rewards.
"""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd

NORMALIZATIONS = ("group", "pairs", "none")
SURROGATES = ("logistic", "linear")
SCALES = ("paper", "bounded", "matched")
GRPO_SCALES = ("group", "batch", "none")
MASK_SIDES = ("both", "correct", "wrong")  # which answers the noise mask may drop


def _grouped(x: torch.Tensor, num_generations: int, name: str) -> torch.Tensor:
    if x.dim() != 1:
        raise ValueError(f"`{name}` must be 1-D (one value per completion), got shape {tuple(x.shape)}.")
    if num_generations < 1 or x.numel() % num_generations != 0:
        raise ValueError(
            f"`{name}` has {x.numel()} entries, which is not a multiple of num_generations={num_generations}; "
            "completions of one prompt must be contiguous groups of num_generations."
        )
    return x.view(-1, num_generations)


def capo_advantages(
    rewards: torch.Tensor,
    scores: torch.Tensor,
    num_generations: int,
    tau: float | torch.Tensor = 0.6,
    normalization: str = "group",
    surrogate: str = "logistic",
    scale: str = "paper",
    tied: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""CAPO's pairwise, perplexity-aware advantage: ``A~_i = -dL/ds_i``.

    ``L = sum_{a,b} w_ab phi_tau(s_a - s_b)`` with ``w_ab = max(R_a - R_b, 0)`` and the logistic
    AUC surrogate ``phi_tau(t) = log(1 + exp(-t / tau))``. Writing ``M_ab = w_ab sigma((s_b - s_a)/tau)/tau``
    gives ``A~ = M.sum(1) - M.sum(0)`` per group: a correct completion gains most when it is *less*
    confident than the wrong ones, a wrong one loses most when it is *more* confident. Pairs already
    ranked right by a wide margin get almost no gradient.

    ``surrogate="linear"`` (``phi(t) = -t``) with ``normalization="group"`` gives exactly
    ``R_i - mean(R)`` (Dr. GRPO), which is what makes GRPO AUC-inconsistent.

    Args:
        rewards: ``(N,)`` total reward per completion, NaN = unscorable.
        scores: ``(N,)`` mean completion-token log-prob under the rollout policy.
        num_generations: group size ``G``; ``N`` must be a multiple of it.
        tau: surrogate temperature (> 0), a float or a ``(N // G,)`` tensor (one per group).
        normalization: ``"group"`` divides by the number of scorable completions of the group,
            ``"pairs"`` by the number of ordered pairs with ``R_a > R_b``, ``"none"`` leaves the sum.
        surrogate: ``"logistic"`` (CAPO) or ``"linear"`` (reward-only, GRPO-like).
        scale: ``"paper"`` keeps the derivative's ``1/tau`` factor, so advantages grow without bound as
            ``tau`` shrinks. ``"bounded"`` multiplies by ``2 tau``: each pair then weighs
            ``2 sigma(.)`` in ``(0, 2)``, and as ``tau -> inf`` the advantage tends to Dr. GRPO's
            ``R_i - mean(R)`` whatever the scale of the scores (ignored for ``"linear"``).
            (``"matched"`` is applied by the registry's ``capo`` estimator, which knows GRPO's
            advantages: here it behaves like ``"bounded"``.)
        tied: ``(N,)`` bool, rows whose score ranks nothing (a completion cut before it gave its answer):
            each of their pairs weighs as if the two scores were equal, ``sigma(0)``, so such a row is
            credited by its reward alone, as GRPO credits it. ``None``: every score ranks.

    Returns:
        ``(N,)`` float tensor, zero for unscorable rows and for groups whose rewards all tie.
    """
    _check_options(normalization=(normalization, NORMALIZATIONS), surrogate=(surrogate, SURROGATES),
                   scale=(scale, SCALES))
    R = _grouped(rewards.float(), num_generations, "rewards")
    s = _grouped(scores.to(R.device, torch.float32), num_generations, "scores")
    valid = torch.isfinite(R) & torch.isfinite(s)
    R = torch.where(valid, R, 0.0)
    s = torch.where(valid, s, 0.0)
    pair_valid = valid[:, :, None] & valid[:, None, :]
    W = torch.relu(R[:, :, None] - R[:, None, :]) * pair_valid  # w_ab, (groups, G, G)
    if tied is not None:
        t = _grouped(tied.to(R.device, torch.bool), num_generations, "tied")
        tied_pairs = t[:, :, None] | t[:, None, :]
    else:
        tied_pairs = None
    M = _pair_gradients(W, s, tau, scale, tied_pairs) if surrogate == "logistic" else W
    adv = M.sum(dim=2) - M.sum(dim=1)
    if normalization == "group":
        adv = adv / valid.sum(dim=1, keepdim=True).clamp(min=1)
    elif normalization == "pairs":
        adv = adv / (W > 0).sum(dim=(1, 2)).clamp(min=1).unsqueeze(1)
    return torch.where(valid, adv, 0.0).reshape(-1)


def _check_options(**options: tuple[str, tuple[str, ...]]) -> None:
    """Each ``name=(value, allowed)`` must have its value among the allowed ones."""
    for name, (value, allowed) in options.items():
        if value not in allowed:
            raise ValueError(f"{name}={value!r}; expected one of {allowed}.")


def _pair_gradients(W: torch.Tensor, s: torch.Tensor, tau, scale: str,
                    tied_pairs: torch.Tensor | None = None) -> torch.Tensor:
    """``M_ab = w_ab sigma((s_b - s_a) / tau)`` times ``1/tau`` (``scale="paper"``) or 2 (bounded); a tied
    pair's score gap counts as 0."""
    tau_t = torch.as_tensor(tau, dtype=torch.float32, device=W.device)
    if bool((tau_t <= 0).any()) or not bool(torch.isfinite(tau_t).all()):
        raise ValueError(f"tau must be finite and > 0, got {tau}.")
    tau_t = tau_t.reshape(-1, 1, 1) if tau_t.dim() else tau_t
    D = s[:, :, None] - s[:, None, :]  # s_a - s_b
    if tied_pairs is not None:
        D = D.masked_fill(tied_pairs, 0.0)
    return W * torch.sigmoid(-D / tau_t) * (1.0 / tau_t if scale == "paper" else 2.0)


def within_group_std(rewards: torch.Tensor, scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Pooled within-group standard deviation of the scores over *mixed* groups (rewards not all equal).

    This is the natural unit of ``tau``: the surrogate compares score gaps inside a group, and only
    mixed groups carry pairs. NaN when the batch has no mixed group with two scorable samples.
    """
    R = _grouped(rewards.float(), num_generations, "rewards")
    s = _grouped(scores.to(R.device, torch.float32), num_generations, "scores")
    valid = torch.isfinite(R) & torch.isfinite(s)
    n = valid.sum(dim=1)
    mixed = mixed_groups(rewards, valid.reshape(-1), num_generations) & (n >= 2)
    if not bool(mixed.any()):
        return torch.tensor(float("nan"))
    s0 = torch.where(valid, s, 0.0)
    mean = s0.sum(1, keepdim=True) / n.clamp(min=1).unsqueeze(1)
    ss = (torch.where(valid, s - mean, 0.0) ** 2).sum(1)
    return torch.sqrt(ss[mixed].sum() / (n[mixed] - 1).sum())


def quartile_thresholds(
    rewards: torch.Tensor, ref_ppl: torch.Tensor, correct_threshold: float = 0.5
) -> tuple[float, float]:
    """The paper's rule for the mask: ``ref_high`` = upper quartile of the reference PPL on correct
    answers, ``ref_low`` = lower quartile on wrong ones (NaN when a class is absent)."""
    ok = torch.isfinite(ref_ppl) & torch.isfinite(rewards)
    correct, wrong = ok & (rewards >= correct_threshold), ok & (rewards < correct_threshold)
    high = torch.quantile(ref_ppl[correct].double(), 0.75).item() if correct.any() else float("nan")
    low = torch.quantile(ref_ppl[wrong].double(), 0.25).item() if wrong.any() else float("nan")
    return high, low


def reward_scale(rewards: torch.Tensor, num_generations: int, scale: str = "group") -> torch.Tensor:
    """The divisor of TRL's ``scale_rewards``, per sample: ``std + 1e-4`` of the group (``"group"``)
    or of the batch (``"batch"``), or ``1`` (``"none"``). NaN rewards are left out of the std."""
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale={scale!r}; expected one of {GRPO_SCALES}.")
    R = _grouped(rewards.float(), num_generations, "rewards")
    if scale == "none":
        return torch.ones(R.numel(), device=R.device)
    if scale == "group":
        std = nanstd(R, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(R[:, :1])
    else:
        std = nanstd(R) if R.numel() > 1 else torch.zeros(())
    return (torch.nan_to_num(std, nan=0.0) + 1e-4).expand_as(R).reshape(-1)


def grpo_advantages(rewards: torch.Tensor, num_generations: int, scale: str = "group") -> torch.Tensor:
    """GRPO's reward-only advantage, the formula TRL's ``scale_rewards`` uses.

    ``(R - group mean) / (std + 1e-4)`` with the std of the group (``"group"``), of the whole batch
    (``"batch"``) or none (``"none"``, Dr. GRPO). NaN rewards are left out of the statistics and get 0.
    """
    R = _grouped(rewards.float(), num_generations, "rewards")
    centred = (R - torch.nanmean(R, dim=1, keepdim=True)).reshape(-1)
    return torch.nan_to_num(centred / reward_scale(rewards, num_generations, scale), nan=0.0)


def noise_mask(
    rewards: torch.Tensor,
    ref_ppl: torch.Tensor,
    ref_high: float = 2.5,
    ref_low: float = 1.05,
    correct_threshold: float = 0.5,
    side: str = "both",
) -> torch.Tensor:
    """CAPO's reference-perplexity noise mask; ``True`` = keep the completion in the loss.

    The reference model (the initial policy) is taken as calibrated, so a *correct* answer it finds
    implausible (``PPL_ref > ref_high``: a lucky guess) and a *wrong* answer it finds near-certain
    (``PPL_ref < ref_low``: likely a grader miss) are treated as label noise and dropped. Both
    thresholds are inclusive keeps. Rows without evidence (NaN reward or NaN PPL) are kept.
    ``side`` applies one test only (``"correct"``: ``ref_high`` on correct answers; ``"wrong"``:
    ``ref_low`` on wrong ones), so a study can tell which half of the mask does what.
    """
    if side not in MASK_SIDES:
        raise ValueError(f"side={side!r}; expected one of {MASK_SIDES}.")
    ppl = ref_ppl.to(rewards.device, torch.float32)
    correct = rewards >= correct_threshold
    wrong = rewards < correct_threshold  # NaN compares False on both sides
    drop_correct = correct & (ppl > ref_high) if side != "wrong" else torch.zeros_like(correct)
    drop_wrong = wrong & (ppl < ref_low) if side != "correct" else torch.zeros_like(wrong)
    return ~(drop_correct | drop_wrong)


def mean_token_logprob(per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence score ``s = mean_t log p`` over masked-in tokens; NaN for an empty mask."""
    mask = mask.to(per_token_logps.dtype)
    total = (per_token_logps * mask).sum(dim=-1)
    count = mask.sum(dim=-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def match_group_l1(advantages: torch.Tensor, reference: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Rescale each group so that its total |advantage| equals ``reference``'s (GRPO's).

    CAPO then only *redistributes* GRPO's credit inside a group, towards mis-ranked pairs, with
    GRPO's step size whatever ``tau``: accuracy and calibration effects are not confounded with a
    change of learning rate. A group whose CAPO advantages are all zero stays zero.
    """
    a = _grouped(advantages.float(), num_generations, "advantages")
    ref = _grouped(reference.to(a.device, torch.float32), num_generations, "reference")
    mass, target = a.abs().sum(1, keepdim=True), ref.abs().sum(1, keepdim=True)
    return torch.where(mass > 0, a * target / mass.clamp(min=1e-12), 0.0).reshape(-1)


def correctness(rewards: torch.Tensor, threshold: float) -> torch.Tensor:
    """1/0 correctness (``reward >= threshold``) with NaN kept: unscorable stays unscorable."""
    r = rewards.float()
    return torch.where(torch.isnan(r), r, (r >= threshold).float())


def group_nanmean(x: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Per-sample mean of its group, NaN entries left out."""
    return torch.nanmean(_grouped(x, num_generations, "x"), dim=1).repeat_interleave(num_generations)


def mixed_groups(rewards: torch.Tensor, valid: torch.Tensor, num_generations: int,
                 correct_threshold: float | None = None) -> torch.Tensor:
    """``(groups,)`` True where the group's valid rows disagree: rewards not all equal or, with
    ``correct_threshold``, both correct and wrong answers. Only such groups carry pairs (signal)."""
    R = _grouped(rewards.float(), num_generations, "rewards")
    if correct_threshold is not None:
        R = (R >= correct_threshold).float()
    v = _grouped(valid, num_generations, "valid")
    high = torch.where(v, R, -float("inf")).amax(1)
    low = torch.where(v, R, float("inf")).amin(1)
    return high > low
