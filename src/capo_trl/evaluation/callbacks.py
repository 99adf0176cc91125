"""In-training calibration monitor: accuracy and AUROC on a validation set every few steps.

The paper's Figure 1b (AUROC and accuracy against training step) is what this records. Usage::

    trainer = CAPOTrainer(...)
    monitor = CalibrationCallback(val_dataset, every_n_steps=50, n=8)
    trainer.add_callback(monitor.bind(trainer))
    trainer.train()
    monitor.plot("auroc_vs_step.png")

Why ``bind``: transformers hands callbacks the model and tokenizer but not the trainer, and the
metrics must go through ``Trainer.log`` to reach ``log_history`` and every reporter (W&B,
TensorBoard, ...). ``Trainer.log`` of the base class is called directly: TRL's override would
flush and clear the rollout metrics it is averaging between logging steps.

Several processes: the main process evaluates the whole validation set on its unwrapped model
(plain DDP has no collective in ``generate``, so the others simply wait) and broadcasts the
metrics, so every process logs and keeps the same history. Keep the validation set small enough
to finish within the collective timeout. ZeRO-3 and FSDP shard the weights, so one process
cannot generate alone: :meth:`CalibrationCallback.bind` refuses them.
"""

from __future__ import annotations

import math
from pathlib import Path

from transformers import Trainer, TrainerCallback

from .evaluate import EvalResult, evaluate
from .plots import calibration_history

__all__ = ["CalibrationCallback"]

_NOT_LOGGED = ("n_problems", "n_samples")


