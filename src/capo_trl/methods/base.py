"""The plug-in boundary between the trainer and a method (the model: verl's ``register_adv_est``).

A method is a :class:`Method` subclass. The trainer builds one per run from the config and calls
only what is declared here: :meth:`Method.advantages` always, and each optional hook when the
method sets it. Nothing in ``trainer.py`` names a method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol

import torch


@dataclass(frozen=True)
class AdvantageInputs:
    """The global batch a method sees (contiguous groups of ``num_generations``).

    ``rewards`` (N,) weighted total, NaN = unscorable; ``scores`` (N,) mean token log-prob under the
    rollout policy; ``trl_advantages`` GRPOTrainer's own advantages (``scale_rewards`` applied);
    ``step`` the optimizer step the rollout was generated at; ``truncated`` (N,) bool, the completions cut at
    ``max_completion_length`` (no EOS: TRL's ``completions/clipped_ratio``). Methods with ``parse_confidence`` also
    get the stated ``confidence`` (N,) (NaN if none), ``format_ok`` (N,) and ``confidence_mask``
    (N, T) of the confidence block's tokens (T = the widest completion over processes). Methods whose
    :meth:`Method.wants_answer_scores` is true get ``answer_scores`` (N,): the mean token log-prob of each final
    answer's own tokens, where the reward function reads it (NaN: no answer found).
    """

    rewards: torch.Tensor
    scores: torch.Tensor
    num_generations: int
    trl_advantages: torch.Tensor
    step: int = 0
    scale_rewards: str = "group"
    truncated: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    format_ok: torch.Tensor | None = None
    confidence_mask: torch.Tensor | None = None
    answer_scores: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # what rollout_inputs returned, gathered


@dataclass(frozen=True)
class Rollout:
    """This process's slice of a generation batch, for :meth:`Method.rollout_inputs`.

    ``score(prompts)`` gives ``(B, T)`` token log-probs of these very completions (no gradient, the
    current policy) after the given prompts instead of the sampled ones: one forward per call.
    """

    prompts: list
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    step: int
    training: bool
    score: Callable[[list], torch.Tensor]


@dataclass(frozen=True)
class Verbalized:
    """What a completion states: ``confidence`` in [0, 1] or None, where the confidence block starts
    (a character offset, None when absent) and whether the whole output format holds."""

    confidence: float | None
    start: int | None
    format_ok: bool


class MethodState(Protocol):
    """Per-run state a method carries between steps (CoDaPO's replay); checkpointed by the trainer."""

    def next_batch(self, incoming: list, process_index: int) -> list:
        """The local generation batch to train on now, given the one the dataloader produced."""

    def observe(self, batch: AdvantageInputs, global_rows: list) -> dict[str, float]:
        """See a scored training batch (and its dataset rows, gathered); returns metrics to log."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    # Optional: a state without it cannot resume on another number of processes (the trainer refuses).
    reshard: ClassVar[Callable[[list[dict], int, int, int], dict] | None]
    """``(states of every old process, process_index, num_processes, local_size) -> this process's state``."""


def _honours(cls: type) -> list[str]:
    """Names of ``cls`` and its subclasses that honour ``multi_objective_aggregation`` (the classes say it)."""
    own = [cls.name] if cls.name and cls.honours_aggregation else []
    return own + [name for sub in cls.__subclasses__() for name in _honours(sub)]


def _honouring() -> list[str]:
    return sorted(set(_honours(Method)))


class Method:
    """One way of turning a scored rollout batch into advantages (and, optionally, a loss).

    Subclass it, set :attr:`name`, and implement :meth:`advantages`. Optional, typed hooks (leave
    them ``None`` / unimplemented when not needed):

    * :attr:`Args`: a dataclass of the method's settings. A built-in method's fields are
      :class:`~capo_trl.CAPOConfig` fields (flat YAML keys); a method outside the package gets its
      values from ``CAPOConfig.method_kwargs``. :meth:`validate` checks them at config time.
    * :attr:`parse_confidence`: ``text -> Verbalized``; the trainer then fills the ``confidence*``
      inputs.
    * :meth:`sequence_loss`: replaces TRL's loss by one of the current mean token log-probs.
    * :meth:`token_logps`: replaces the log-probs TRL's loss is computed from (needs full logits).
    * :meth:`make_state`: per-run state (replay), checkpointed with the run.
    * :meth:`zero_rows_matter`: why rows with a zero advantage still change the loss (then none is skipped).
    * :attr:`rollout_inputs`: ``Rollout -> {name: (B,) or (B, T) tensor}``, extra per-sample inputs
      computed on each process's slice (it may run forwards through ``Rollout.score``); the trainer
      gathers them into ``AdvantageInputs.extra``.
    """

    name: ClassVar[str] = ""
    Args: ClassVar[type | None] = None
    default_noise_mask: ClassVar[bool] = False  # what CAPOConfig.noise_mask=None means for this method
    # Whether the advantages follow GRPOConfig.multi_objective_aggregation: true for methods built on
    # TRL's own advantages (which apply it); the others see one weighted total reward per completion.
    honours_aggregation: ClassVar[bool] = False
    parse_confidence: ClassVar[Callable[[str], Verbalized] | None] = None
    sequence_loss: ClassVar[Callable | None] = None
    token_logps: ClassVar[Callable | None] = None
    rollout_inputs: ClassVar[Callable[[Rollout], dict[str, torch.Tensor]] | None] = None

    def __init__(self, config):
        self.config = config
        self.args = self.bind_args(config, selected=True)
        aggregation = getattr(config, "multi_objective_aggregation", "sum_then_normalize")
        if aggregation != "sum_then_normalize" and not self.honours_aggregation:
            raise ValueError(
                f"CAPOConfig.multi_objective_aggregation={aggregation!r} is not honoured by advantage_estimator="
                f"{self.name!r}: it computes its advantages from the weighted total reward. Use "
                f"'sum_then_normalize', or a method built on TRL's advantages ({', '.join(_honouring())}).")
        self.check(config)

    # ---------------------------------------------------------------------------- settings
    @classmethod
    def bind_args(cls, config, selected: bool = False) -> Any:
        """The method's :attr:`Args` from the config (its own fields, or ``method_kwargs`` when it is the
        ``selected`` method), validated."""
        kwargs = (getattr(config, "method_kwargs", None) or {}) if selected else {}
        if cls.Args is None:
            if kwargs:
                raise ValueError(f"CAPOConfig.method_kwargs={kwargs!r}: method {cls.name!r} takes no settings.")
            return None
        names = [f.name for f in fields(cls.Args)]
        if all(hasattr(config, n) for n in names):  # a built-in method: its fields are CAPOConfig's
            if kwargs:
                raise ValueError(f"CAPOConfig.method_kwargs is for methods defined outside capo-trl; set "
                                 f"{sorted(kwargs)} as CAPOConfig fields instead.")
            args, prefix = cls.Args(**{n: getattr(config, n) for n in names}), "CAPOConfig."
        else:
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise ValueError(f"CAPOConfig.method_kwargs: {unknown} are not settings of method {cls.name!r} "
                                 f"(it has {names}).")
            args, prefix = cls.Args(**kwargs), "CAPOConfig.method_kwargs."
        cls.validate(args, prefix)
        return args

    @classmethod
    def validate(cls, args, prefix: str = "CAPOConfig.") -> None:
        """Raise ValueError naming ``prefix + field`` for a bad value of :attr:`Args`."""

    def check(self, config) -> None:
        """Constraints on other config fields that hold only when this method is selected."""

    # ---------------------------------------------------------------------------- hooks
    def advantages(self, batch: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """``(N,)`` or per-token ``(N, T)`` advantages for the global batch, and metrics to log."""
        raise NotImplementedError

    def wants_answer_scores(self) -> bool:
        """Whether :meth:`advantages` reads ``AdvantageInputs.answer_scores`` (the trainer then asks a reward
        function where each answer is: its ``answer_spans``)."""
        return False

    def make_state(self, num_generations: int) -> MethodState | None:
        """Per-run state, or None (the default: the method is a pure function of each batch)."""
        return None

    def zero_rows_matter(self) -> str | None:
        """Why rows with a zero advantage still change this method's loss (None: they add exactly zero).

        By default a method's own :meth:`sequence_loss` may read every row (C2GSPG's calibration term
        does); TRL's loss, with or without :meth:`token_logps` (row by row), multiplies each row by its advantage.
        """
        return "its sequence_loss reads every row's log-probs" if self.sequence_loss is not None else None


# ------------------------------------------------------------------------------------ stated confidence
def token_start(ids: Sequence[int], char_start: int, decode: Callable[[list[int]], str]) -> int | None:
    """Index of the first token whose decoded text reaches character ``char_start`` (binary search
    over prefix decodes, so multi-character and byte-level tokens map correctly)."""
    ids = list(ids)
    lo, hi = 1, len(ids)
    if not ids or len(decode(ids)) <= char_start:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) > char_start:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def verbalized_inputs(parse: Callable[[str], Verbalized], completion_ids: torch.Tensor, mask: torch.Tensor,
                      decode: Callable[[list[int]], str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per completion (right-padded rows): stated confidence (NaN if none), format flag, and a
    ``(B, T)`` mask of the confidence block's tokens (last token when there is no block)."""
    n_rows, width = completion_ids.shape
    confidence = torch.full((n_rows,), float("nan"))
    format_ok = torch.zeros(n_rows, dtype=torch.bool)
    span = torch.zeros(n_rows, width, dtype=torch.bool)
    lengths = mask.sum(dim=1).tolist()
    for i, n in enumerate(int(v) for v in lengths):
        ids = completion_ids[i, :n].tolist()
        stated = parse(decode(ids)) if n else Verbalized(None, None, False)
        format_ok[i] = stated.format_ok
        start = None
        if stated.confidence is not None:
            confidence[i] = stated.confidence
            start = token_start(ids, stated.start, decode)
        if start is not None:
            span[i, start:n] = True
        elif n:
            span[i, n - 1] = True
    device = completion_ids.device
    return confidence.to(device), format_ok.to(device), span.to(device)


# ------------------------------------------------------------------------------------ field checks
def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_fields(args, prefix: str, *, nonneg=(), positive=(), unit=(), count=(), flags=(),
                 choices: dict | None = None) -> None:
    """Range checks shared by the methods' :meth:`Method.validate`; errors name the field."""
    def bad(name, allowed):
        return ValueError(f"{prefix}{name}={getattr(args, name)!r} is invalid; {allowed}.")

    for name in nonneg:
        if not _number(getattr(args, name)) or getattr(args, name) < 0:
            raise bad(name, "it must be a finite number >= 0")
    for name in positive:
        if not _number(getattr(args, name)) or getattr(args, name) <= 0:
            raise bad(name, "it must be a finite number > 0")
    for name in unit:
        if not _number(getattr(args, name)) or not 0 <= getattr(args, name) <= 1:
            raise bad(name, "it must be in [0, 1]")
    for name in count:
        value = getattr(args, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad(name, "it must be an integer >= 1")
    for name in flags:
        if getattr(args, name) not in (True, False):
            raise bad(name, "use true or false")
    for name, allowed in (choices or {}).items():
        if getattr(args, name) not in allowed:
            raise bad(name, f"choose one of {tuple(allowed)}")


def help_text(text: str, **extra) -> dict:
    return {"help": text, **extra}
