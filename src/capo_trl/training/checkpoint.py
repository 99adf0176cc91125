"""What CAPO carries from step to step, saved in each checkpoint and restored on resume.

One file per checkpoint, ``capo_state.pt``, written by the main process with every process's part: the
mask's measured thresholds (and a measurement still under way; the same on every process, since the mask
sees the gathered batch), the drift warning's record (global too), the method's state (CoDaPO's replay,
whose deferred batches are per process) and each process's reference-score cache. So a run can resume on
another number of processes: every process gets the same thresholds, a method state is re-split by the
method (``reshard``) or refused in one line, and the caches are pooled (their entries are exact scores).
With the same number of processes a resumed run equals an uninterrupted one (``tests/test_resume.py``).

The file is part of the checkpoint, not an afterthought: it is written atomically (a temporary file,
fsync, ``os.replace``) before transformers writes the checkpoint's own files, so it is there before
``trainer_state.json`` marks the checkpoint complete and before ``save_total_limit`` deletes an older
one; ``train`` resumes only from a complete checkpoint (``resume.py``), so a process killed at any
instant resumes exactly or is refused in one line (``tests/test_kill_resume.py``).
"""

from __future__ import annotations

import os

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import UsageError
from .resume import CAPO_STATE, ENTROPY_STATE, LEGACY_STATE, TRAINER_STATE, checkpoint_problem, resume_checkpoint


def save_atomically(obj, path: str) -> None:
    """``torch.save`` that leaves either the old file or the whole new one, whenever the process dies."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash of the machine
    finally:
        os.close(folder)


class CheckpointedState:
    """Mixin for :class:`~capo_trl.CAPOTrainer`: wraps the Trainer methods that save, choose and restore a checkpoint."""

    def _capo_state(self) -> dict:
        """This process's part of what CAPO carries from step to step."""
        state = {}
        if self._mask is not None:
            state["mask"] = self._mask.state_dict()
        if self._method_state is not None:
            state["method_state"] = self._method_state.state_dict()
        if self._ref_cache_usable:
            state["ref_cache"] = self._ref_cache.state_dict()
        state["drift"] = self._drift.state_dict()  # global: it watches the gathered batch
        return state

    def _needs_optimizer_files(self) -> bool:
        """Transformers writes optimizer.pt / scheduler.pt / rng_state*.pth as plain files (DeepSpeed, FSDP: folders)."""
        return not (self.args.save_only_model or self.is_deepspeed_enabled or self.is_fsdp_enabled)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """Resume only from a complete, unfinished checkpoint: ``True`` takes the newest complete one."""
        resume_from_checkpoint = resume_checkpoint(
            resume_from_checkpoint, self.args.output_dir, self._needs_optimizer_files(), max_steps=self.args.max_steps,
            needs_json=(ENTROPY_STATE,) if self.use_adaptive_entropy else ())
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        """CAPO's state first, atomically; then transformers' save, whose ``trainer_state.json`` comes last."""
        parts = gather_object([self._capo_state()])  # every process calls _save_checkpoint
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            stale = os.path.join(folder, TRAINER_STATE)
            if os.path.exists(stale):  # a folder written again is incomplete until transformers writes it anew
                os.remove(stale)
            save_atomically({"processes": parts}, os.path.join(folder, CAPO_STATE))  # their count is len(parts)
        super()._save_checkpoint(model, trial)

    def _save_rng_state(self, output_dir):
        """Every process's RNG file is whole before the main process writes ``trainer_state.json``."""
        super()._save_rng_state(output_dir)
        self.accelerator.wait_for_everyone()

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
        else:  # train() resumes only from complete checkpoints; this is a folder that changed since
            problem = checkpoint_problem(checkpoint, self._needs_optimizer_files()) or f"no {CAPO_STATE}"
            raise UsageError(f"resume_from_checkpoint {checkpoint} is incomplete ({problem}); resume from a complete "
                             "checkpoint-N folder (resume_from_checkpoint=True takes the newest).")
        self._restore(parts, index, count, checkpoint)

    def _restore(self, parts: list[dict], index: int, count: int, checkpoint: str) -> None:
        """Load the parts written by ``len(parts)`` processes into process ``index`` of ``count``."""
        mine = parts[index] if len(parts) == count else parts[0]
        if self._mask is not None and "mask" in mine:
            self._mask.load_state_dict(mine["mask"])  # global: identical in every part
        if "drift" in mine:  # global too; a checkpoint from before it was saved starts the watch afresh
            self._drift.load_state_dict(mine["drift"])
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
