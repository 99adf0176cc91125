"""The checks of ``study.yaml``'s keys, one by one (:func:`capo_trl.harness.study.load_study` reads the file): the
arms (a recipe and its overrides, or a harness preset under the file's budget), the contrasts, a pilot's decision
rule, and what they give: :class:`Plan`, :class:`Arm` and :class:`Test`. Each error names the key and the fix."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError

FILE = "study.yaml"
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece", "e_aurc", "finished_frac", "mean_tokens")
LOWER_IS_BETTER = ("ece", "e_aurc", "mean_tokens")
# Budget fields a file's `budget` may not set: the study's own keys say them
BUDGET_OWN = {"steps": "steps", "task": "task", "model": "model", "progress": None}


@dataclass(frozen=True)
class Plan:
    """What a protocol fixes before its first run: arms (name -> method label, the first the reference), the
    primary contrast, the looks (complete seeds, two-sided alpha), the ordered secondaries and the safety rules."""

    arms: dict
    primary: tuple  # (endpoint, arm, minus arm)
    looks: tuple  # ((complete seeds, alpha), ...); the last is the final look
    secondaries: tuple  # ((endpoint, arm, minus arm), ...), one Holm family
    deadline: str | None
    family_alpha: float = 0.05
    safety: tuple = ("accuracy",)
    collapse_tokens: float = 36.0  # a run whose mean completion length on the test split is at least this ...
    min_finished: float = 0.0  # ... or whose share of samples that ended (EOS) within the limit is below this
    descriptive: tuple = ("e_aurc", "ece", "auroc_question", "coverage@0.8", "derivable/accuracy",
                          "guessable/accuracy", "derivable/mean_score", "guessable/mean_score")
    undefined_auroc: float | None = None  # what an undefined AUROC (one class only) counts as; None: refused
    alternative: str = "two-sided"  # the primary's test: or one-sided, "greater" (arm above minus) or "less"

    @property
    def max_seeds(self) -> int:
        return self.looks[-1][0]


@dataclass(frozen=True)
class Arm:
    """One arm: a recipe (YAML, relative to the repository root) and the fields it overrides, or a harness preset;
    its own task and steps where they differ from the study's."""

    name: str
    recipe: str | None = None
    overrides: dict = field(default_factory=dict)
    preset: str | None = None
    task: str | None = None
    steps: int | None = None

    @property
    def label(self) -> str:
        """How the runner names the arm's method: its preset specification, else its name."""
        return self.preset or self.name

    def flags(self) -> list[str]:
        """The overrides as ``capo-trl train`` flags, in the file's order."""
        out = []
        for key, value in self.overrides.items():
            out += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
        return out


@dataclass(frozen=True)
class Test:
    """How every run is tested: the first ``problems`` of the task's ``split``, ``samples`` each, temperature 1."""

    problems: int = 256
    samples: int = 8
    max_new_tokens: int = 32
    seed: int = 0
    batch_size: int = 64
    split: str = "test"
    dtype: str = "float32"  # the weights' dtype when testing; bfloat16 pays only on a CPU with AMX (docs/studies.md)
    sampler: str = "multinomial"  # how each token is drawn (capo-trl eval --sampler): torch's draws, or inverse_cdf


# A metric a study may name as a safety endpoint or a descriptive: one its records hold (a kind of the task's items,
# derivable/ or guessable/, may prefix it), coverage or precision at a target precision, or a selector at n samples.
METRIC = re.compile(r"(?:(?:derivable|guessable)/)?(?:accuracy|auroc|auroc_question|ece|e_aurc|finished_frac|"
                    r"mean_tokens|answered_frac|mean_score|mean_confidence|modal_share|problems)"
                    r"|(?:coverage|precision)@0?\.\d+|(?:pass|maj|pc|rpc|bon|mean)@\d+")
SPLITS = ("train", "validation", "test")
DTYPES = ("float32", "bfloat16")  # capo-trl eval --dtype
SAMPLERS = ("multinomial", "inverse_cdf")  # capo-trl eval --sampler  # an embedded task's splits (a study's arms train on embedded tasks)


