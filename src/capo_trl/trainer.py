"""`CAPOTrainer`: GRPOTrainer with CAPO's advantage and noise mask. Thin glue around ``advantages.py``.

It wraps (never copies) three GRPOTrainer methods:

* ``_calculate_rewards``: keeps the gathered ``(N_global, n_funcs)`` reward tensor;
* ``_generate_single_turn``: records the rollout's token log-probs while transformers samples
  (so CAPO needs no second policy forward);
* ``_generate_and_score_completions``: scores every completion, computes advantages and the mask
  on the global batch, writes this process's slice back, and logs calibration metrics.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import trl
from accelerate.utils import gather_object, is_peft_model
from packaging.version import Version
from trl import GRPOTrainer
from trl.models import prepare_deepspeed, prepare_fsdp
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import (
    add_fused_lm_head,
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    use_adapter,
)

from .advantages import mean_token_logprob, mixed_groups, noise_mask, quartile_thresholds, within_group_std
from .calibration import auroc_per_question
from .config import CAPOConfig
from .errors import UsageError
from .methods import AdvantageInputs, resolve_method
from .methods.base import verbalized_inputs
from .reference import ReferenceScoreCache, RolloutLogprobRecorder, sequence_keys

TESTED_TRL = "1.16"
if ".".join(Version(trl.__version__).base_version.split(".")[:2]) != TESTED_TRL:
    raise ImportError(
        f"capo-trl wraps private GRPOTrainer methods and was tested with trl {TESTED_TRL}.x, but trl "
        f"{trl.__version__} is installed. Install a matching version: pip install 'trl=={TESTED_TRL}.*'."
    )

# Extra model inputs TRL's forward accepts (multimodal); passed through unchanged when present.
# What CAPO keeps across steps, one file per process in each checkpoint (like transformers' rng_state_N.pth).
CAPO_STATE = "capo_state_{}.pt"

_FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


@dataclass
class StepRecord:
    """One generation batch as it moves through TRL's hooks: filled in order, then passed explicitly.

    TRL calls ``_generate_single_turn`` and ``_calculate_rewards`` from inside
    ``_generate_and_score_completions``, so what they produce must wait here until that returns.
    """

    rollout_logps: list[list[float]] | None = None  # recorded while transformers sampled
    rewards_per_func: torch.Tensor | None = None  # (N_global, n_funcs), NaN = None
    ref_cache_start: tuple[int, int] | None = None  # (hits, lookups) before this batch
    rewards: torch.Tensor | None = None  # (N_global,) weighted total
    scores: torch.Tensor | None = None  # (N_global,) mean token log-prob under the rollout policy
    ref_ppl: torch.Tensor | None = None  # (N_global,) reference perplexity, when the mask is on
    keep: torch.Tensor | None = None  # (N_global,) the mask's verdict, None when it is off


class CAPOTrainer(GRPOTrainer):
    """Calibration-Aware Policy Optimization (Wang et al., ACL 2026) as a drop-in `GRPOTrainer`.

    Same constructor as [`trl.GRPOTrainer`]; pass a [`CAPOConfig`]. With the default
    `advantage_estimator="capo"` the reward-only advantage is replaced by the pairwise logistic
    AUC-surrogate advantage of :func:`capo_trl.advantages.capo_advantages`, and completions flagged
    by the reference-perplexity noise mask leave the loss. Every estimator, `"grpo"` included,
    logs `capo/*` calibration metrics of the rollout (AUROC of mean token log-prob vs correctness).
    """

    _tag_names = ["trl", "grpo", "capo"]
    _name = "CAPO"

    def __init__(self, model, reward_funcs=None, args: CAPOConfig | None = None, *pargs, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else get_config_model_id(model.config) or "model"
            args = CAPOConfig(output_dir=f"{name.split('/')[-1]}-CAPO")
        elif not isinstance(args, CAPOConfig):
            raise TypeError(
                f"CAPOTrainer needs a CAPOConfig, got {type(args).__name__}. Replace GRPOConfig(...) with "
                "CAPOConfig(...): it accepts every GRPOConfig field."
            )
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, model, reward_funcs, args, *pargs, **kwargs)
        _check_dataset_size(bound.arguments.get("train_dataset"), args)  # before any model is loaded
        peft_config = bound.arguments.get("peft_config")
        self._quantization_config = bound.arguments.get("quantization_config")
        needs_own_ref = bool(args.noise_mask) and args.beta == 0.0 and peft_config is None and (
            isinstance(model, str) or not is_peft_model(model)
        )
        # The reference is the *initial* policy: copy an in-memory model before TRL patches or trains it.
        ref_source = copy.deepcopy(model) if needs_own_ref and not isinstance(model, str) else model
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        self._capo_ref_model = self._build_reference(ref_source) if needs_own_ref else None
        self._ref_cache = ReferenceScoreCache(args.ref_cache_size)
        self._ref_cache_usable = args.ref_cache_size > 0 and not (self._dist.is_zero3 or self.is_fsdp_enabled)
        self._record = StepRecord()
        self._warned: set[str] = set()
        self._threshold_samples: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._measured_thresholds: tuple[float, float] | None = None
        self._loss_inputs = None  # the micro-batch whose loss is being computed, for the token_logps hook
        self.method = resolve_method(args.advantage_estimator)(args)
        self._method_state = self.method.make_state(self.num_generations)
        self._check_prompt_lengths(self.train_dataset, "train_dataset")

    # ----------------------------------------------------------------------------------- setup
    def _build_reference(self, source) -> torch.nn.Module:
        """A frozen copy of the initial policy, prepared the way TRL prepares its own reference."""
        if isinstance(source, str):
            init_kwargs = dict(self.args.model_init_kwargs or {})
            if self.args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
                init_kwargs["device_map"] = None
            if self._quantization_config is not None:
                init_kwargs["quantization_config"] = self._quantization_config
            init_kwargs.setdefault("trust_remote_code", self.args.trust_remote_code)
            init_kwargs.setdefault("dtype", self.model.dtype)
            init_kwargs.setdefault("attn_implementation", self.model.config._attn_implementation)
            ref = create_model_from_path(source, **init_kwargs)
        else:
            ref = source
        ref.requires_grad_(False)
        ref.eval()
        disable_dropout_in_model(ref)
        add_fused_lm_head(ref, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _check_prompt_lengths(self, dataset, name: str, limit: int = 10_000) -> None:
        """A prompt longer than the model's context cannot be trained on (TRL 1.16 does not truncate)."""
        context = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        if not isinstance(context, int) or dataset is None or not hasattr(dataset, "__len__") or len(dataset) == 0:
            return
        columns = getattr(dataset, "column_names", None) or []
        if "prompt" not in columns or {"image", "images"} & set(columns):  # multimodal: the processor counts
            return
        rows = dataset.select(range(min(limit, len(dataset)))) if len(dataset) > limit else dataset
        lengths = prompt_lengths(rows["prompt"], getattr(self.processing_class, "tokenizer", self.processing_class))
        checked = f"{len(rows)} of {len(dataset)}" if len(rows) < len(dataset) else f"all {len(rows)}"
        too_long = [n for n in lengths if n >= context]
        if too_long:
            raise UsageError(
                f"{name}: {len(too_long)} prompt(s) ({checked} checked) are {max(too_long)} tokens or longer, but the "
                f"model's context (max_position_embeddings) is {context} tokens: no completion token fits. Drop them "
                "(capo-trl train: max_prompt_length; Python: dataset.filter) or use a longer-context model."
            )
        overflow = [n for n in lengths if n + self.max_completion_length > context]
        if overflow:
            warnings.warn(
                f"{name}: {len(overflow)} prompt(s) ({checked} checked, longest {max(overflow)} tokens) plus "
                f"max_completion_length={self.max_completion_length} exceed the model's context of {context} tokens; "
                "their completions run past the positions the model was trained on. Drop long prompts "
                "(capo-trl train: max_prompt_length) or lower max_completion_length.",
                stacklevel=3,
            )

    # ----------------------------------------------------------------------------------- checkpoints
    def _capo_state(self) -> dict:
        """Everything CAPO carries from step to step, so that resuming a run equals not stopping it."""
        state = {
            "measured_thresholds": self._measured_thresholds,
            "threshold_samples": [(r, p) for r, p in self._threshold_samples],
            "warned": sorted(self._warned),
        }
        if self._method_state is not None:
            state["method_state"] = self._method_state.state_dict()
        if self._ref_cache_usable:
            state["ref_cache"] = self._ref_cache.state_dict()
        return state

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(self._capo_state(), os.path.join(folder, CAPO_STATE.format(self.accelerator.process_index)))

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Resume hook (TRL restores its own controller state here too): reload :meth:`_capo_state`."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, CAPO_STATE.format(self.accelerator.process_index))
        if not os.path.isfile(path):
            stateful = self.args.noise_mask and self.args.ref_thresholds == "auto" or self._method_state is not None
            if stateful:
                warnings.warn(
                    f"{checkpoint} has no {os.path.basename(path)} (written by an older capo-trl, or by a run on "
                    "another number of processes): measured mask thresholds, the method's state (e.g. CoDaPO's "
                    "replay buffer) and the reference cache start afresh, so this resumed run differs from an uninterrupted one.",
                    stacklevel=2,
                )
            return
        state = torch.load(path, weights_only=True)
        measured = state["measured_thresholds"]
        self._measured_thresholds = tuple(measured) if measured is not None else None
        self._threshold_samples = [tuple(pair) for pair in state["threshold_samples"]]
        self._warned = set(state["warned"])
        if self._method_state is not None and "method_state" in state:
            self._method_state.load_state_dict(state["method_state"])
        if self._ref_cache_usable and "ref_cache" in state:
            self._ref_cache.load_state_dict(state["ref_cache"])

    # ----------------------------------------------------------------------------------- hooks
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        infinite = torch.isinf(rewards)
        if infinite.any():  # NaN is TRL's "None: cannot grade"; an infinity is a bug in the reward function
            column = int(infinite.any(dim=0).nonzero()[0])
            raise UsageError(
                f"reward function {self.reward_func_names[column]!r} returned "
                f"{rewards[:, column][infinite[:, column]][0].item()} for {int(infinite[:, column].sum())} of "
                f"{rewards.size(0)} completions. Rewards must be finite numbers; return None for a completion "
                "that cannot be graded."
            )
        self._record.rewards_per_func = rewards
        return rewards

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._records_rollout_logps():
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        recorder = RolloutLogprobRecorder(self.temperature)
        with recorder.attached(self.accelerator.unwrap_model(self.model_wrapped)):
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        self._record.rollout_logps = recorder.per_sequence(completion_ids)
        return completion_ids, logprobs

    def _records_rollout_logps(self) -> bool:
        """Record during plain transformers sampling, unless TRL computes the old log-probs anyway."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        trl_scores_rollout = self.args.gradient_accumulation_steps % generate_every != 0
        penalty = getattr(self.generation_config, "repetition_penalty", None)
        return not (
            self.use_vllm or self.use_transformers_continuous_batching or self.tools or self.rollout_func
            or trl_scores_rollout or penalty not in (None, 1.0)
        )

    def _generate_and_score_completions(self, inputs):
        self._record = record = StepRecord()
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        args = self.args
        loss_mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        record.rewards = rewards = self._total_rewards(record)
        record.scores = scores = self.accelerator.gather(self._rollout_scores(out, loss_mask, record))
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))

        if args.noise_mask:
            record.ref_ppl = self.accelerator.gather(torch.exp(-self._reference_scores(out, loss_mask, record)))
            thresholds = self._mask_thresholds(rewards, record.ref_ppl, mode)
            if thresholds is not None:
                record.keep = noise_mask(rewards, record.ref_ppl, *thresholds, args.correct_threshold)
                self._warn_if_mask_empties_a_class(rewards, record.ref_ppl, record.keep, thresholds)
        keep = record.keep

        self._metrics[mode]["capo/score_spread"].append(within_group_std(rewards, scores, num_generations).item())
        trl_advantages = out["advantages"]
        batch = AdvantageInputs(
            rewards=rewards, scores=scores, num_generations=num_generations,
            trl_advantages=self.accelerator.gather(trl_advantages), step=self.state.global_step,
            scale_rewards=self.scale_rewards, **self._verbalized_inputs(out, loss_mask),
        )
        advantages, extra = self.method.advantages(batch)
        for name, value in extra.items():
            self._metrics[mode][name].append(value)
        per_sample = advantages if advantages.dim() == 1 else advantages[:, 0]  # (N, T): table shows token 0
        if keep is not None:
            advantages = advantages * (keep if advantages.dim() == 1 else keep.unsqueeze(1))
            per_sample = per_sample * keep
            keep_local = keep[local].to(out["completion_mask"].dtype).unsqueeze(1)
            out["completion_mask"] = out["completion_mask"] * keep_local
            loss_mask = loss_mask * keep_local
            out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        mine = advantages[local] if advantages.dim() == 1 else advantages[local, : out["completion_ids"].size(1)]
        out["advantages"] = mine.to(trl_advantages.dtype)
        self._replace_logged_advantages(per_sample)
        if self.method.sequence_loss is not None or self.method.token_logps is not None:
            out["capo_rewards"] = rewards[local]  # travels with the batch through TRL's shuffle and split
        if self._method_state is not None and mode == "train":
            for name, value in self._method_state.observe(batch, gather_object(list(inputs))).items():
                self._metrics[mode][name].append(value)

        self._log_calibration(mode, record, per_sample, num_generations)
        return out

    def _verbalized_inputs(self, out, loss_mask) -> dict:
        """Stated confidence, format flag and confidence-block token mask, gathered (``parse_confidence`` hook)."""
        parse = self.method.parse_confidence
        if parse is None:
            return {}
        def decode(ids):  # as TRL decodes the completions the reward functions see
            return self._tokenizer.decode(ids, skip_special_tokens=True)

        confidence, format_ok, span = verbalized_inputs(parse, out["completion_ids"], loss_mask, decode)
        span = self.accelerator.pad_across_processes(span.float(), dim=1)  # widths differ across processes
        gather = self.accelerator.gather
        return {"confidence": gather(confidence), "format_ok": gather(format_ok.float()) > 0.5,
                "confidence_mask": gather(span) > 0.5}

    def _mask_thresholds(self, rewards, ref_ppl, mode) -> tuple[float, float] | None:
        """(ref_high, ref_low): as configured, or measured by the quartile rule on the first batches."""
        if self.args.ref_thresholds == "fixed":
            return self.args.ref_high, self.args.ref_low
        if self._measured_thresholds is None and mode == "train":
            self._threshold_samples.append((rewards.cpu(), ref_ppl.cpu()))
            if len(self._threshold_samples) >= self.args.ref_calibration_steps:
                r, p = (torch.cat(t) for t in zip(*self._threshold_samples))
                high, low = quartile_thresholds(r, p, self.args.correct_threshold)
                if math.isfinite(high) and math.isfinite(low):
                    self._measured_thresholds = (high, low)
                    self._threshold_samples.clear()
        if self._measured_thresholds is None:
            if len(self._threshold_samples) >= self.args.ref_calibration_steps and "unmeasured" not in self._warned:
                self._warned.add("unmeasured")
                warnings.warn(
                    f"ref_thresholds='auto' measured no mask thresholds after {len(self._threshold_samples)} "
                    "generation batch(es): the rollouts so far lack correct or wrong completions (their rewards "
                    f"never crossed correct_threshold={self.args.correct_threshold}). The noise mask stays off "
                    "until both appear; set ref_high/ref_low with ref_thresholds='fixed' to mask from the start.",
                    stacklevel=2,
                )
            return None  # still measuring (or a class never appeared yet): no mask
        high, low = self._measured_thresholds
        self._metrics[mode]["capo/ref_high"].append(high)
        self._metrics[mode]["capo/ref_low"].append(low)
        return self._measured_thresholds

    # ----------------------------------------------------------------------------------- method hooks
    def _prepare_inputs(self, generation_batch):
        """A method's state (CoDaPO's replay) may swap the batch when TRL is about to generate."""
        state = self._method_state
        if state is not None and self.model.training:
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 or self._buffered_inputs is None:  # TRL's own rule
                generation_batch = state.next_batch(generation_batch, self.accelerator.process_index)
        return super()._prepare_inputs(generation_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Loss-changing methods hook in here; every other method runs TRL's loss untouched."""
        if self.method.sequence_loss is not None and not return_outputs:
            return self._sequence_loss(model, inputs, self.method.sequence_loss)
        if self.method.token_logps is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._loss_inputs = inputs  # read by _get_per_token_logps_and_entropies inside TRL's loss
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._loss_inputs = None

    def _sequence_loss(self, model, inputs, loss_fn) -> torch.Tensor:
        """A sequence-level loss (C2GSPG) of the current mean token log-probs, through TRL's forward."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        extra = {k: inputs[k] for k in _FORWARD_KEYS if k in inputs}
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                              inputs["completion_ids"].size(1), **extra)
        loss, metrics = loss_fn(mean_token_logprob(logps, mask), inputs["advantages"], inputs["capo_rewards"])
        mode = "train" if self.model.training else "eval"
        self._log_local(mode, metrics, loss.device)
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's fused log-probs, except inside a ``token_logps`` method's loss (SimKO): there, one plain
        forward gives the full logits and the method's hook returns log-probs with its own gradient."""
        inputs = self._loss_inputs
        if inputs is None:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, compute_aux_loss,
                                                              **multimodal)
        if compute_aux_loss or any(v is not None for v in multimodal.values()):
            raise NotImplementedError(f"advantage_estimator={self.args.advantage_estimator!r} needs full logits and "
                                      "supports text-only models without a router aux loss.")
        with self.accelerator.autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                           logits_to_keep=logits_to_keep + 1).logits
        advantages = inputs["advantages"]
        negative = (advantages if advantages.dim() == 1 else advantages.sum(1)) < 0
        correct = inputs["capo_rewards"] >= self.args.correct_threshold
        logps, entropy, stats = self.method.token_logps(
            logits[:, :-1] / self.temperature, input_ids[:, -logits_to_keep:],
            inputs["completion_mask"] * inputs.get("tool_mask", 1), correct, negative)
        self._log_local("train" if self.model.training else "eval", stats, logps.device)
        return logps, entropy if compute_entropy else None, None

    def _log_local(self, mode, metrics: dict[str, float], device) -> None:
        """Average per-process metrics over processes, then log them."""
        for name, value in metrics.items():
            value = self.accelerator.gather(torch.tensor([value], device=device)).mean().item()
            self._metrics[mode][name].append(value)

    # ----------------------------------------------------------------------------------- inputs
    def _total_rewards(self, record: StepRecord) -> torch.Tensor:
        """Weighted sum of the reward functions, NaN where every function returned None (TRL's rule)."""
        per_func = record.rewards_per_func
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        total = (per_func * weights).nansum(dim=1)
        return total.masked_fill(torch.isnan(per_func).all(dim=1), float("nan"))

    def _forward_logps(self, model, out, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One no-grad forward through TRL's own log-prob routine (same temperature and masking as the loss)."""
        take = (lambda t: t) if rows is None else (lambda t: t[rows])
        input_ids = torch.cat([take(out["prompt_ids"]), take(out["completion_ids"])], dim=1)
        attention_mask = torch.cat([take(out["prompt_mask"]), take(out["completion_mask"])], dim=1)
        extra = {k: out[k] for k in _FORWARD_KEYS if k in out}
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, out["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size, **extra,
            )
        return logps

    def _rollout_scores(self, out, loss_mask, record: StepRecord) -> torch.Tensor:
        """s_i under the policy that sampled: TRL's old log-probs, else the recorded ones, else a forward."""
        if "old_per_token_logps" in out:
            per_token = out["old_per_token_logps"]
        elif record.rollout_logps is not None:
            width = out["completion_ids"].size(1)
            per_token = torch.zeros(len(record.rollout_logps), width, device=loss_mask.device)
            for i, row in enumerate(record.rollout_logps):
                per_token[i, : len(row)] = torch.tensor(row[:width])
        else:
            per_token = self._forward_logps(self.model, out)
        return mean_token_logprob(per_token, loss_mask)

    def _reference_scores(self, out, loss_mask, record: StepRecord) -> torch.Tensor:
        """Mean token log-prob under the reference: TRL's when beta > 0, else cached or one forward."""
        if "ref_per_token_logps" in out:
            return mean_token_logprob(out["ref_per_token_logps"], loss_mask)
        n = loss_mask.size(0)
        record.ref_cache_start = (self._ref_cache.hits, self._ref_cache.lookups)
        scores = torch.full((n,), float("nan"), device=loss_mask.device)
        multimodal = any(k in out for k in _FORWARD_KEYS)
        cached = self._ref_cache_usable and not multimodal
        keys = sequence_keys(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], loss_mask) if cached else []
        if cached:
            for i, key in enumerate(keys):
                hit = self._ref_cache.get(key)
                if hit is not None:
                    scores[i] = hit
        missing = torch.isnan(scores).nonzero().squeeze(1)
        if missing.numel() == 0:
            return scores
        rows = None if missing.numel() == n else missing
        if self._capo_ref_model is not None:
            logps = self._forward_logps(self._capo_ref_model, out, rows)
        else:  # PEFT: the base model with the adapter disabled (or TRL's "ref" adapter when present)
            unwrapped = self.accelerator.unwrap_model(self.model)
            with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                logps = self._forward_logps(self.model, out, rows)
        fresh = mean_token_logprob(logps, loss_mask[missing])
        scores[missing] = fresh
        if cached:
            for i, value in zip(missing.tolist(), fresh.tolist()):
                if not math.isnan(value):
                    self._ref_cache.put(keys[i], value)
        return scores

    # ----------------------------------------------------------------------------------- logging
    def _replace_logged_advantages(self, advantages: torch.Tensor) -> None:
        """Keep the completions table in sync: TRL appended its own advantages for this batch."""
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

    def _log_calibration(self, mode, record: StepRecord, advantages, num_generations) -> None:
        metrics = self._metrics[mode]
        rewards, scores, ref_ppl, keep = record.rewards, record.scores, record.ref_ppl, record.keep
        valid = torch.isfinite(rewards) & torch.isfinite(scores)
        correct = rewards >= self.args.correct_threshold
        groups = torch.arange(rewards.numel(), device=rewards.device) // num_generations
        s, c, g = scores[valid].cpu().numpy(), correct[valid].cpu().numpy(), groups[valid].cpu().numpy()
        # pooled AUROC = the Mann-Whitney statistic of a single group: 20x cheaper than sklearn per step
        metrics["capo/auroc"].append(auroc_per_question(s, c, np.zeros_like(g))[0])
        metrics["capo/auroc_group"].append(auroc_per_question(s, c, g)[0])
        mixed = mixed_groups(rewards, valid, num_generations, self.args.correct_threshold)
        metrics["capo/mixed_group_frac"].append(mixed.float().mean().item())
        metrics["capo/adv_abs_mean"].append(advantages[valid].abs().mean().item() if valid.any() else 0.0)
        kept = keep if keep is not None else torch.ones_like(valid)
        metrics["capo/kept_frac"].append(kept.float().mean().item())
        metrics["capo/dropped_correct"].append((~kept & correct).float().mean().item())
        metrics["capo/dropped_wrong"].append((~kept & ~correct & torch.isfinite(rewards)).float().mean().item())
        if ref_ppl is not None:
            metrics["capo/ref_ppl_mean"].append(torch.nanmean(ref_ppl).item())
            if self._ref_cache_usable and record.ref_cache_start is not None:
                hits0, lookups0 = record.ref_cache_start
                local = torch.tensor([self._ref_cache.hits - hits0, self._ref_cache.lookups - lookups0],
                                     dtype=torch.float32, device=rewards.device)
                hits, lookups = self.accelerator.gather(local).view(-1, 2).sum(0).tolist()
                metrics["capo/ref_cache_hit_rate"].append(hits / lookups if lookups else float("nan"))

    def _warn_if_mask_empties_a_class(self, rewards, ref_ppl, keep, thresholds) -> None:
        """The paper's thresholds assume its models; say so loudly when they drop a whole class."""
        correct = rewards >= self.args.correct_threshold
        wrong = rewards < self.args.correct_threshold
        for name, members, bound in (("correct", correct, "ref_high"), ("wrong", wrong, "ref_low")):
            if members.any() and not (keep & members).any() and name not in self._warned:
                self._warned.add(name)
                ppl = ref_ppl[members & torch.isfinite(ref_ppl)]
                span = f"{ppl.min().item():.3g}..{ppl.max().item():.3g}" if ppl.numel() else "n/a"
                warnings.warn(
                    f"CAPO noise mask dropped every {name} completion of this batch ({int(members.sum())} of them; "
                    f"their reference perplexity spans {span}, ref_high={thresholds[0]:.4g}, "
                    f"ref_low={thresholds[1]:.4g}). The thresholds do not fit this model: CAPO is now training "
                    f"without {name} answers. Measure thresholds for your model (`capo-trl calibrate-mask`, or "
                    f"ref_thresholds='auto'), set {bound} accordingly, or "
                    "disable the mask with noise_mask=False.",
                    stacklevel=2,
                )



def _check_dataset_size(dataset, args: CAPOConfig) -> None:
    """TRL's sampler drops an incomplete generation batch: too few rows train 0 steps and 'succeed'."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return
    prompts = args.generation_batch_size // args.num_generations
    if len(dataset) == 0:
        raise UsageError("train_dataset is empty: nothing to train on.")
    if len(dataset) < prompts:
        raise UsageError(
            f"train_dataset has {len(dataset)} rows, fewer than the {prompts} distinct prompts of one generation "
            f"batch (generation_batch_size={args.generation_batch_size} / num_generations={args.num_generations}), "
            "so no step would train. Add rows, or lower per_device_train_batch_size (or steps_per_generation)."
        )


def prompt_lengths(prompts, tokenizer) -> list[int]:
    """Token count of each prompt as TRL renders it (chat template with generation prompt, or plain text)."""
    lengths = []
    for prompt in prompts:
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(prompt)["input_ids"]
        lengths.append(len(ids))
    return lengths