class CalibrationCallback(TrainerCallback):
    """Evaluate ``eval_dataset`` with :func:`capo_trl.evaluation.evaluate.evaluate` during training.

    Runs at train begin (the step-0 point) and whenever ``global_step % every_n_steps == 0``,
    and logs every scalar metric as ``{prefix}{name}`` (``val/mean@8``, ``val/auroc``,
    ``val/auroc_question``, ``val/ece``, ...; undefined values are logged as None, like TRL).
    Sampling settings default to the trainer's (``temperature``, ``top_p``, ``top_k``,
    ``max_completion_length``), so the confidence ``s`` is the one the trainer computes.
    ``history`` holds ``{"step", **metrics}`` per evaluation; ``last_result`` the last
    :class:`~capo_trl.evaluation.evaluate.EvalResult` (main process only).

    ``calibration`` (``"platt"`` by default; ``None`` to skip): also log ``{prefix}ece_calibrated``,
    the ECE of P(correct) after recalibrating ``s`` with that method, cross-fitted by question (a map
    fitted on half of the problems scores the other half, and the reverse), so no extra sampling
    and no leakage: it says how much of the raw ECE a recalibration would remove.
    """

    def __init__(self, eval_dataset, every_n_steps: int = 50, n: int = 8, *, ks: list[int] | None = None,
                 max_new_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, batch_size: int = 64, grader=None, seed: int | None = 0,
                 prefix: str = "val/", eval_at_start: bool = True, calibration: str | None = "platt"):
        if every_n_steps < 1:
            raise ValueError(f"CalibrationCallback: every_n_steps must be >= 1, got {every_n_steps}.")
        self.eval_dataset = eval_dataset
        self.every_n_steps, self.n, self.ks = every_n_steps, n, ks
        self.sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                         "top_k": top_k}
        self.batch_size, self.seed, self.prefix, self.eval_at_start = batch_size, seed, prefix, eval_at_start
        from .confidence import METHODS

        if calibration is not None and calibration not in METHODS:
            raise ValueError(f"CalibrationCallback: calibration must be one of {', '.join(METHODS)} or None, got "
                             f"{calibration!r}.")
        self.calibration = calibration
        self.grader, self._owns_grader = grader, grader is None
        self.trainer: Trainer | None = None
        self.history: list[dict] = []
        self.last_result: EvalResult | None = None

    def bind(self, trainer: Trainer) -> CalibrationCallback:
        """Attach the trainer whose model is evaluated and whose loggers receive the metrics."""
        if getattr(trainer, "is_fsdp_enabled", False) or _zero_stage(trainer) == 3:
            raise NotImplementedError(
                "CalibrationCallback evaluates on the main process only, which needs the full weights there; "
                "ZeRO-3 and FSDP shard them. Evaluate saved checkpoints with `capo-trl eval` instead."
            )
        self.trainer = trainer
        return self

    # ------------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        if not self.history:  # a resumed run: its checkpoint's log holds the points already measured
            self.history = [{"step": row["step"], **{k: math.nan if v is None else v for k, v in row.items()
                                                     if k.startswith(self.prefix)}}
                            for row in state.log_history if any(k.startswith(self.prefix) for k in row)]
        # Fresh: the step-0 point. Resumed: only a due point the stop missed (resuming equals not stopping).
        if self.eval_at_start if state.global_step == 0 else state.global_step % self.every_n_steps == 0:
            self._evaluate(state, control)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_n_steps == 0:
            self._evaluate(state, control)

    def on_train_end(self, args, state, control, **kwargs):
        if self._owns_grader and self.grader is not None:
            self.grader.close()  # stop the worker processes; a later train() restarts them
            self.grader = None

    # ------------------------------------------------------------------------------- work
    def _evaluate(self, state, control) -> None:
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("CalibrationCallback is not bound to a trainer: use "
                               "trainer.add_callback(callback.bind(trainer)).")
        if self.history and self.history[-1]["step"] == state.global_step:
            return  # resumed on an evaluation step: measured before the stop, and logged then
        accelerator = trainer.accelerator
        metrics = None
        if accelerator.is_main_process:
            self.last_result = evaluate(
                accelerator.unwrap_model(trainer.model), trainer.processing_class, self.eval_dataset, n=self.n,
                ks=self.ks, batch_size=self.batch_size, grader=self._grader(), seed=self.seed, progress=False,
                **self._sampling_settings(trainer.args),
            )
            if self.calibration is not None:
                self.last_result.metrics["ece_calibrated"] = self._recalibrated_ece(self.last_result)
            metrics = {f"{self.prefix}{k}": float(v) for k, v in self.last_result.metrics.items()
                       if k not in _NOT_LOGGED}
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            metrics = broadcast_object_list([metrics], from_process=0)[0]
        self.history.append({"step": state.global_step, **metrics})
        # Logging resets control.should_log, which would swallow this step's regular log: keep it.
        should_log = control.should_log
        Trainer.log(trainer, {k: None if math.isnan(v) else v for k, v in metrics.items()})
        control.should_log = should_log

    def _recalibrated_ece(self, result) -> float:
        import numpy as np

        from .calibration import ece
        from .confidence import cross_fitted
        from ..errors import UsageError

        graded = [r for r in result.samples if r["grade"] is not None]
        y = np.array([r["grade"] for r in graded], dtype=float)
        try:
            p = cross_fitted([r["score"] for r in graded], y, [r["id"] for r in graded], self.calibration,
                             seed=self.seed or 0)
        except UsageError:  # a half with one class only (or too few problems): nothing to fit
            return float("nan")
        return ece(p, y)

    def _grader(self):
        if self.grader is None:
            from ..grader import default_grader

            self.grader = default_grader()
        return self.grader

    def _sampling_settings(self, args) -> dict:
        """Explicit settings win; the rest come from the trainer's config (TRL names), then defaults."""
        trainer_values = {"max_new_tokens": getattr(args, "max_completion_length", None),
                          "temperature": getattr(args, "temperature", None), "top_p": getattr(args, "top_p", None),
                          "top_k": getattr(args, "top_k", None)}
        defaults = {"max_new_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
        return {k: next(v for v in (self.sampling[k], trainer_values[k], defaults[k]) if v is not None)
                for k in defaults}

    # ------------------------------------------------------------------------------- figure
    def plot(self, path) -> Path:
        """AUROC (pooled, per question) and accuracy against training step, as one PNG (:mod:`capo_trl.evaluation.plots`)."""
        if not self.history:
            raise ValueError("CalibrationCallback.plot: no evaluation has run yet.")
        return calibration_history(self.history, path, prefix=self.prefix, n=self.n)


def _zero_stage(trainer) -> int | None:
    plugin = getattr(getattr(trainer.accelerator, "state", None), "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None) if plugin is not None else None
