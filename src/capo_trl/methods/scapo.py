"""SCAPO (Pan et al., semifactual credit-augmented policy optimization), from its abstract.

A correct answer can be reinforced for the wrong reasons: a token whose probability moves when the
prompt is rewritten without changing the problem or its answer depends on task-irrelevant prompt
features. SCAPO measures that drift on the fixed sampled responses and, early in training, lowers
the advantage of the relatively unstable tokens; stability alone earns no extra credit.

The released code (DtYXs/SCAPO) could not be read here, so the rewrites, the drift statistic, the
normalisation and the schedule below are ours (docs/baselines.md lists them as deviations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import AdvantageInputs, Method, Rollout, check_fields, help_text

DEFAULT_REWRITES = ("Question: {prompt}", "{prompt}\n", "Solve the following problem.\n{prompt}")


def rewrite_prompt(prompt, template: str):
    """Apply ``template`` to a text prompt, or to the last user message of a conversational one."""
    if isinstance(prompt, str):
        return template.format(prompt=prompt)
    messages = [dict(m) for m in prompt]
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            message["content"] = template.format(prompt=message["content"])
            return messages
    raise ValueError("SCAPO rewrites the last user message of a conversational prompt; this prompt has none "
                     "with text content.")


def semifactual_drift(logps: torch.Tensor, rewritten: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` mean absolute change of each response token's log-prob over the ``K`` rewrites.

    ``logps`` (B, T) after the original prompt, ``rewritten`` (K, B, T) after each rewrite; 0 off the mask.
    """
    return (rewritten - logps.unsqueeze(0)).abs().mean(0) * mask


def stability_weights(drift: torch.Tensor, mask: torch.Tensor, strength: float) -> torch.Tensor:
    """``(B, T)`` advantage factors in ``[1 - strength, 1]``: 1 for tokens at or below their response's
    mean drift, down to ``1 - strength`` at one standard deviation above it (and beyond)."""
    m = mask.float()
    n = m.sum(1, keepdim=True).clamp(min=1)
    mean = (drift * m).sum(1, keepdim=True) / n
    std = (((drift - mean) ** 2 * m).sum(1, keepdim=True) / n).sqrt()
    unstable = ((drift - mean) / (std + 1e-8)).clamp(0.0, 1.0) * m
    return 1.0 - strength * unstable


def scapo_strength(step: int, strength: float, steps: int) -> float:
    """The down-weighting applies early in training: ``strength`` at step 0, linearly to 0 at ``steps``."""
    return strength * max(0.0, 1.0 - step / steps)


@dataclass
class SCAPOArgs:
    """SCAPO's fields of :class:`~capo_trl.CAPOConfig` (all defaults ours: the released values are unknown)."""

    scapo_rewrites: list[str] = field(default_factory=lambda: list(DEFAULT_REWRITES), metadata=help_text(
        "SCAPO: semifactual prompt rewrites, templates with one {prompt}; each costs one forward of the batch "
        "while scapo_strength > 0 (ours)."))
    scapo_strength: float = field(default=0.5, metadata=help_text(
        "SCAPO: largest relative reduction of an unstable token's advantage, in [0, 1] (ours)."))
    scapo_steps: int = field(default=100, metadata=help_text(
        "SCAPO: optimizer steps over which the reduction decays linearly to 0 (early training only; ours)."))


class SCAPO(Method):
    """GRPO's advantage per token, times the semifactual stability weight while the schedule is on."""

    name = "scapo"
    honours_aggregation = True  # its advantages are (built on) TRL\'s
    Args = SCAPOArgs

    @classmethod
    def validate(cls, args: SCAPOArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, unit=("scapo_strength",), count=("scapo_steps",))
        rewrites = args.scapo_rewrites
        if not isinstance(rewrites, (list, tuple)) or not rewrites or not all(
                isinstance(t, str) and t.count("{prompt}") == 1 and t != "{prompt}" for t in rewrites):
            raise ValueError(f"{prefix}scapo_rewrites={rewrites!r} is invalid; give one or more templates, each "
                             "containing '{prompt}' exactly once and something else besides.")

    def rollout_inputs(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        strength = scapo_strength(rollout.step, self.args.scapo_strength, self.args.scapo_steps)
        if strength == 0.0 or not rollout.training:
            return {}
        mask = rollout.completion_mask.float()
        original = rollout.score(rollout.prompts)
        rewritten = torch.stack([rollout.score([rewrite_prompt(p, t) for p in rollout.prompts])
                                 for t in self.args.scapo_rewrites])
        drift = semifactual_drift(original, rewritten, mask)
        return {"scapo_weights": stability_weights(drift, mask, strength), "scapo_drift": drift, "scapo_mask": mask}

    def advantages(self, batch: AdvantageInputs):
        weights = batch.extra.get("scapo_weights")
        if weights is None:  # after the early-training window: plain GRPO, no extra forwards
            return batch.trl_advantages, {"scapo/strength": 0.0}
        mask = batch.extra["scapo_mask"] > 0
        per_token = batch.trl_advantages.unsqueeze(1) * weights.to(batch.trl_advantages.device)
        unstable = ((weights < 1) & mask).float()
        return per_token, {"scapo/strength": scapo_strength(batch.step, self.args.scapo_strength,
                                                            self.args.scapo_steps),
                           "scapo/drift_mean": batch.extra["scapo_drift"][mask].mean().item() if mask.any() else 0.0,
                           "scapo/downweighted_frac": unstable.sum().item() / max(1, int(mask.sum()))}