def names(value, where: str, metrics: bool = True) -> tuple[str, ...]:
    """A list of distinct names (``metrics``: each a metric a record holds, :data:`METRIC`), as a tuple."""
    if not isinstance(value, list) or not value or len(set(map(str, value))) != len(value) or \
            not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where} = {value!r}; write a list of distinct names, e.g. [accuracy, ece].")
    unknown = [v for v in value if metrics and not METRIC.fullmatch(v)]
    if unknown:
        raise UsageError(f"{where}: {unknown} is no metric a record holds; use e.g. accuracy, auroc_question, ece, "
                         "e_aurc, finished_frac, mean_tokens, derivable/accuracy, guessable/modal_share, coverage@0.8.")
    return tuple(value)


def read_test(value, where: str) -> Test:
    """The file's ``test``: each key a field of :class:`Test`, counts positive, the split one a task has."""
    value = mapping(value or {}, where)
    fields = [f.name for f in dataclasses.fields(Test)]
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise UsageError(f"{where}: unknown keys {unknown}; the keys are {fields}.")
    if "split" in value and value["split"] not in SPLITS:
        raise UsageError(f"{where}.split = {value['split']!r}; use one of {list(SPLITS)}.")
    if "dtype" in value and value["dtype"] not in DTYPES:
        raise UsageError(f"{where}.dtype = {value['dtype']!r}; use one of {list(DTYPES)}.")
    if "sampler" in value and value["sampler"] not in SAMPLERS:
        raise UsageError(f"{where}.sampler = {value['sampler']!r}; use one of {list(SAMPLERS)}.")
    return Test(**{k: v if k in ("split", "dtype", "sampler") else number(v, f"{where}.{k}", 0 if k == "seed" else 1,
                                                                integer=True)
                   for k, v in value.items()})


def repo_root(folder: Path) -> Path:
    """The repository a study folder lives in (``docs/results/<study>`` by convention), else its parent."""
    folder = folder.resolve()
    for parent in (folder, *folder.parents):
        if (parent / ".git").exists() or (parent / "pyproject.toml").is_file():
            return parent
    return folder.parent


def key_path(folder: Path, key: str) -> str:
    return f"{folder / FILE}: {key}"


def number(value, where: str, low: float, integer: bool = False, high: float = math.inf):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (integer and int(value) != value):
        kind = "an integer" if integer else "a number"
        span = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise UsageError(f"{where} = {value!r}; it must be {kind} {span}.")
    return int(value) if integer else float(value)


def mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a mapping (key: value lines), got {type(value).__name__}.")
    return value


def contrast(value, where: str, arms: dict, primary: bool = False) -> tuple:
    """(endpoint, arm, minus) of a contrast; the primary may add ``alternative`` (read by :func:`alternative`)."""
    c = mapping(value, where)
    missing = {"endpoint", "arm", "minus"} - set(c)
    if missing or set(c) - {"endpoint", "arm", "minus", *(("alternative",) if primary else ())}:
        extra = ", alternative: greater|less (one-sided)" if primary else ""
        raise UsageError(f"{where} must be {{endpoint: E, arm: A, minus: B{extra}}}, got {c!r}.")
    if c["endpoint"] not in ENDPOINTS and not ("/" in c["endpoint"] or "@" in c["endpoint"]):
        raise UsageError(f"{where}.endpoint = {c['endpoint']!r}; use one of {ENDPOINTS} (or a per-kind key of a "
                         "record, such as guessable/modal_share).")
    for k in ("arm", "minus"):
        if c[k] not in arms:
            raise UsageError(f"{where}.{k} = {c[k]!r} is not an arm; the arms are {list(arms)}.")
    return c["endpoint"], c["arm"], c["minus"]


def alternative(value: dict, where: str) -> str:
    """The primary test's sides: two-sided unless the file says ``greater`` or ``less`` (a replication testing the
    direction an earlier study found)."""
    from .paired import ALTERNATIVES

    side = value.get("alternative", "two-sided")
    if side not in ALTERNATIVES:
        raise UsageError(f"{where}.alternative = {side!r}; use greater (the arm above minus) or less, one-sided, or "
                         "leave it out for a two-sided test.")
    return side


ARM_KEYS = {"recipe", "preset", "overrides", "task", "steps"}


