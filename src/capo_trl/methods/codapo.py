"""CoDaPO (confidence x difficulty weighted GRPO, with optional replay of its highest-weight questions)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from ..advantages import _grouped, correctness
from .base import AdvantageInputs, Method, check_fields, help_text


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

    @staticmethod
    def reshard(states: list[dict], process_index: int, num_processes: int, local_size: int) -> dict:
        """Process ``process_index`` of ``num_processes``'s state from the states of another number of processes.

        ``pending`` is global (every process holds the same); deferred batch k of the run is the
        processes' k-th local batches in process order, re-split into slices of ``local_size``.
        """
        deferred = []
        for k in range(len(states[0]["deferred"])):
            rows = [row for state in states for row in state["deferred"][k]]
            if len(rows) != local_size * num_processes:
                raise ValueError(
                    f"CoDaPO's deferred generation batch has {len(rows)} rows, which {num_processes} processes of "
                    f"{local_size} (per_device_train_batch_size x steps_per_generation) cannot split: keep the global "
                    "batch size when resuming on another number of processes.")
            deferred.append(rows[process_index * local_size:(process_index + 1) * local_size])
        return {"pending": states[0]["pending"], "deferred": deferred, "replaying": states[0]["replaying"]}

    def observe(self, batch: AdvantageInputs, global_rows: list) -> dict[str, float]:
        """Plan the replay of a normal batch (global rows, contiguous groups). Logs whether this batch
        was a replay and how many questions were selected (0 after a replay, which is never replayed)."""
        selected = 0
        if not self.replaying:
            G = self.num_generations
            weights = codapo_weights(correctness(batch.rewards, self.correct_threshold), batch.scores, G, self.offset)
            order = codapo_replay_groups(weights.cpu(), len(global_rows) // G, self.percentile, self.repeat)
            self.pending = [row for g in order for row in global_rows[g * G:(g + 1) * G]] or None
            selected = len(set(order))
        return {"codapo/replay_batch": float(self.replaying), "codapo/selected_questions": float(selected)}


@dataclass
class CoDaPOArgs:
    """CoDaPO's fields of :class:`~capo_trl.CAPOConfig`."""

    codapo_weight_offset: float = field(default=0.1, metadata=help_text("CoDaPO: weight = conf * d_w + offset."))
    codapo_replay: bool = field(default=False, metadata=help_text(
        "CoDaPO: after each generation, replay the highest-weight questions with fresh rollouts for a second "
        "update (every other generation batch is a replay; deferred batches are used afterwards)."))
    codapo_percentile: float = field(default=0.75, metadata=help_text(
        "CoDaPO replay: questions with weight >= this quantile of the batch are replayed."))
    codapo_repeat: int = field(default=4, metadata=help_text("CoDaPO replay: groups per replayed question."))


class CoDaPO(Method):
    """GRPO's advantage times the group's difficulty x confidence weight; the replay is its state."""

    name = "codapo"
    honours_aggregation = True  # its advantages are (built on) TRL\'s
    Args = CoDaPOArgs

    @classmethod
    def validate(cls, args: CoDaPOArgs, prefix: str = "CAPOConfig.") -> None:
        check_fields(args, prefix, nonneg=("codapo_weight_offset",), unit=("codapo_percentile",),
                     count=("codapo_repeat",), flags=("codapo_replay",))

    def advantages(self, batch: AdvantageInputs):
        correct = correctness(batch.rewards, self.config.correct_threshold)
        weights = codapo_weights(correct, batch.scores, batch.num_generations, self.args.codapo_weight_offset)
        adv = batch.trl_advantages * weights.to(batch.trl_advantages.device).repeat_interleave(batch.num_generations)
        return adv, {"codapo/weight_mean": weights.mean().item()}

    def make_state(self, num_generations: int) -> CoDaPOReplay | None:
        a = self.args
        if not a.codapo_replay:
            return None
        return CoDaPOReplay(num_generations, a.codapo_percentile, a.codapo_repeat, a.codapo_weight_offset,
                            self.config.correct_threshold)
