"""The methods CAPO is compared with, as estimators in the same registry (``docs/baselines.md``).

Every method is an ``advantage_estimator`` name, so a comparison changes one config field and the
rest of the pipeline (sampling, TRL's PPO loss, the ``capo/*`` calibration metrics) is shared:

* ``dr_grpo``  ``R - mean R``; ``codapo`` difficulty x confidence weights (+ optional replay);
  ``cde``  perplexity exploration bonus with a staircase schedule;
* ``c2gspg``  its own sequence loss (no ratio, no clip) via ``sequence_loss``;
* ``simko``  top-K smoothing at forking tokens via ``token_logps`` (needs full logits);
* ``rlcr`` / ``dcpo``  verbalised confidence, parsed by ``parse_confidence`` (``verbalized.py``);
  ``dcpo`` returns per-token ``(N, T)`` advantages.
* GSPO is TRL's ``importance_sampling_level="sequence"`` (preset ``gspo`` in ``compare.py``).

Estimators may carry attributes the trainer looks for (duck typing, no trainer import here):
``parse_confidence(text) -> Verbalized``, ``sequence_loss(seq_logp, adv, rewards, cfg)`` and
``token_logps(logits, ids, mask, correct, negative, cfg)``. The math is in pure functions.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from .advantages import AdvantageInputs, _grouped, grpo_advantages, register_estimator
from .estimators.verbalized import (  # noqa: F401  (re-exported: the verbalised-confidence API)
    DCPO_INSTRUCTION,
    RLCR_INSTRUCTION,
    AnswerTagReward,
    RLCRReward,
    parse_dcpo_confidence,
    parse_rlcr,
    verbalized_calibration,
)

DCPO_ERRORS = ("abs", "sq")
SIMKO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


# --------------------------------------------------------------------------------------------
# pure math
# --------------------------------------------------------------------------------------------
def _correct(rewards: torch.Tensor, threshold: float) -> torch.Tensor:
    """1/0 correctness with NaN kept (unscorable stays unscorable)."""
    r = rewards.float()
    return torch.where(torch.isnan(r), r, (r >= threshold).float())


def _group_nanmean(x: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Per-sample mean of its group, NaN entries left out."""
    return torch.nanmean(_grouped(x, num_generations, "x"), dim=1).repeat_interleave(num_generations)


def codapo_weights(correct: torch.Tensor, scores: torch.Tensor, num_generations: int,
                   offset: float = 0.1) -> torch.Tensor:
    """CoDaPO's per-group weight ``c * d_w + offset`` (one per group).

    ``d = 1 - accuracy``; ``d_w = 1 - 4 (d - 0.5)^2`` peaks at medium difficulty; ``c = exp(mean s)``
    is the group's confidence. A group with nothing scorable gets ``offset``.
    """
    acc = torch.nanmean(_grouped(correct.float(), num_generations, "correct"), dim=1)
    s = _grouped(scores.float(), num_generations, "scores")
    s = torch.where(torch.isfinite(s), s, torch.nan)
    d = 1.0 - acc
    weight = torch.exp(torch.nanmean(s, dim=1)) * (1.0 - 4.0 * (d - 0.5) ** 2) + offset
    return torch.nan_to_num(weight, nan=offset)


def codapo_replay_groups(weights: torch.Tensor, num_groups_out: int, percentile: float = 0.75,
                         repeat: int = 4) -> list[int]:
    """Groups to replay: those with weight >= the ``percentile`` quantile, each ``repeat`` times in a
    row, cycling until ``num_groups_out`` groups are filled (the released code's refill rule)."""
    finite = weights[torch.isfinite(weights)]
    if finite.numel() == 0 or num_groups_out < 1:
        return []
    threshold = torch.quantile(finite.double(), percentile).item()
    chosen = [g for g, w in enumerate(weights.tolist()) if math.isfinite(w) and w >= threshold]
    order: list[int] = []
    while len(order) < num_groups_out:
        for g in chosen:
            order.extend([g] * repeat)
    return order[:num_groups_out]


