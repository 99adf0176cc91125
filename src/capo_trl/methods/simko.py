"""SimKO: top-K smoothing of the PPO ratio at forking tokens (needs the full logits in the loss)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import AdvantageInputs, Method, check_fields, help_text

SIMKO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def simko_token_logps(logits: torch.Tensor, completion_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                      negative: torch.Tensor, top_k: int = 3, alpha: float = 0.01, quantile: float = 0.8,
                      neg_scale: float = 1.1) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Log-probs whose *values* equal ``log pi(o_t)`` but whose *gradient* is SimKO's.

    At forking tokens (entropy above the row's ``quantile``): for a correct completion the gradient
    is ``(1 - alpha) grad log pi(o_t) + alpha/K sum_k grad log pi(v_k)`` over the current top-K
    ``v_k``, which makes TRL's ratio ``exp(logp - old)`` equal SimKO's smoothed ratio
    ``(1 - alpha) r_t + alpha/K sum_k sg(r_t) pi(v_k)/sg(pi(v_k))`` in value and gradient (so the
    PPO clip acts on it as in the released code); for a negative-advantage completion whose sampled
    token is the argmax, the gradient is scaled by ``neg_scale`` (= advantage x 1.1 under the clip).

    Args: ``logits`` (B, T, V) already divided by the temperature; ``mask`` (B, T) completion tokens;
    ``correct``/``negative`` (B,) booleans. Returns (logps, entropy, stats), padding positions 0.
    """
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    m = mask.bool()
    ent = entropy.detach()
    threshold = torch.stack([
        torch.quantile(row[rmask], quantile) if rmask.any() else row.new_tensor(float("inf"))
        for row, rmask in zip(ent, m)
    ]).unsqueeze(1)
    fork = (ent > threshold) & m
    topk = logp_all.gather(-1, logits.detach().topk(min(top_k, logits.size(-1)), dim=-1).indices).mean(-1)
    w = alpha * (fork & correct.to(fork.device).bool().unsqueeze(1)).to(logp.dtype)
    dlogp = logp - logp.detach()
    out = logp + w * (topk - topk.detach()) - w * dlogp
    argmax_hit = logits.detach().argmax(-1) == completion_ids
    boosted = fork & argmax_hit & negative.to(fork.device).bool().unsqueeze(1)
    out = out + (neg_scale - 1.0) * boosted.to(logp.dtype) * dlogp
    n = max(1, int(m.sum()))
    stats = {"simko/fork_frac": fork.sum().item() / n, "simko/neg_boost_frac": boosted.sum().item() / n}
    return out * m, entropy * m, stats


@dataclass
class SimKOArgs:
    """SimKO's fields of :class:`~capo_trl.CAPOConfig`."""

    simko_top_k: int = field(default=3, metadata=help_text("SimKO: K top tokens smoothed over."))
    simko_alpha: float = field(default=0.01, metadata=help_text("SimKO: smoothing weight alpha."))
    simko_entropy_quantile: float = field(default=0.8, metadata=help_text(
        "SimKO: forking tokens have entropy above this per-completion quantile."))
    simko_neg_scale: float = field(default=1.1, metadata=help_text(
        "SimKO: advantage factor at forking argmax tokens of negative-advantage completions."))


class SimKO(Method):
    """Plain GRPO advantage; SimKO changes the log-probs TRL's loss is computed from."""

    name = "simko"
    honours_aggregation = True  # its advantages are (built on) TRL\'s
    Args = SimKOArgs

    @classmethod
    def validate(cls, args: SimKOArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, positive=("simko_neg_scale",), unit=("simko_entropy_quantile", "simko_alpha"),
                     count=("simko_top_k",))

    def check(self, config) -> None:
        if config.loss_type not in SIMKO_LOSS_TYPES or config.importance_sampling_level != "token":
            raise ValueError(
                f"CAPOConfig.advantage_estimator='simko' smooths the token-level PPO ratio: it needs "
                f"importance_sampling_level='token' and a clipped loss_type {SIMKO_LOSS_TYPES}, got "
                f"importance_sampling_level={config.importance_sampling_level!r}, loss_type={config.loss_type!r}.")

    def advantages(self, batch: AdvantageInputs):
        return batch.trl_advantages, {}

    def token_logps(self, logits, completion_ids, mask, correct, negative):
        a = self.args
        return simko_token_logps(logits, completion_ids, mask, correct, negative, a.simko_top_k, a.simko_alpha,
                                 a.simko_entropy_quantile, a.simko_neg_scale)