def read_arm(name: str, spec, folder: Path, kind: str) -> Arm:
    """One arm of the file: a recipe and its overrides, or a harness preset (a measurement's: a task only)."""
    from ..data.tasks import get_task

    where = key_path(folder, f"arms.{name}")
    spec = mapping(spec, where)
    unknown = set(spec) - ARM_KEYS
    if kind == "measurement":
        if set(spec) != {"task"}:
            raise UsageError(f"{where} must be {{task: NAME}}: a measurement trains nothing.")
    elif unknown or ("recipe" in spec) == ("preset" in spec) or ("preset" in spec and "overrides" in spec):
        raise UsageError(f"{where} must be {{recipe: PATH, overrides: {{field: value}}}} or {{preset: SPEC}} (a "
                         "harness preset, amended as preset:field=value), with task: and steps: where the arm has its "
                         "own" + (f"; unknown keys {sorted(unknown)}" if unknown else "") + ".")
    if "recipe" in spec and not (repo_root(folder) / str(spec["recipe"])).is_file():
        raise UsageError(f"{where}.recipe = {spec['recipe']!r} is not a file (paths are relative to the "
                         f"repository root, {repo_root(folder)}).")
    if "preset" in spec:
        from .presets import parse_methods

        if not isinstance(spec["preset"], str) or "," in spec["preset"]:
            raise UsageError(f"{where}.preset = {spec['preset']!r}; name one preset, e.g. capo:tau=0.3.")
        parse_methods(spec["preset"], flag=f"{where}.preset")
    if "task" in spec:
        get_task(spec["task"], f"{where}.task")
    steps = number(spec["steps"], f"{where}.steps", 1, integer=True) if "steps" in spec else None
    return Arm(str(name), spec.get("recipe"), dict(mapping(spec.get("overrides") or {}, where)), spec.get("preset"),
               spec.get("task"), steps)


def read_arms(value, folder: Path, kind: str) -> dict:
    arms = {str(name): read_arm(str(name), spec, folder, kind)
            for name, spec in mapping(value, key_path(folder, "arms")).items()}
    if len(arms) < 1:
        raise UsageError(f"{key_path(folder, 'arms')} names no arm.")
    return arms


def check_presets(data: dict, arms: dict, folder: Path) -> dict | None:
    """A file with preset arms: its harness budget (known fields, values the harness takes) and a cannot_run."""
    presets = [a.name for a in arms.values() if a.preset]
    budget = data.get("budget")
    if not presets:
        if budget is not None:
            raise UsageError(f"{key_path(folder, 'budget')}: only arms with a preset train under a harness budget; "
                             "a recipe arm's settings are its recipe and overrides.")
        return None
    if budget is None or not data.get("cannot_run"):
        raise UsageError(f"{key_path(folder, 'arms')}: {presets} are harness presets, which the test-bed driver "
                         "trains with a budget: state it in budget: and say in cannot_run: how the runs were made "
                         "(capo-trl study runs recipe arms only).")
    from .presets import Budget, check_budget

    budget = mapping(budget, key_path(folder, "budget"))
    known = [f.name for f in dataclasses.fields(Budget) if f.name not in BUDGET_OWN]
    for key in budget:
        if key not in known:
            own = f" (the file's {BUDGET_OWN[key]}: key says it)" if BUDGET_OWN.get(key) else ""
            raise UsageError(f"{key_path(folder, f'budget.{key}')}: not a harness budget field{own}; the fields are "
                             f"{known}.")
    task = data.get("task") or next(a.task for a in arms.values() if a.task)
    try:  # steps, task and model are checked as the file's own keys
        check_budget(Budget(**budget, steps=1, task=task, model=None), start_model=False)  # status needs none
    except UsageError as err:
        raise UsageError(f"{key_path(folder, 'budget')}: {err}") from err
    return dict(budget)


_DECISION_KEYS = {"reference", "candidates", "max_accuracy_loss", "rank_by"}


def check_decision(decision: dict, arms: dict, where: str) -> None:
    """A pilot's decision rule names arms that exist, a margin >= 0 and endpoints a record has."""
    if set(decision) != _DECISION_KEYS:
        raise UsageError(f"{where} must have exactly {sorted(_DECISION_KEYS)}; it has {sorted(decision)}.")
    for name in [decision["reference"], *decision["candidates"]]:
        if name not in arms:
            raise UsageError(f"{where} names {name!r}, which is not an arm; the arms are {list(arms)}.")
    margin = decision["max_accuracy_loss"]
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin < 1:
        raise UsageError(f"{where}.max_accuracy_loss = {margin!r}; it must be a number in [0, 1).")
    bad = [k for k in decision["rank_by"] if k not in ENDPOINTS]
    if bad or not decision["rank_by"]:
        raise UsageError(f"{where}.rank_by = {decision['rank_by']!r}; use endpoints of {ENDPOINTS}.")