def cde_omega(step: int, omega: float, stair_steps: int, stairs: int) -> float:
    """Staircase annealing: ``omega`` drops by ``omega / stairs`` every ``stair_steps`` and is 0 after
    ``stairs * stair_steps`` steps (CDE: strong exploration early, none late)."""
    return omega * max(0.0, 1.0 - math.floor(step / stair_steps) / stairs)


def cde_rewards(correct: torch.Tensor, scores: torch.Tensor, omega_t: float, kappa: float,
                alpha: float) -> torch.Tensor:
    """``r~ = r + omega_t * min(|r| / kappa, alpha * B)`` with ``r = +-1`` and ``B = -s`` (log PPL).

    The cap ``|r| / kappa`` keeps the bonus from outweighing correctness; NaN rewards stay NaN, a
    completion without a score gets no bonus.
    """
    r = 2.0 * correct.float() - 1.0
    bonus = torch.minimum(r.abs() / kappa, alpha * -scores.to(r.device).float())
    return r + omega_t * torch.nan_to_num(bonus, nan=0.0, posinf=0.0, neginf=0.0)


def c2gspg_advantages(rewards: torch.Tensor, scores: torch.Tensor, num_generations: int,
                      eps: float = 1e-6) -> torch.Tensor:
    """``A_i = (R_i - mean R) / (1 - C_i + eps)``, ``C_i = exp(s_i)``: a confident completion's
    advantage is amplified (both signs), so confidently wrong answers are pushed down hardest."""
    centred = rewards.float() - _group_nanmean(rewards.float(), num_generations)
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


def rlcr_rewards(correct: torch.Tensor, confidence: torch.Tensor, format_ok: torch.Tensor,
                 format_weight: float = 0.5, accuracy_weight: float = 0.5, brier_weight: float = 0.5) -> torch.Tensor:
    """RLCR's released reward ``w_f + w_a c + w_b (1 - (c - q)^2)``, all 0 if the format fails.

    Weights ``(0, 1, 1)`` give the paper's ``c - (q - c)^2`` up to a constant. NaN correctness stays NaN.
    """
    c = correct.float()
    ok = format_ok.to(c.device).bool() & torch.isfinite(confidence.to(c.device))
    q = torch.nan_to_num(confidence.to(c.device).float(), nan=0.0)
    reward = format_weight + accuracy_weight * c + brier_weight * (1.0 - (c - q) ** 2)
    return torch.where(ok, reward, torch.where(torch.isnan(c), c, torch.zeros_like(c)))


def dcpo_calibration_rewards(correct: torch.Tensor, confidence: torch.Tensor, num_generations: int,
                             lam: float = 0.5, error: str = "abs") -> torch.Tensor:
    """DCPO's confidence reward ``R_c = -err(conf, R_IG)``, ``R_IG = lam mean_group(R) + (1 - lam) R``.

    ``error="abs"`` is the paper's ``|conf - R_IG|``; ``"sq"`` the released code's squared error. A
    missing confidence is -1, as in the released code (so it is always far from any target).
    """
    if error not in DCPO_ERRORS:
        raise ValueError(f"error={error!r}; expected one of {DCPO_ERRORS}.")
    c = correct.float()
    target = lam * _group_nanmean(c, num_generations) + (1.0 - lam) * c
    conf = torch.nan_to_num(confidence.to(c.device).float(), nan=-1.0)
    gap = conf - target
    return -(gap.abs() if error == "abs" else gap**2)


