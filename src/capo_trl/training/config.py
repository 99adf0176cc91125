"""`CAPOConfig`: GRPOConfig plus the method fields and the noise mask of Calibration-Aware Policy Optimization.

The fields of each built-in method are declared by the method (``methods/<name>.py``, its ``Args``
dataclass) and mixed in here, so a recipe stays one flat mapping; the mask, the reference cache and
the choice of method are the trainer's own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..advantages import MASK_SIDES
from ..methods import BUILTIN, resolve_method
from ..methods.base import check_fields
from .consistency import refuse_contradictions, warn_ineffective
from .skipping import resolve_skipping

THRESHOLD_MODES = ("fixed", "auto")
REF_SCORING = ("auto", "all", "needed")
MASK_NORMALIZERS = ("kept", "unmasked")
# Loss types whose normaliser does not depend on which rows the mask drops (rows, or a constant).
MASK_FREE_NORMALISER = ("grpo", "sapo", "dr_grpo")
# Each built-in method's fields, mixed in (later methods' fields come first in the MRO, so last in --help).
_METHOD_ARGS = tuple(m.Args for m in reversed(BUILTIN) if m.Args is not None)


@dataclass
class CAPOConfig(*_METHOD_ARGS, GRPOConfig):
    r"""Configuration for [`CAPOTrainer`]: every [`trl.GRPOConfig`] field plus the CAPO fields below.

    Migration from TRL is `s/GRPOConfig/CAPOConfig/`. With `advantage_estimator="grpo"` (and the
    default `noise_mask=None`) training is exactly GRPOTrainer's, with calibration metrics logged.

    Parameters:
        advantage_estimator (`str`, defaults to `"capo"`):
            `"capo"`: the pairwise, perplexity-aware advantage. `"grpo"`: TRL's own advantages, untouched.
            The methods CAPO is compared with are the other names of `capo_trl.methods.METHODS` (the
            registry), one module each of `capo_trl.methods`, their fields in docs/baselines.md. A
            method of your own is a `capo_trl.methods.Method` subclass named `"package.module:ClassName"`
            (or registered with `capo_trl.methods.register_method`); see docs/architecture.md.
        tau (`float`, defaults to `0.6`):
            Temperature of the logistic AUC surrogate, in nats of mean token log-prob. The paper uses
            0.6 (1.5B) / 0.5 (7B). It must match the spread of the scores within a group: much larger
            than that spread and CAPO degenerates into a rescaled Dr. GRPO.
        advantage_normalization (`str`, defaults to `"group"`):
            Divide each group's CAPO advantages by the group size (`"group"`), by the number of
            (better, worse) pairs (`"pairs"`), or not at all (`"none"`).
        surrogate (`str`, defaults to `"logistic"`):
            `"logistic"` (CAPO) or `"linear"` (`phi(t) = -t`: reproduces Dr. GRPO's `R - mean(R)`, an ablation).
        noise_mask (`bool` or `None`, defaults to `None`):
            Drop correct completions the reference model finds implausible and wrong ones it finds
            near-certain. `None` means on for `"capo"` and off for `"grpo"` (so `"grpo"` stays a
            drop-in); `True` with `"grpo"` is the paper's "GRPO + mask" ablation.
        ref_high (`float`, defaults to `2.5`):
            A correct completion is kept only if its reference perplexity is <= `ref_high`.
        ref_low (`float`, defaults to `1.05`):
            A wrong completion is kept only if its reference perplexity is >= `ref_low`.
        correct_threshold (`float`, defaults to `0.5`):
            A completion counts as correct (for the mask and the calibration metrics) when its total
            reward is >= this value.
        tau_mode (`str`, defaults to `"absolute"`):
            `"absolute"`: `tau` is in nats (the paper). `"relative"`: the effective temperature is
            `tau` times the pooled within-group standard deviation of the scores over the mixed
            groups of the batch, so one value fits models whose score spreads differ by 10x.
        advantage_scale (`str`, defaults to `"paper"`):
            `"paper"` keeps the `1/tau` factor of the derivative (advantages grow as `tau` shrinks);
            `"bounded"` multiplies by `2 tau` and divides by the reward std TRL's `scale_rewards` uses,
            so each pair weighs `2 sigma(.)` in (0, 2) and, as `tau` grows, the advantage becomes
            exactly GRPOTrainer's (`scale_rewards="group"`) or Dr. GRPO's (`"none"`). `"matched"`
            rescales each group to GRPO's total |advantage|: CAPO then only redistributes GRPO's
            credit towards mis-ranked pairs, at GRPO's step size, whatever `tau`.
        truncated_pairs (`str`, defaults to `"ranked"`):
            How a completion cut at `max_completion_length` (no EOS) enters CAPO's pairs. `"ranked"`: by
            its score, like any other, so a truncated wrong answer far less confident than its group gets
            almost no negative advantage. `"tied"`: each of its pairs weighs as if the two scores were
            equal, so it is credited by its reward alone, as GRPO credits it (the relative `tau`'s spread
            still counts its score). Under `mask_truncated_completions` its advantage leaves the loss, and
            the finished completions of its group carry the opposite.
        score_span (`str`, defaults to `"completion"`):
            Which tokens CAPO's score `s` averages. `"completion"`: every generated token (the paper's).
            `"answer"`: only the final answer's own tokens, where the reward function reads it (its
            `answer_spans`; `math_accuracy_reward` and `MathReward` have one), so a right answer worded off the
            worked template is not taken for an unconfident one. A completion with no answer is credited by its
            reward alone (its pairs count as tied). The mask's reference perplexity and the logged `capo/auroc`
            stay over the whole completion.
        noise_mask_guard (`bool`, defaults to `True`):
            When the mask would drop a whole class (every correct or every wrong completion) of a batch,
            keep that class in this batch, warn once and log `capo/mask_guard_kept`. A whole class
            vanishing means the thresholds do not fit the model (or the rewards are real-valued), not
            label noise; `False` applies the paper's mask literally.
        ref_thresholds (`str`, defaults to `"fixed"`):
            `"fixed"`: use `ref_high` / `ref_low`. `"auto"`: measure them with the paper's quartile rule
            (upper quartile of the reference PPL on correct answers, lower quartile on wrong ones) on
            the first `ref_calibration_steps` generation batches, which the initial policy (= the
            reference) sampled; the mask is off while measuring.
        noise_mask_side (`str`, defaults to `"both"`):
            Which answers the mask may drop: `"both"` (the paper), `"correct"` (only the `ref_high` test on
            correct answers, the suspected lucky guesses) or `"wrong"` (only the `ref_low` test on wrong
            answers, the suspected grader misses).
        noise_mask_normalizer (`str`, defaults to `"kept"`):
            `"kept"`: a dropped completion leaves the loss and its normaliser, so with ~30% dropped each kept
            token of a token-normalised loss (`dapo`, `bnpo`, `cispo`) weighs ~1.4x more. `"unmasked"`: a
            dropped completion's advantage is zero, so it contributes nothing, but its tokens still count in
            the normaliser: every kept row weighs what it would without the mask (a mask, not a larger
            step). Needs `beta=0`, no entropy bonus and `top_entropy_quantile=1` (else a dropped row would
            still contribute a KL or entropy term).
        ref_calibration_steps (`int`, defaults to `1`):
            Generation batches used by `ref_thresholds="auto"`.
        ref_cache_size (`int`, defaults to `65536`):
            Number of reference scores kept in an LRU cache keyed on prompt+completion token ids, so a
            completion seen again costs no reference forward. `0` disables the cache.
        ref_scoring (`str`, defaults to `"auto"`):
            Which completions the mask's own reference forward scores at `beta=0`. `"all"`: every one.
            `"needed"`: only those whose mask verdict can change the loss: completions with a non-zero
            advantage (a group whose rewards all tie has none under CAPO and GRPO), plus any the
            guard's decision depends on; the others count as kept. The loss is then identical to
            `"all"` when the loss type's normaliser ignores dropped rows (`grpo`, `sapo`, `dr_grpo`);
            with `dapo`/`bnpo`/`cispo` the kept tied rows enlarge the token count that divides the loss
            (docs/config.md gives the measured effect). `"auto"`: `"needed"` exactly where it changes
            nothing (those loss types, `beta=0`, `top_entropy_quantile=1`, no entropy bonus, thresholds
            not being measured), else `"all"`. Multimodal batches always score every row; under ZeRO-3
            and FSDP each process runs as many reference forwards as the one with the most rows.
        skip_zero_advantage_rows (`bool` or `None`, defaults to `None`):
            Leave rows whose advantage is exactly zero (tied groups, rows the mask dropped) out of the
            policy's forward and backward in the loss. The update is unchanged up to float rounding:
            every normaliser is kept, and the skipped rows add exactly zero to the loss and gradient.
            `None`: on wherever that is exact (`beta=0`, no entropy bonus, `top_entropy_quantile=1`, no
            router aux loss, a method whose loss reads only the advantage of such rows), except under
            `"grpo"`, whose promise is bit-for-bit GRPOTrainer; `True` turns it on (an error where it is
            not exact); `False` off. Logged as `capo/skipped_frac`.
        share_prompt_prefill (`bool`, defaults to `False`):
            With transformers generation, prefill each prompt once and share its cache with the
            `num_generations` samples drawn from it (`capo_trl.evaluation.prefill`), instead of one
            prompt forward per sample. Same sampling distribution; numbers differ by float rounding from
            unshared generation, so it is off by default (GRPOTrainer's own behaviour). Worth it when
            prompts are long next to completions (few-shot prompts on a CPU).
        share_prompt_in_loss (`bool`, defaults to `False`):
            In the loss, forward each distinct prompt of a micro-batch once, its cache shared by its rows
            (`capo_trl.training.prompt_sharing`), instead of once per row; the noise mask's reference forward
            shares them too. The log-probs and gradient equal
            TRL's up to float rounding (hence off by default). Worth it when prompts are long next to
            completions. Needs `activation_checkpointing=False` (checkpointing turns the cache off) and
            one process; not with a method that reads the full logits or its own sequence loss.
        sampler (`str`, defaults to `"multinomial"`):
            How transformers generation draws each token: `"multinomial"` (torch's `multinomial`, GRPOTrainer's own
            draws) or `"inverse_cdf"` (`capo_trl.evaluation.sampler`: the same distribution from other random
            numbers, a cumulative sum and a binary search per row; on a CPU a 32-row draw over a 49k vocabulary
            took 3 ms against 43 ms). Not with vLLM, which samples by itself.
        share_lower_layers (`bool` or `None`, defaults to `None`):
            With a PEFT adapter on a model's top layers, the noise mask's reference forward records the hidden
            states entering the lowest adapted layer, and the loss forward of the same rows starts from them
            (`capo_trl.training.lower_layers`): the layers below the adapter, which compute the same thing for
            the policy and the reference, run once per row instead of twice. The same log-probs and gradient up
            to float rounding. It holds one hidden state per token of a generation batch's scored rows until
            the next batch. `None`: on wherever it applies (the mask's own reference forward at `beta=0` through
            a PEFT adapter, `share_prompt_in_loss`, an adapter above layer 0 with nothing trainable below);
            `True`: on (an error where it does not apply); `False`: off. Logged as `capo/lower_layers_shared`.
        method_kwargs (`dict` or `None`, defaults to `None`):
            Settings of a method defined outside capo-trl, checked against its `Args` dataclass.
    """

    advantage_estimator: str = field(
        default="capo",
        metadata={"help": "The method: 'capo' (pairwise perplexity-aware), 'grpo' (TRL's advantages, untouched), a "
                  f"baseline ({', '.join(m.name for m in BUILTIN if m.name not in ('capo', 'grpo'))}), or your own "
                  "Method subclass as 'package.module:ClassName'."},
    )
    noise_mask: bool | None = field(
        default=None,
        metadata={"help": "Reference-perplexity noise mask. Default (None): on for 'capo', off for 'grpo'."},
    )
    ref_high: float = field(
        default=2.5,
        metadata={"help": "Keep a correct completion only if its reference perplexity is <= ref_high."},
    )
    ref_low: float = field(
        default=1.05,
        metadata={"help": "Keep a wrong completion only if its reference perplexity is >= ref_low."},
    )
    correct_threshold: float = field(
        default=0.5,
        metadata={"help": "A completion is correct when its total reward is >= this value."},
    )
    noise_mask_guard: bool = field(
        default=True,
        metadata={"help": "When the mask would drop every correct (or every wrong) completion of a batch, keep "
                  "that class in this batch (logged as capo/mask_guard_kept) instead of silently training "
                  "without it. false: the paper's mask, applied as is."},
    )
    ref_thresholds: str = field(
        default="fixed",
        metadata={"help": "'fixed' (ref_high/ref_low as given) or 'auto' (quartile rule measured on the first "
                  "ref_calibration_steps generation batches).", "choices": list(THRESHOLD_MODES)},
    )
    noise_mask_side: str = field(
        default="both",
        metadata={"help": "Which answers the noise mask may drop: 'both' (the paper), 'correct' (ref_high on correct "
                  "answers only) or 'wrong' (ref_low on wrong answers only).", "choices": list(MASK_SIDES)},
    )
    noise_mask_normalizer: str = field(
        default="kept",
        metadata={"help": "'kept': a dropped completion leaves the loss and its token count; 'unmasked': its "
                  "advantage is zero but its tokens still count in the loss normaliser, so kept rows weigh what "
                  "they would without the mask (needs beta=0, no entropy bonus).", "choices": list(MASK_NORMALIZERS)},
    )
    ref_calibration_steps: int = field(
        default=1,
        metadata={"help": "Generation batches used to measure the mask thresholds when ref_thresholds='auto'."},
    )
    ref_cache_size: int = field(
        default=65536,
        metadata={"help": "Entries of the LRU cache of reference scores (0 disables it)."},
    )
    ref_scoring: str = field(
        default="auto",
        metadata={"help": "Reference forward of the mask at beta=0: 'all' completions, or only those whose verdict "
                  "can change the loss ('needed': non-zero advantage, or the guard depends on it); 'auto': "
                  "'needed' where the loss is then identical (loss_type grpo/sapo/dr_grpo), else 'all'.",
                  "choices": list(REF_SCORING)},
    )
    skip_zero_advantage_rows: bool | None = field(
        default=None,
        metadata={"help": "Leave rows whose advantage is exactly zero out of the loss forward and backward (the "
                  "update is unchanged). Default (None): on wherever exact, except for 'grpo' (bit-for-bit "
                  "GRPOTrainer); true: on (an error where not exact); false: off."},
    )
    share_prompt_prefill: bool = field(
        default=False,
        metadata={"help": "Prefill each prompt once per generation batch and share its cache with its "
                  "num_generations samples (transformers generation only; numbers differ from unshared "
                  "generation by float rounding). Default false: GRPOTrainer's own generation."},
    )
    share_prompt_in_loss: bool = field(
        default=False,
        metadata={"help": "In the loss forward, run each distinct prompt of a micro-batch once and share its cache "
                  "with its rows (the same log-probs and gradient up to float rounding). Needs "
                  "activation_checkpointing=false and one process. Default false: GRPOTrainer's own loss forward."},
    )
    sampler: str = field(
        default="multinomial",
        metadata={"help": "How transformers generation draws each token: 'multinomial' (torch's, GRPOTrainer's draws) "
                  "or 'inverse_cdf' (the same distribution from other random numbers, far cheaper on a CPU).",
                  "choices": ["multinomial", "inverse_cdf"]},
    )
    share_lower_layers: bool | None = field(
        default=None,
        metadata={"help": "With a PEFT adapter on the top layers, run the layers below it once for the mask's "
                  "reference and the loss forward (the same log-probs up to float rounding). Default (None): on "
                  "wherever it applies; true: on (an error where it does not); false: off."},
    )
    method_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Settings of a method defined outside capo-trl (its Args dataclass), as a mapping (or a "
                  "JSON string on the command line). Built-in methods take their settings as CAPOConfig fields."},
    )

    def __post_init__(self):
        if isinstance(self.method_kwargs, str):  # from the command line
            try:
                self.method_kwargs = json.loads(self.method_kwargs)
            except json.JSONDecodeError as err:
                raise ValueError(f"CAPOConfig.method_kwargs={self.method_kwargs!r} is not a JSON mapping: {err}.") from err
        if self.method_kwargs is not None and not isinstance(self.method_kwargs, dict):
            raise ValueError(f"CAPOConfig.method_kwargs={self.method_kwargs!r} must be a mapping of setting: value.")
        method = resolve_method(self.advantage_estimator)
        for builtin in BUILTIN:  # their fields exist on every config: a bad value is an error whichever runs
            builtin.bind_args(self)
        self._validate_capo_fields(method)
        if self.noise_mask is None:
            self.noise_mask = method.default_noise_mask
        super().__post_init__()  # reconciles activation_checkpointing with its deprecated alias
        self._check_prompt_sharing(method)
        self._check_lower_layers()
        refuse_contradictions(self, self.noise_mask)
        resolve_skipping(self, method(self))  # the method's own constraints (loss_type, beta, ...), then ours
        warn_ineffective(self, method, self.noise_mask)  # last: a refused configuration warns of nothing

    def _check_prompt_sharing(self, method) -> None:
        """``share_prompt_in_loss`` needs the model's cache in the loss forward, and TRL's fused log-probs."""
        if not self.share_prompt_in_loss:
            return
        blockers = [why for on, why in (
            (self.activation_checkpointing,
             "activation_checkpointing=True (it turns the cache off); set activation_checkpointing=False"),
            (method.token_logps is not None or method.sequence_loss is not None,
             f"advantage_estimator={self.advantage_estimator!r} (its loss reads the full logits or its own "
             "sequence loss)")) if on]
        if blockers:
            raise ValueError(f"CAPOConfig.share_prompt_in_loss=True does not work with {blockers[0]}; or set "
                             "share_prompt_in_loss=False.")

    def _check_lower_layers(self) -> None:
        """``share_lower_layers=True`` needs the mask's own reference forward, through the shared loss forward."""
        if self.share_lower_layers is not True:
            return
        blockers = [why for on, why in (
            (not self.noise_mask, "noise_mask off (no reference forward to share with); turn the mask on"),
            (self.beta != 0.0, f"beta={self.beta} (TRL's reference forward, not the mask's); set beta=0"),
            (not self.share_prompt_in_loss, "share_prompt_in_loss=False (both forwards must be the shared one); "
             "set share_prompt_in_loss=True")) if on]
        if blockers:
            raise ValueError(f"CAPOConfig.share_lower_layers=True does not apply with {blockers[0]}; or leave "
                             "share_lower_layers unset.")

    def _validate_capo_fields(self, method) -> None:
        def bad(name, allowed):
            return ValueError(f"CAPOConfig.{name}={getattr(self, name)!r} is invalid; {allowed}.")

        check_fields(self, "CAPOConfig.", positive=("ref_high", "ref_low"), count=("ref_calibration_steps",),
                     flags=("noise_mask_guard",), choices={"ref_thresholds": THRESHOLD_MODES, "ref_scoring": REF_SCORING,
                                                   "noise_mask_side": MASK_SIDES,
                                                   "noise_mask_normalizer": MASK_NORMALIZERS})
        if self.ref_low < 1.0 or self.ref_high < 1.0:
            raise ValueError(
                f"CAPOConfig.ref_high={self.ref_high} / ref_low={self.ref_low} are perplexities, which are >= 1; "
                "values below 1 would drop every wrong completion or keep no correct one."
            )
        if not isinstance(self.correct_threshold, (int, float)) or not math.isfinite(self.correct_threshold):
            raise bad("correct_threshold", "it must be a finite number")
        if self.noise_mask not in (None, True, False):
            raise bad("noise_mask", "use true, false, or leave it unset")
        if self.share_lower_layers not in (None, True, False):
            raise bad("share_lower_layers", "use true, false, or leave it unset")
        if self.sampler not in ("multinomial", "inverse_cdf"):
            raise bad("sampler", "use 'multinomial' or 'inverse_cdf'")
        if self.sampler != "multinomial" and self.use_vllm:
            raise bad("sampler", "it draws transformers' tokens, and vLLM samples by itself; leave it at "
                      "'multinomial' with use_vllm")
        mask_on = self.noise_mask if self.noise_mask is not None else method.default_noise_mask
        if mask_on and getattr(self, "sync_ref_model", False):
            raise ValueError(
                "CAPOConfig.sync_ref_model=True moves the reference model during training, but the noise mask "
                "judges completions against the *initial* policy. Set sync_ref_model=False, or noise_mask=False."
            )
        if mask_on and self.noise_mask_normalizer == "unmasked":
            side_terms = {"beta": self.beta != 0.0, "entropy_coef": getattr(self, "entropy_coef", 0.0) != 0.0,
                          "use_adaptive_entropy": bool(getattr(self, "use_adaptive_entropy", False)),
                          "top_entropy_quantile": getattr(self, "top_entropy_quantile", 1.0) != 1.0}
            offending = [name for name, on in side_terms.items() if on]
            if offending or method.sequence_loss is not None:
                what = ", ".join(f"{n}={getattr(self, n)!r}" for n in offending) or \
                    f"advantage_estimator={self.advantage_estimator!r} (its own sequence loss)"
                raise ValueError(
                    f"CAPOConfig.noise_mask_normalizer='unmasked' keeps dropped completions in the loss with a zero "
                    f"advantage, but {what} would still make them contribute; use noise_mask_normalizer='kept', or "
                    "beta=0, entropy_coef=0, use_adaptive_entropy=False and top_entropy_quantile=1."
                )
        if self.max_steps == 0 or (self.max_steps < 0 and self.num_train_epochs <= 0):
            raise ValueError(
                f"CAPOConfig.max_steps={self.max_steps} with num_train_epochs={self.num_train_epochs} trains nothing; "
                "give max_steps > 0, or max_steps=-1 with num_train_epochs > 0."
            )
        if not isinstance(self.ref_cache_size, int) or isinstance(self.ref_cache_size, bool) or self.ref_cache_size < 0:
            raise bad("ref_cache_size", "it must be an integer >= 0 (0 disables the cache)")
