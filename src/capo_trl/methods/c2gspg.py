"""C2GSPG: confidence-scaled advantages and its own sequence loss (no ratio, no clip)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..advantages import group_nanmean
from .base import AdvantageInputs, Method, check_fields, help_text


def c2gspg_advantages(rewards: torch.Tensor, scores: torch.Tensor, num_generations: int,
                      eps: float = 1e-6) -> torch.Tensor:
    """``A_i = (R_i - mean R) / (1 - C_i + eps)``, ``C_i = exp(s_i)``: a confident completion's
    advantage is amplified (both signs), so confidently wrong answers are pushed down hardest."""
    centred = rewards.float() - group_nanmean(rewards.float(), num_generations)
    adv = centred / (1.0 - torch.exp(scores.to(centred.device).float()) + eps)
    return torch.nan_to_num(adv, nan=0.0, posinf=0.0, neginf=0.0)


def c2gspg_loss(seq_logp: torch.Tensor, advantages: torch.Tensor, rewards: torch.Tensor, beta: float = 0.01,
                eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """``-mean_i[log C_i A_i + beta (R_i log C_i + (1 - R_i) log(1 - C_i))]`` with ``log C_i`` the
    current policy's mean token log-prob (no ratio, no clipping). Rows with NaN reward or no tokens
    contribute 0 but count in the mean (like TRL's ``"grpo"`` loss)."""
    valid = torch.isfinite(seq_logp) & torch.isfinite(rewards)
    log_c = torch.where(valid, seq_logp, torch.zeros_like(seq_logp))
    r = torch.where(valid, rewards.to(log_c.dtype), torch.zeros_like(log_c))
    log_1mc = torch.log(-torch.expm1(log_c.clamp(max=-eps)))  # log(1 - C), finite at C -> 1
    calibration = r * log_c + (1.0 - r) * log_1mc
    per = torch.where(valid, log_c * advantages.to(log_c.dtype) + beta * calibration, torch.zeros_like(log_c))
    n = max(1, per.numel())
    cal = (calibration * valid).sum().item() / max(1, int(valid.sum()))
    return -per.sum() / n, {"c2gspg/calibration_term": cal}


# GRPOConfig fields read only by TRL's loss, which C2GSPG's replaces (loss_type also selects the sapo/vespo
# fields; use_adaptive_entropy its entropy_coef_* fields). beta, its own check above.
TRL_LOSS_FIELDS = ("loss_type", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "entropy_coef",
                   "use_adaptive_entropy", "top_entropy_quantile", "off_policy_mask_threshold")


@dataclass
class C2GSPGArgs:
    """C2GSPG's field of :class:`~capo_trl.CAPOConfig`."""

    c2gspg_beta: float = field(default=0.01, metadata=help_text(
        "C2GSPG: weight of the calibration (log-loss) term."))


class C2GSPG(Method):
    """Confidence-scaled advantage; the loss is :func:`c2gspg_loss` of the current mean token log-probs."""

    name = "c2gspg"
    Args = C2GSPGArgs

    @classmethod
    def validate(cls, args: C2GSPGArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, nonneg=("c2gspg_beta",))

    def check(self, config) -> None:
        if config.beta != 0:
            raise ValueError(f"CAPOConfig.beta={config.beta} is ignored by advantage_estimator='c2gspg' (its loss "
                             "has no KL term); set beta=0.")
        defaults = {f.name: f.default for f in fields(config)}
        changed = [name for name in TRL_LOSS_FIELDS if name in defaults and getattr(config, name) != defaults[name]]
        if changed:
            given = ", ".join(f"{name}={getattr(config, name)!r}" for name in changed)
            raise ValueError(f"CAPOConfig.{given} {'is' if len(changed) == 1 else 'are'} ignored by advantage_estimator="
                             "'c2gspg' (its own loss replaces TRL's: no ratio, clip, entropy term or off-policy mask); "
                             f"leave {'it' if len(changed) == 1 else 'them'} at the default.")
        if getattr(config, "use_vllm", False) and getattr(config, "vllm_importance_sampling_correction", False):
            raise ValueError("CAPOConfig.vllm_importance_sampling_correction=True is ignored by advantage_estimator="
                             "'c2gspg' (its loss has no importance ratio to correct); set it to False to train on "
                             "vLLM's samples as they are, or use_vllm=False.")

    def advantages(self, batch: AdvantageInputs):
        return c2gspg_advantages(batch.rewards, batch.scores, batch.num_generations), {}

    def sequence_loss(self, seq_logp: torch.Tensor, advantages: torch.Tensor, rewards: torch.Tensor):
        return c2gspg_loss(seq_logp, advantages, rewards, self.args.c2gspg_beta)