def dcpo_token_advantages(reasoning: torch.Tensor, confidence: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """``(N, T)``: the confidence advantage on the confidence block's tokens, the reasoning one elsewhere."""
    span = span.to(reasoning.device).bool()
    return torch.where(span, confidence.unsqueeze(1), reasoning.unsqueeze(1)).float()


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


class CoDaPOReplay:
    """CoDaPO's resampling inside TRL's data flow: after a normal generation batch, the next one
    replays its highest-weight questions (``repeat`` fresh groups each) for a second update.

    The dataloader batch that arrives during a replay is deferred, not dropped, so every prompt is
    still trained on (the released code duplicates each batch instead). Replayed copies form
    separate groups of ``num_generations`` (TRL's fixed group size), not one larger group.
    """

    def __init__(self, num_generations: int, percentile: float = 0.75, repeat: int = 4, offset: float = 0.1,
                 correct_threshold: float = 0.5):
        self.num_generations, self.percentile, self.repeat = num_generations, percentile, repeat
        self.offset, self.correct_threshold = offset, correct_threshold
        self.pending: list | None = None
        self.deferred: deque = deque()
        self.replaying = False

    def next_batch(self, incoming: list, process_index: int = 0) -> list:
        """The local generation batch to use now: the planned replay, else the oldest deferred batch."""
        self.replaying = self.pending is not None
        if self.replaying:
            self.deferred.append(incoming)
            size = len(incoming)
            batch, self.pending = self.pending[process_index * size:(process_index + 1) * size], None
            return batch
        if self.deferred:
            self.deferred.append(incoming)
            return self.deferred.popleft()
        return incoming

    def state_dict(self) -> dict:
        """The planned replay and the deferred batches: checkpointed, so resuming replays what it would have."""
        return {"pending": self.pending, "deferred": list(self.deferred), "replaying": self.replaying}

    def load_state_dict(self, state: dict) -> None:
        self.pending, self.deferred, self.replaying = state["pending"], deque(state["deferred"]), state["replaying"]

    def observe(self, rewards: torch.Tensor, scores: torch.Tensor, global_rows: list) -> int:
        """Plan the replay of a normal batch (global rows, contiguous groups); returns the number of
        questions selected (0 after a replay batch, which is never itself replayed)."""
        if self.replaying:
            return 0
        G = self.num_generations
        weights = codapo_weights(_correct(rewards, self.correct_threshold), scores, G, self.offset)
        order = codapo_replay_groups(weights.cpu(), len(global_rows) // G, self.percentile, self.repeat)
        self.pending = [row for g in order for row in global_rows[g * G:(g + 1) * G]] or None
        return len(set(order))


# --------------------------------------------------------------------------------------------
# estimators (global batch in, advantages + metrics out)
# --------------------------------------------------------------------------------------------
@register_estimator("dr_grpo")
def _dr_grpo_estimator(batch: AdvantageInputs):
    """``R - mean(R)``: TRL's advantage with ``scale_rewards="none"``, whatever ``scale_rewards`` says."""
    return grpo_advantages(batch.rewards, batch.num_generations, "none"), {}


@register_estimator("codapo")
def _codapo_estimator(batch: AdvantageInputs):
    """GRPO's advantage times the group's difficulty x confidence weight (the replay is the trainer's)."""
    cfg = batch.config
    correct = _correct(batch.rewards, cfg.correct_threshold)
    weights = codapo_weights(correct, batch.scores, batch.num_generations, cfg.codapo_weight_offset)
    adv = batch.trl_advantages * weights.to(batch.trl_advantages.device).repeat_interleave(batch.num_generations)
    return adv, {"codapo/weight_mean": weights.mean().item()}


@register_estimator("cde")
def _cde_estimator(batch: AdvantageInputs):
    """GRPO on ``+-1`` rewards plus the annealed perplexity bonus."""
    cfg = batch.config
    omega_t = cde_omega(batch.step, cfg.cde_omega, cfg.cde_stair_steps, cfg.cde_stairs)
    shaped = cde_rewards(_correct(batch.rewards, cfg.correct_threshold), batch.scores, omega_t, cfg.cde_kappa,
                         cfg.cde_alpha)
    adv = grpo_advantages(shaped, batch.num_generations, batch.scale_rewards)
    bonus = shaped - (2.0 * _correct(batch.rewards, cfg.correct_threshold) - 1.0)
    return adv, {"cde/omega": omega_t, "cde/bonus_mean": torch.nanmean(bonus).item() if bonus.numel() else 0.0}


@register_estimator("c2gspg")
def _c2gspg_estimator(batch: AdvantageInputs):
    """Confidence-scaled advantage; the loss is :func:`c2gspg_loss` (``sequence_loss`` hook)."""
    return c2gspg_advantages(batch.rewards, batch.scores, batch.num_generations), {}


_c2gspg_estimator.sequence_loss = lambda seq_logp, adv, rewards, cfg: c2gspg_loss(seq_logp, adv, rewards,
                                                                                 cfg.c2gspg_beta)


@register_estimator("simko")
def _simko_estimator(batch: AdvantageInputs):
    """Plain GRPO advantage; SimKO changes the loss's log-probs (``token_logps`` hook)."""
    return batch.trl_advantages, {}


_simko_estimator.token_logps = lambda logits, ids, mask, correct, negative, cfg: simko_token_logps(
    logits, ids, mask, correct, negative, cfg.simko_top_k, cfg.simko_alpha, cfg.simko_entropy_quantile,
    cfg.simko_neg_scale)


def _verbal_metrics(prefix: str, confidence: torch.Tensor, format_ok: torch.Tensor) -> dict[str, float]:
    parsed = torch.isfinite(confidence)
    return {f"{prefix}/format_rate": format_ok.float().mean().item(),
            f"{prefix}/confidence_mean": confidence[parsed].mean().item() if parsed.any() else float("nan")}


@register_estimator("rlcr")
def _rlcr_estimator(batch: AdvantageInputs):
    """GRPO on RLCR's reward, built from correctness (the reward functions) and the stated confidence."""
    cfg = batch.config
    reward = rlcr_rewards(_correct(batch.rewards, cfg.correct_threshold), batch.confidence, batch.format_ok,
                          cfg.rlcr_format_weight, cfg.rlcr_accuracy_weight, cfg.rlcr_brier_weight)
    adv = grpo_advantages(reward, batch.num_generations, batch.scale_rewards)
    return adv, {"rlcr/reward_mean": torch.nanmean(reward).item(), **_verbal_metrics("rlcr", batch.confidence,
                                                                                      batch.format_ok)}


_rlcr_estimator.parse_confidence = parse_rlcr


@register_estimator("dcpo")
def _dcpo_estimator(batch: AdvantageInputs):
    """Reasoning tokens: GRPO advantage of correctness; confidence block: group-normalised ``R_c``."""
    cfg = batch.config
    correct = _correct(batch.rewards, cfg.correct_threshold)
    scale = batch.scale_rewards
    reasoning = grpo_advantages(correct, batch.num_generations, scale)
    r_c = dcpo_calibration_rewards(correct, batch.confidence, batch.num_generations, cfg.dcpo_lambda, cfg.dcpo_error)
    confidence = grpo_advantages(r_c, batch.num_generations, scale)
    adv = dcpo_token_advantages(reasoning, confidence, batch.confidence_mask)
    return adv, {"dcpo/calibration_reward": torch.nanmean(r_c).item(),
                 **_verbal_metrics("dcpo", batch.confidence, batch.format_ok)}


_dcpo_estimator.parse_confidence = parse_dcpo_confidence


# --------------------------------------------------------------------------------------------
# config fields (CAPOConfig inherits them)
# --------------------------------------------------------------------------------------------
def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class BaselineConfig(GRPOConfig):
    """The comparison methods' fields; [`CAPOConfig`] inherits them. Each is read only by its method.

    Defaults marked *ours* were not recoverable from the paper or code.
    """

    codapo_weight_offset: float = field(default=0.1, metadata=_help("CoDaPO: weight = conf * d_w + offset."))
    codapo_replay: bool = field(default=False, metadata=_help(
        "CoDaPO: after each generation, replay the highest-weight questions with fresh rollouts for a second "
        "update (every other generation batch is a replay; deferred batches are used afterwards)."))
    codapo_percentile: float = field(default=0.75, metadata=_help(
        "CoDaPO replay: questions with weight >= this quantile of the batch are replayed."))
    codapo_repeat: int = field(default=4, metadata=_help("CoDaPO replay: groups per replayed question."))
    cde_omega: float = field(default=0.5, metadata=_help("CDE: initial bonus coefficient omega (ours)."))
    cde_kappa: float = field(default=4.0, metadata=_help("CDE: bonus cap |r|/kappa (ours; 4 keeps it < 1/4)."))
    cde_alpha: float = field(default=0.5, metadata=_help("CDE: bonus slope alpha on log PPL (ours)."))
    cde_stair_steps: int = field(default=50, metadata=_help("CDE: optimizer steps per stair of the schedule (ours)."))
    cde_stairs: int = field(default=4, metadata=_help("CDE: stairs until omega reaches 0 (ours)."))
    c2gspg_beta: float = field(default=0.01, metadata=_help("C2GSPG: weight of the calibration (log-loss) term."))
    rlcr_format_weight: float = field(default=0.5, metadata=_help("RLCR: weight of the format reward."))
    rlcr_accuracy_weight: float = field(default=0.5, metadata=_help("RLCR: weight of the accuracy reward."))
    rlcr_brier_weight: float = field(default=0.5, metadata=_help("RLCR: weight of 1 - (correct - q)^2."))
    dcpo_lambda: float = field(default=0.5, metadata=_help(
        "DCPO: R_IG = lambda * group accuracy + (1 - lambda) * own correctness."))
    dcpo_error: str = field(default="abs", metadata={**_help(
        "DCPO: confidence error, 'abs' (paper) or 'sq' (released code)."), "choices": list(DCPO_ERRORS)})
    simko_top_k: int = field(default=3, metadata=_help("SimKO: K top tokens smoothed over."))
    simko_alpha: float = field(default=0.01, metadata=_help("SimKO: smoothing weight alpha."))
    simko_entropy_quantile: float = field(default=0.8, metadata=_help(
        "SimKO: forking tokens have entropy above this per-completion quantile."))
    simko_neg_scale: float = field(default=1.1, metadata=_help(
        "SimKO: advantage factor at forking argmax tokens of negative-advantage completions."))

    def __post_init__(self):
        self._validate_baseline_fields()
        super().__post_init__()

    def _validate_baseline_fields(self) -> None:
        def bad(name, allowed):
            return ValueError(f"CAPOConfig.{name}={getattr(self, name)!r} is invalid; {allowed}.")

        def number(value):
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        for name in ("codapo_weight_offset", "cde_omega", "c2gspg_beta", "rlcr_format_weight", "rlcr_accuracy_weight",
                     "rlcr_brier_weight"):
            if not number(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "it must be a finite number >= 0")
        for name in ("cde_kappa", "cde_alpha", "simko_neg_scale"):
            if not number(getattr(self, name)) or getattr(self, name) <= 0:
                raise bad(name, "it must be a finite number > 0")
        for name in ("codapo_percentile", "dcpo_lambda", "simko_entropy_quantile", "simko_alpha"):
            if not number(getattr(self, name)) or not 0 <= getattr(self, name) <= 1:
                raise bad(name, "it must be in [0, 1]")
        for name in ("codapo_repeat", "cde_stair_steps", "cde_stairs", "simko_top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "it must be an integer >= 1")
        if self.codapo_replay not in (True, False):
            raise bad("codapo_replay", "use true or false")
        if self.dcpo_error not in DCPO_ERRORS:
            raise bad("dcpo_error", f"choose one of {DCPO_ERRORS} ('abs' = paper, 'sq' = released code)")
        method = getattr(self, "advantage_estimator", None)
        if method == "simko" and (self.loss_type not in SIMKO_LOSS_TYPES or self.importance_sampling_level != "token"):
            raise ValueError(
                f"CAPOConfig.advantage_estimator='simko' smooths the token-level PPO ratio: it needs "
                f"importance_sampling_level='token' and a clipped loss_type {SIMKO_LOSS_TYPES}, got "
                f"importance_sampling_level={self.importance_sampling_level!r}, loss_type={self.loss_type!r}.")
        if method == "c2gspg" and self.beta != 0:
            raise ValueError(f"CAPOConfig.beta={self.beta} is ignored by advantage_estimator='c2gspg' (its loss has "
                             "no KL term); set beta=0.")
