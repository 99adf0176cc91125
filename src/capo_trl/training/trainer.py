"""`CAPOTrainer`: GRPOTrainer with CAPO's advantage and noise mask. Thin glue around ``advantages.py``.

It wraps (never copies) these GRPOTrainer / Trainer methods, calling ``super()`` in each:

* ``_calculate_rewards``: keeps the gathered ``(N_global, n_funcs)`` reward tensor, rejects infinities;
* ``_generate_single_turn``: records the rollout's token log-probs while transformers samples
  (so CAPO needs no second policy forward);
* ``_generate``: keeps each completion's length and tool mask (what was generated, truncated or not);
* ``_generate_and_score_completions``: scores every completion, computes the method's advantages
  and the mask on the global batch, writes this process's slice back, and logs calibration metrics;
* ``_prepare_inputs``: lets a method's state (CoDaPO's replay) choose the generation batch;
* ``compute_loss`` and ``_get_per_token_logps_and_entropies`` (``losses.py``): the method loss hooks;
* ``train``, ``_save_checkpoint``, ``_save_rng_state`` and ``_load_optimizer_and_scheduler`` (``checkpoint.py``):
  CAPO's state, inside each checkpoint, and resuming only from a complete one;
* ``create_model_card``: CAPO's citation and settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import trl
from accelerate.logging import get_logger
from accelerate.utils import gather_object, is_peft_model
from packaging.version import Version
from .vllm_cpu import adapt_to_cpu_engine, import_failure, require_vllm

try:
    from trl import GRPOTrainer
except RuntimeError as err:  # a torchvision built for another torch (vllm-cpu installs one): say what to do
    raise import_failure(err) from err
from trl.trainer.utils import get_config_model_id, pad

from ..advantages import within_group_std
from .checkpoint import CheckpointedState
from .checks import check_correct_threshold, check_dataset_size, check_prompt_lengths
from .config import MASK_FREE_NORMALISER, CAPOConfig
from ..errors import UsageError
from .answers import span_source
from .losses import MethodLosses
from .lower_layers import lower_layer_states
from .mask import NoiseMask
from ..methods import AdvantageInputs, Rollout, resolve_method
from ..methods.base import verbalized_inputs
from .model_card import CAPO_PAPER, name_local_models, settings_section
from .monitor import DriftWatch, rollout_metrics, truncation_signals
from ..evaluation.prefill import shared_prefill
from ..evaluation.sampler import sampling
from ..evaluation.recorder import RolloutLogprobRecorder, distribution_changes
from .reference import (ReferenceScoreCache, adapter_is_identity, add_reference_adapter, build_reference,
                        check_peft_reference, snapshot)
from .scoring import ReferenceScoring
from .skipping import SKIP_FIELD, resolve_skipping

logger = get_logger(__name__)  # accelerate's: a warning from the main process only

if TYPE_CHECKING:  # the constructor's annotations (GRPOTrainer's parameters), without importing these at runtime
    from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
    from peft import PeftConfig, PeftModel
    from transformers import (
        BitsAndBytesConfig,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        ProcessorMixin,
        TrainerCallback,
    )

    RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]

TESTED_TRL = "1.16"
if ".".join(Version(trl.__version__).base_version.split(".")[:2]) != TESTED_TRL:
    raise ImportError(
        f"capo-trl wraps private GRPOTrainer methods and was tested with trl {TESTED_TRL}.x, but trl "
        f"{trl.__version__} is installed. Install a matching version: pip install 'trl=={TESTED_TRL}.*'."
    )



@dataclass
class StepRecord:
    """One generation batch as it moves through TRL's hooks: filled in order, then passed explicitly.

    TRL calls ``_generate_single_turn`` and ``_calculate_rewards`` from inside
    ``_generate_and_score_completions``, so what they produce must wait here until that returns.
    """

    rollout_logps: list[list[float]] | None = None  # recorded while transformers sampled
    completion_lengths: list[int] | None = None  # generated tokens per local row, truncated or not
    truncated: list[bool] | None = None  # per local row: cut at max_completion_length (no EOS), as TRL tells it
    tool_masks: list[list[int]] | None = None  # TRL's per-row tool masks (1 = the policy's token), or None
    rewards_per_func: torch.Tensor | None = None  # (N_global, n_funcs), NaN = None
    ref_cache_start: tuple[int, int] | None = None  # (hits, lookups) before this batch
    rewards: torch.Tensor | None = None  # (N_global,) weighted total
    scores: torch.Tensor | None = None  # (N_global,) mean token log-prob under the rollout policy
    ref_ppl: torch.Tensor | None = None  # (N_global,) reference perplexity, when the mask is on
    keep: torch.Tensor | None = None  # (N_global,) the mask's verdict, None when it is off
    token_logps: tuple | None = None  # this process's (B, T) rollout token log-probs and the mask s averages


class CAPOTrainer(CheckpointedState, MethodLosses, ReferenceScoring, GRPOTrainer):
    """Calibration-Aware Policy Optimization (Wang et al., ACL 2026) as a drop-in `GRPOTrainer`.

    Same constructor as [`trl.GRPOTrainer`]; pass a [`CAPOConfig`]. With the default
    `advantage_estimator="capo"` the reward-only advantage is replaced by the pairwise logistic
    AUC-surrogate advantage of :func:`capo_trl.advantages.capo_advantages`, and completions flagged
    by the reference-perplexity noise mask leave the loss. Every estimator, `"grpo"` included,
    logs `capo/*` calibration metrics of the rollout (AUROC of mean token log-prob vs correctness).
    """

    _tag_names = ["trl", "grpo", "capo"]
    _name = "CAPO"
    _paper = CAPO_PAPER  # the model card's method and citation (GRPOTrainer's would credit DeepSeekMath)

    def __init__(
        self,
        model: str | PreTrainedModel | PeftModel,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: CAPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | DatasetDict | IterableDatasetDict | dict | None = None,
        processing_class: PreTrainedTokenizerBase | ProcessorMixin | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, torch.optim.lr_scheduler.LambdaLR | None] = (None, None),
        quantization_config: BitsAndBytesConfig | None = None,
        peft_config: PeftConfig | None = None,
        tools: list[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
    ):
        if args is None:
            name = model if isinstance(model, str) else get_config_model_id(model.config) or "model"
            args = CAPOConfig(output_dir=f"{name.split('/')[-1]}-CAPO")
        elif not isinstance(args, CAPOConfig):
            raise TypeError(
                f"CAPOTrainer needs a CAPOConfig, got {type(args).__name__}. Replace GRPOConfig(...) with "
                "CAPOConfig(...): it accepts every GRPOConfig field."
            )
        check_dataset_size(train_dataset, args)  # before any model is loaded
        require_vllm(args)
        method = resolve_method(args.advantage_estimator)(args)
        funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        check_correct_threshold(funcs, args.reward_weights, args.correct_threshold)
        self._answer_spans = (span_source(funcs, [getattr(f, "__name__", str(f)) for f in funcs])
                              if method.wants_answer_scores() else None)
        self._quantization_config = quantization_config
        mask_on = bool(args.noise_mask)
        mask_needs_ref = mask_on and args.beta == 0.0
        given_peft = not isinstance(model, str) and is_peft_model(model)
        check_peft_reference(peft_config, mask_on)
        needs_own_ref = mask_needs_ref and peft_config is None and not given_peft
        # The mask's reference is the *initial* policy: copy an in-memory model before TRL patches or trains it
        # (at beta > 0 TRL would reload its reference from config._name_or_path, without in-memory changes).
        copy_model = mask_on and peft_config is None and not given_peft and not isinstance(model, str)
        ref_source = snapshot(model) if copy_model else model
        if mask_needs_ref and given_peft and "ref" not in model.peft_config:
            add_reference_adapter(model)  # a trained adapter is part of the initial policy (TRL: only at beta > 0)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
                         reward_processing_classes, callbacks, optimizers, quantization_config, peft_config, tools,
                         rollout_func, environment_factory)
        if self.use_vllm:  # a colocated CPU engine cannot take TRL's weight sync as shipped (``vllm_cpu.py``)
            adapt_to_cpu_engine(self.vllm_generation)
        self._capo_ref_model = build_reference(self, ref_source) if needs_own_ref else None
        if copy_model and self.ref_model is not None:  # beta > 0: TRL's reference (the KL's too) is the copy
            reloaded, self.ref_model = self.ref_model, build_reference(self, ref_source)
            if reloaded in self.accelerator._models:  # accelerate keeps what it prepared: let TRL's copy go
                self.accelerator._models.remove(reloaded)
            del reloaded
        if mask_on and peft_config is not None:  # TRL wrapped the model: is base = initial policy?
            unwrapped = self.accelerator.unwrap_model(self.model)
            if not adapter_is_identity(unwrapped):
                add_reference_adapter(unwrapped)  # TRL's KL at beta > 0 reads this "ref" adapter too
        self._ref_cache = ReferenceScoreCache(args.ref_cache_size)
        self._ref_cache_usable = args.ref_cache_size > 0 and not self._sharded  # sharded forwards are collective
        self._record = StepRecord()
        self._mask = NoiseMask(args) if args.noise_mask else None
        self._drift = DriftWatch()
        # TRL averages an entropy bonus over the mask's kept rows, so unscored (kept) tied rows would change it
        entropy_bonus = args.entropy_coef != 0.0 or args.use_adaptive_entropy
        normaliser_free = args.loss_type in MASK_FREE_NORMALISER or args.noise_mask_normalizer == "unmasked"
        exact = normaliser_free and args.beta == 0.0 and args.top_entropy_quantile == 1.0 and not entropy_bonus
        self._ref_scoring = args.ref_scoring if args.ref_scoring != "auto" else "needed" if exact else "all"
        self._loss_inputs = self._loss_rows = None  # the micro-batch whose loss is being computed, its forwarded rows
        self.method = method
        self._skip_rows = resolve_skipping(args, self.method) and not self._router_aux_loss(args)

        if args.share_prompt_in_loss and self.accelerator.num_processes > 1:
            raise UsageError(f"CAPOConfig.share_prompt_in_loss=True runs in one process only (it has not run with "
                             f"{self.accelerator.num_processes}); set share_prompt_in_loss=False.")
        self._method_state, self._lower = self.method.make_state(self.num_generations), lower_layer_states(self, args)
        context = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        check_prompt_lengths(self.train_dataset, getattr(self.processing_class, "tokenizer", self.processing_class),
                             context, self.max_completion_length, "train_dataset")

    # ----------------------------------------------------------------------------------- setup
    def _router_aux_loss(self, args) -> bool:
        """A MoE router's aux loss reads every token of the batch, so skipping rows would change it."""
        if self.aux_loss_enabled and args.skip_zero_advantage_rows:
            raise UsageError(f"CAPOConfig.{SKIP_FIELD}=True is not exact with a router aux loss (it reads every "
                             f"token); set router_aux_loss_coef=0 or {SKIP_FIELD}=False.")
        return self.aux_loss_enabled

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (CAPO named and cited through ``_paper``), plus the method and mask settings used."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            card = os.path.join(self.args.output_dir, "README.md")
            base = getattr(self.model.config, "_name_or_path", None)
            with open(card) as f:
                text = name_local_models(f.read(), base, self.hub_model_id or self.args.output_dir)
            with open(card, "w") as f:
                f.write(text + settings_section(self.args, self.method.args))

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

    def _generate(self, prompts):
        out = super()._generate(prompts)
        completion_ids, tool_masks = out[1], out[2]  # before mask_truncated_completions hides truncated rows
        self._record.completion_lengths = [len(ids) for ids in completion_ids]
        eos_and_pad = {*self.eos_token_ids, self._tokenizer.pad_token_id}  # TRL's test for clipped_ratio
        self._record.truncated = [bool(ids) and ids[-1] not in eos_and_pad for ids in completion_ids]
        self._record.tool_masks = tool_masks
        return out

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        model = self.accelerator.unwrap_model(self.model_wrapped)
        shared = shared_prefill(model) if self.args.share_prompt_prefill else nullcontext()
        if not self._records_rollout_logps():
            with shared, sampling(self.args.sampler):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
        recorder = RolloutLogprobRecorder(self.temperature)
        with recorder.attached(model), shared, sampling(self.args.sampler):  # it sees the shared-cache generate's steps
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        self._record.rollout_logps = recorder.per_sequence(completion_ids)
        return completion_ids, logprobs

    def _records_rollout_logps(self) -> bool:
        """Record during plain transformers sampling, unless TRL computes the old log-probs anyway, or a
        logits processor that runs before the recorder changes the distribution (then one forward scores)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        trl_scores_rollout = self.args.gradient_accumulation_steps % generate_every != 0
        if (self.use_vllm or self.use_transformers_continuous_batching or self.tools or self.rollout_func
                or trl_scores_rollout):
            return False  # with vLLM TRL sets no generation_config at all
        model_config = getattr(self.accelerator.unwrap_model(self.model), "generation_config", None)
        return not distribution_changes(self.generation_config, model_config)

    def _generate_and_score_completions(self, inputs):
        self._record = record = StepRecord()
        if self._lower is not None:  # states of the previous batch's rows: not needed again
            self._lower.clear()
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        args = self.args
        loss_mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        record.rewards = rewards = self._total_rewards(record)
        record.scores = scores = self.accelerator.gather(self._rollout_scores(out, loss_mask, record))
        answer_scores = self._answer_scores(out, record, inputs)
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))

        self._metrics[mode]["capo/score_spread"].append(within_group_std(rewards, scores, num_generations).item())
        trl_advantages = out["advantages"]
        batch = AdvantageInputs(
            rewards=rewards, scores=scores, num_generations=num_generations,
            trl_advantages=self.accelerator.gather(trl_advantages), step=self.state.global_step,
            scale_rewards=self.scale_rewards, truncated=self._gathered_truncated(record, rewards),
            **self._verbalized_inputs(out, loss_mask),
            extra=self._rollout_inputs(out, loss_mask, inputs, mode),
            answer_scores=None if answer_scores is None else self.accelerator.gather(answer_scores),
        )
        advantages, extra = self.method.advantages(batch)
        extra = {**extra, **self._watch_truncation(batch, advantages, mode)}
        for name, value in extra.items():
            self._metrics[mode][name].append(value)

        if self._mask is not None:  # after the advantages: they say which reference scores can matter
            record.ref_ppl = self._reference_ppl(out, loss_mask, record, advantages, local, mode)
            record.keep, guarded = self._mask(rewards, record.ref_ppl, training=mode == "train")
            if record.keep is not None:
                self._metrics[mode]["capo/mask_guard_kept"].append(guarded)
            if args.ref_thresholds == "auto" and self._mask.measured is not None:
                for name, value in zip(("capo/ref_high", "capo/ref_low"), self._mask.measured):
                    self._metrics[mode][name].append(value)
        keep = record.keep
        per_sample = advantages if advantages.dim() == 1 else advantages[:, 0]  # (N, T): table shows token 0
        if keep is not None:
            advantages = advantages * (keep if advantages.dim() == 1 else keep.unsqueeze(1))
            per_sample = per_sample * keep
            if args.noise_mask_normalizer == "kept":  # else a dropped row stays, with a zero advantage
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

    def _rollout_inputs(self, out, loss_mask, inputs, mode) -> dict:
        """The method's ``rollout_inputs`` hook on this process's slice, gathered (per-token ones padded)."""
        hook = self.method.rollout_inputs
        if hook is None:
            return {}

        def score(prompts):  # these completions after other prompts: one no-grad forward of the policy
            ids = [torch.tensor(p) for p in self._tokenize_prompts(prompts)[0]]
            prompt_ids = pad(ids, padding_value=self._tokenizer.pad_token_id or 0, padding_side="left")  # as TRL
            prompt_mask = pad([torch.ones_like(p) for p in ids], padding_value=0, padding_side="left")
            device = out["completion_ids"].device
            return self._forward_logps(self.model, {"prompt_ids": prompt_ids.to(device),
                                                    "prompt_mask": prompt_mask.to(device),
                                                    "completion_ids": out["completion_ids"],
                                                    "completion_mask": out["completion_mask"]})

        local = hook(Rollout(prompts=[row["prompt"] for row in inputs], completion_ids=out["completion_ids"],
                             completion_mask=loss_mask, step=self.state.global_step, training=mode == "train",
                             score=score))
        return {name: self.accelerator.gather(self.accelerator.pad_across_processes(value.float(), dim=1)
                                              if value.dim() == 2 else value.float())
                for name, value in local.items()}

    def _gathered_truncated(self, record: StepRecord, rewards: torch.Tensor) -> torch.Tensor | None:
        """``(N_global,)`` bool: which completions of the global batch were cut at max_completion_length."""
        if record.truncated is None:
            return None
        return self.accelerator.gather(torch.tensor(record.truncated, dtype=torch.uint8, device=rewards.device)).bool()

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

    # ----------------------------------------------------------------------------------- method hooks
    def _prepare_inputs(self, generation_batch):
        """A method's state (CoDaPO's replay) may swap the batch when TRL is about to generate."""
        state = self._method_state
        if state is not None and self.model.training:
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 or self._buffered_inputs is None:  # TRL's own rule
                generation_batch = state.next_batch(generation_batch, self.accelerator.process_index)
        return super()._prepare_inputs(generation_batch)

    # ----------------------------------------------------------------------------------- inputs
    def _total_rewards(self, record: StepRecord) -> torch.Tensor:
        """Weighted sum of the reward functions, NaN where every function returned None (TRL's rule)."""
        per_func = record.rewards_per_func
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        total = (per_func * weights).nansum(dim=1)
        return total.masked_fill(torch.isnan(per_func).all(dim=1), float("nan"))

    # ----------------------------------------------------------------------------------- logging
    def _watch_truncation(self, batch: AdvantageInputs, advantages: torch.Tensor, mode: str) -> dict[str, float]:
        """The drift signals of this rollout (logged), and each truncation warning once per run."""
        per_sample = advantages if advantages.dim() == 1 else advantages[:, 0]
        signals, warnings = truncation_signals(batch, per_sample, self.args, self._drift, self.state.global_step,
                                               mode == "train")
        for message in warnings:
            logger.warning(message, main_process_only=True)
        return signals

    def _replace_logged_advantages(self, advantages: torch.Tensor) -> None:
        """Keep the completions table in sync: TRL appended its own advantages for this batch."""
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())


    def _log_calibration(self, mode, record: StepRecord, advantages, num_generations) -> None:
        # TRL's completions table (log_completions=True): why each sample got its advantage or was dropped
        extra = self._logs["extra"]
        extra["capo_score"].extend(record.scores.tolist())
        if record.ref_ppl is not None:
            extra["ref_ppl"].extend(record.ref_ppl.tolist())
            extra["kept"].extend(record.keep.tolist() if record.keep is not None else [None] * len(record.scores))
        metrics = self._metrics[mode]
        for name, value in rollout_metrics(record.rewards, record.scores, advantages, num_generations,
                                           self.args.correct_threshold, record.keep, record.ref_ppl).items():
            metrics[name].append(value)
        if record.ref_ppl is not None and self._ref_cache_usable and record.ref_cache_start is not None:
            hits0, lookups0 = record.ref_cache_start
            local = torch.tensor([self._ref_cache.hits - hits0, self._ref_cache.lookups - lookups0],
                                 dtype=torch.float32, device=record.rewards.device)
            hits, lookups = self.accelerator.gather(local).view(-1, 2).sum(0).tolist()
            metrics["capo/ref_cache_hit_rate"].append(hits / lookups if lookups else float("nan"))
