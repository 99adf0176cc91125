"""What CAPO carries from step to step, saved in each checkpoint and restored on resume.

One file per checkpoint, ``capo_state.pt``, written by the main process with every process's part:
the mask's measured thresholds (and a measurement still under way; the same on every process, since
the mask sees the gathered batch), the method's state (CoDaPO's replay, whose deferred batches are
per process) and each process's reference-score cache. So a run can resume on another number of
processes: every process gets the same thresholds, a method state is re-split by the method
(``reshard``) or refused in one line, and the caches are pooled (their entries are exact scores).
With the same number of processes a resumed run equals an uninterrupted one (``tests/test_resume.py``).
"""

from __future__ import annotations

import os
import warnings

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import UsageError

CAPO_STATE = "capo_state.pt"
LEGACY_STATE = "capo_state_{}.pt"  # one file per process, written before capo_state.pt existed


class CheckpointedState:
    """Mixin for :class:`~capo_trl.CAPOTrainer`: wraps the two Trainer methods that save and restore a checkpoint."""

    def _capo_state(self) -> dict:
        """This process's part of what CAPO carries from step to step."""
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
        parts = gather_object([self._capo_state()])  # every process calls _save_checkpoint
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            torch.save({"processes": parts}, os.path.join(folder, CAPO_STATE))  # their count is len(parts)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Resume hook (TRL restores its own controller state here too): reload :meth:`_capo_state`."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        index, count = self.accelerator.process_index, self.accelerator.num_processes
        path = os.path.join(checkpoint, CAPO_STATE)
        legacy = os.path.join(checkpoint, LEGACY_STATE.format(index))
        if os.path.isfile(path):
            parts = torch.load(path, weights_only=True)["processes"]
        elif os.path.isfile(legacy):
            parts, index, count = [torch.load(legacy, weights_only=True)], 0, 1  # this process's own part only
        else:
            stateful = self.args.noise_mask and self.args.ref_thresholds == "auto" or self._method_state is not None
            if stateful:
                warnings.warn(
                    f"{checkpoint} has no {CAPO_STATE} (written by an older capo-trl?): measured mask thresholds, "
                    "the method's state (e.g. CoDaPO's replay buffer) and the reference cache start afresh, so this "
                    "resumed run differs from an uninterrupted one.",
                    stacklevel=2,
                )
            return
        self._restore(parts, index, count, checkpoint)

    def _restore(self, parts: list[dict], index: int, count: int, checkpoint: str) -> None:
        """Load the parts written by ``len(parts)`` processes into process ``index`` of ``count``."""
        mine = parts[index] if len(parts) == count else parts[0]
        if self._mask is not None and "mask" in mine:
            self._mask.load_state_dict(mine["mask"])  # global: identical in every part
        if self._method_state is not None and "method_state" in mine:
            if len(parts) == count:
                self._method_state.load_state_dict(mine["method_state"])
            else:
                reshard = getattr(self._method_state, "reshard", None)
                if reshard is None:
                    raise UsageError(
                        f"{checkpoint} was written by {len(parts)} processes and this run has {count}: the state of "
                        f"advantage_estimator={self.args.advantage_estimator!r} cannot be re-split; resume with "
                        f"{len(parts)} processes.")
                local_size = self.args.per_device_train_batch_size * self.args.steps_per_generation
                self._method_state.load_state_dict(
                    reshard([p["method_state"] for p in parts], index, count, local_size))
        if self._ref_cache_usable:
            caches = [mine] if len(parts) == count else parts
            for part in caches:  # pooled: an entry is the exact score of its sequence, whoever computed it
                if "ref_cache" in part:
                    self._ref_cache.load_state_dict(part["ref_cache"], merge=len(caches) > 1)
