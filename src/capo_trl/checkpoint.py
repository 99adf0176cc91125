"""What CAPO carries from step to step, saved in each checkpoint and restored on resume.

One file per process, like transformers' ``rng_state_N.pth``: the mask's measured thresholds (and a
measurement still under way), the method's state (CoDaPO's replay buffer) and the reference-score
cache. With it a resumed run equals an uninterrupted one (``tests/test_resume.py``).
"""

from __future__ import annotations

import os
import warnings

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

CAPO_STATE = "capo_state_{}.pt"


class CheckpointedState:
    """Mixin for :class:`~capo_trl.CAPOTrainer`: wraps the two Trainer methods that save and restore a checkpoint."""

    def _capo_state(self) -> dict:
        """Everything CAPO carries from step to step, so that resuming a run equals not stopping it."""
        state = {}
        if self._mask is not None:
            state["mask"] = self._mask.state_dict()
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
        if self._mask is not None and "mask" in state:
            self._mask.load_state_dict(state["mask"])
        if self._method_state is not None and "method_state" in state:
            self._method_state.load_state_dict(state["method_state"])
        if self._ref_cache_usable and "ref_cache" in state:
            self._ref_cache.load_state_dict(state["ref_cache"])
