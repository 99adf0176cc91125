"""A study is a file: ``study.yaml`` in the study's folder says everything its protocol fixes, and ``capo-trl study``
runs, queues, reports and closes it (``docs/studies.md``). The protocol's prose stays in ``protocol.md`` beside it.

The file (every key is checked when it is read; an error names the key and the fix)::

    question: Does CAPO keep pooled AUROC better than GRPO on my model?
    kind: confirmatory            # or pilot (exploratory: a decision rule, no test)
    model: smollm2-135m-instruct  # a short name (capo-trl fetch-model) or a path; omit for the recipe's
    task: addition                # capo_trl.data.tasks
    steps: 100
    arms:                         # in order; the first is the reference of the safety contrasts
      grpo: {recipe: examples/recipes/grpo-smollm2-135m-lora-cpu.yaml, overrides: {learning_rate: 3.0e-4}}
      capo: {recipe: examples/recipes/capo-smollm2-135m-lora-cpu.yaml, overrides: {learning_rate: 3.0e-4}}
    seeds: [200, 201, ...]        # run seed-major in this order
    test: {problems: 256, samples: 8, max_new_tokens: 32, seed: 0}
    primary: {endpoint: auroc, arm: capo, minus: grpo}
    secondaries: [{endpoint: auroc_question, arm: capo, minus: grpo}, ...]   # one Holm family, in order
    looks: [{seeds: 12, alpha: 0.05}]
    collapse: {mean_tokens: 30, min_finished: 0.5}
    undefined_auroc: 0.5
    deadline: 2027-01-15T00:00:00+00:00
    frozen_commit: null           # filled by `capo-trl study start`

Optional: ``train_log`` (the trainer's logged keys kept in each record), ``safety`` (endpoints compared with the
first arm), ``descriptive``, ``decision`` (a pilot's rule: :mod:`capo_trl.harness.study_report`), ``reuse`` (an arm's
records taken from another study's folder, with the reason), ``run_hours`` (one run's deadline), ``family_alpha``.
"""

from __future__ import annotations

import datetime
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UsageError
from .confirmatory import Plan

FILE = "study.yaml"
KINDS = ("pilot", "confirmatory")
ENDPOINTS = ("accuracy", "auroc", "auroc_question", "ece", "e_aurc", "finished_frac", "mean_tokens")
LOWER_IS_BETTER = ("ece", "e_aurc", "mean_tokens")
TRAIN_LOG = ("reward", "completions/mean_length", "completions/clipped_ratio", "grad_norm", "step_time",
             "capo/skipped_frac", "capo/auroc", "capo/tau", "capo/truncated_adv_share", "capo/truncated_adv_share_grpo",
             "capo/answered_truncated_frac")
KEYS = {"question", "kind", "model", "task", "steps", "arms", "seeds", "test", "primary", "secondaries", "looks",
         "collapse", "undefined_auroc", "deadline", "frozen_commit", "train_log", "safety", "descriptive", "decision",
         "reuse", "run_hours", "family_alpha", "other_commits"}


@dataclass(frozen=True)
class Arm:
    """One arm: a recipe (YAML, relative to the repository root) and the fields it overrides."""

    name: str
    recipe: str
    overrides: dict = field(default_factory=dict)

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


@dataclass(frozen=True)
class Study:
    folder: Path
    question: str
    kind: str
    task: str
    steps: int
    arms: dict
    seeds: list
    test: Test
    deadline: str
    model: str | None = None
    plan: Plan | None = None  # what the analysis tests (confirmatory), or the pilot's collapse rule
    decision: dict | None = None
    reuse: dict = field(default_factory=dict)  # arm -> {"folder": ..., "arm": ..., "why": ...}
    train_log: tuple = TRAIN_LOG
    run_hours: float = 6.0
    frozen_commit: str | None = None
    other_commits: str | None = None  # why runs may come from commits other than the frozen one (None: they may not)

    @property
    def name(self) -> str:
        return self.folder.name

    def own_arms(self) -> list[str]:
        """The arms this study runs (not those whose records it reuses)."""
        return [a for a in self.arms if a not in self.reuse]

    def record_path(self, arm: str, seed: int, into: Path | None = None) -> Path:
        """Where a run's record lives: this folder (or ``into``), or the reused study's folder."""
        if arm in self.reuse:
            source = self.reuse[arm]
            return repo_root(self.folder) / source["folder"] / source["arm"] / f"seed{seed}.json"
        return (into or self.folder) / arm / f"seed{seed}.json"


def repo_root(folder: Path) -> Path:
    """The repository a study folder lives in (``docs/results/<study>`` by convention), else its parent."""
    folder = folder.resolve()
    for parent in (folder, *folder.parents):
        if (parent / ".git").exists() or (parent / "pyproject.toml").is_file():
            return parent
    return folder.parent


def _where(folder: Path, key: str) -> str:
    return f"{folder / FILE}: {key}"


def _number(value, where: str, low: float, integer: bool = False, high: float = math.inf):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high or (integer and int(value) != value):
        kind = "an integer" if integer else "a number"
        span = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise UsageError(f"{where} = {value!r}; it must be {kind} {span}.")
    return int(value) if integer else float(value)


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a mapping (key: value lines), got {type(value).__name__}.")
    return value


def _contrast(value, where: str, arms: dict) -> tuple:
    c = _mapping(value, where)
    missing = {"endpoint", "arm", "minus"} - set(c)
    if missing or set(c) - {"endpoint", "arm", "minus"}:
        raise UsageError(f"{where} must be {{endpoint: E, arm: A, minus: B}}, got {c!r}.")
    if c["endpoint"] not in ENDPOINTS:
        raise UsageError(f"{where}.endpoint = {c['endpoint']!r}; use one of {ENDPOINTS}.")
    for k in ("arm", "minus"):
        if c[k] not in arms:
            raise UsageError(f"{where}.{k} = {c[k]!r} is not an arm; the arms are {list(arms)}.")
    return c["endpoint"], c["arm"], c["minus"]


def _arms(value, folder: Path) -> dict:
    arms = {}
    for name, spec in _mapping(value, _where(folder, "arms")).items():
        where = _where(folder, f"arms.{name}")
        spec = _mapping(spec, where)
        unknown = set(spec) - {"recipe", "overrides"}
        if unknown or "recipe" not in spec:
            raise UsageError(f"{where} must be {{recipe: PATH, overrides: {{field: value}}}}"
                             + (f"; unknown keys {sorted(unknown)}" if unknown else "; it has no recipe") + ".")
        if not (repo_root(folder) / spec["recipe"]).is_file():
            raise UsageError(f"{where}.recipe = {spec['recipe']!r} is not a file (paths are relative to the "
                             f"repository root, {repo_root(folder)}).")
        arms[str(name)] = Arm(str(name), spec["recipe"], dict(_mapping(spec.get("overrides") or {}, where)))
    if len(arms) < 1:
        raise UsageError(f"{_where(folder, 'arms')} names no arm.")
    return arms


def _check_checkpoints(arms: dict, folder: Path, steps: int, reused: dict) -> None:
    """Each run resumes from its checkpoints and its record reads the last one: every arm must save one at the end."""
    for arm in arms.values():
        if arm.name in reused:
            continue
        recipe = yaml.safe_load((repo_root(folder) / arm.recipe).read_text()) or {}
        settings = {**recipe, **arm.overrides}
        every = settings.get("save_steps", 500)
        if settings.get("save_strategy", "steps") != "steps" or not isinstance(every, int) or steps % every:
            raise UsageError(f"{_where(folder, f'arms.{arm.name}')}: its runs save no checkpoint at step {steps} "
                             f"(save_strategy {settings.get('save_strategy', 'steps')!r}, save_steps {every!r}); a "
                             "run resumes from its checkpoints and its record reads the last one, so add "
                             f"save_strategy: steps and a save_steps that divides {steps} to its overrides.")


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


def load_study(folder: str | Path) -> Study:
    """The study in ``folder`` (its ``study.yaml``), checked; a UsageError names the key and the fix."""
    folder = Path(folder)
    path = folder / FILE
    if not path.is_file():
        raise UsageError(f"{folder} has no {FILE}; a study is a folder with a {FILE} (docs/studies.md).")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from err
    data = _mapping(data, str(path))
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise UsageError(f"{path}: unknown keys {unknown}; the keys are {sorted(KEYS)}.")
    for key in ("question", "kind", "task", "steps", "arms", "seeds", "deadline"):
        if data.get(key) in (None, ""):
            raise UsageError(f"{_where(folder, key)} is missing; every study states it (docs/studies.md).")
    if data["kind"] not in KINDS:
        raise UsageError(f"{_where(folder, 'kind')} = {data['kind']!r}; use one of {KINDS}.")
    from ..data.tasks import get_task

    get_task(data["task"], f"{_where(folder, 'task')}")
    arms = _arms(data["arms"], folder)
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"{_where(folder, 'seeds')} must be a list of distinct integers, got {seeds!r}.")
    seeds = [_number(s, _where(folder, "seeds"), 0, integer=True) for s in seeds]
    test = Test(**{k: _number(v, _where(folder, f"test.{k}"), 1 if k != "seed" else 0, integer=True)
                   if k != "split" else v for k, v in _mapping(data.get("test") or {}, _where(folder, "test")).items()})
    try:
        deadline = datetime.datetime.fromisoformat(str(data["deadline"]))
    except ValueError as err:
        raise UsageError(f"{_where(folder, 'deadline')} = {data['deadline']!r}; write it as 2027-01-15T00:00:00+00:00.") \
            from err
    if deadline.tzinfo is None:
        raise UsageError(f"{_where(folder, 'deadline')} = {data['deadline']!r} has no time zone; add +00:00.")
    reuse = {}
    for arm, spec in _mapping(data.get("reuse") or {}, _where(folder, "reuse")).items():
        where = _where(folder, f"reuse.{arm}")
        spec = _mapping(spec, where)
        if arm not in arms or set(spec) != {"folder", "arm", "why"}:
            raise UsageError(f"{where} must name an arm and be {{folder: docs/results/OTHER, arm: NAME, why: TEXT}}.")
        reuse[arm] = dict(spec)
    _check_checkpoints(arms, folder, int(data["steps"]), reuse)
    collapse = _mapping(data.get("collapse") or {}, _where(folder, "collapse"))
    tokens = _number(collapse.get("mean_tokens", math.inf), _where(folder, "collapse.mean_tokens"), 1) \
        if "mean_tokens" in collapse else math.inf
    finished = _number(collapse.get("min_finished", 0.0), _where(folder, "collapse.min_finished"), 0, high=1)
    undefined = data.get("undefined_auroc")
    if undefined is not None:
        undefined = _number(undefined, _where(folder, "undefined_auroc"), 0, high=1)
    plan = _plan(data, folder, arms, tokens, finished, undefined, deadline.isoformat())
    decision = data.get("decision")
    if data["kind"] == "pilot" and decision is not None:
        check_decision(_mapping(decision, _where(folder, "decision")), arms, _where(folder, "decision"))
    return Study(folder=folder, question=str(data["question"]), kind=data["kind"], task=data["task"],
                 steps=_number(data["steps"], _where(folder, "steps"), 1, integer=True), arms=arms, seeds=seeds,
                 test=test, deadline=deadline.isoformat(), model=data.get("model"), plan=plan, decision=decision,
                 reuse=reuse, train_log=tuple(data.get("train_log") or TRAIN_LOG),
                 run_hours=_number(data.get("run_hours", 6.0), _where(folder, "run_hours"), 0.01),
                 frozen_commit=data.get("frozen_commit"), other_commits=data.get("other_commits"))


def _plan(data: dict, folder: Path, arms: dict, tokens: float, finished: float, undefined, deadline: str) -> Plan:
    """The analysis the file fixes, as :class:`~capo_trl.harness.confirmatory.Plan` (a pilot: its collapse rule)."""
    first = next(iter(arms))
    if data["kind"] == "pilot":
        return Plan(arms={a: a for a in arms}, primary=("auroc", first, first), looks=((len(data["seeds"]), 1.0),),
                    secondaries=(), deadline=deadline, collapse_tokens=tokens, min_finished=finished,
                    undefined_auroc=undefined)
    if data.get("primary") is None or data.get("looks") is None:
        raise UsageError(f"{_where(folder, 'primary')} and looks: a confirmatory study fixes its primary contrast "
                         "and its looks ([{seeds: N, alpha: A}]) before its first run.")
    primary = _contrast(data["primary"], _where(folder, "primary"), arms)
    secondaries = tuple(_contrast(c, _where(folder, f"secondaries[{i}]"), arms)
                        for i, c in enumerate(data.get("secondaries") or []))
    looks = []
    for i, look in enumerate(data["looks"] if isinstance(data["looks"], list) else [None]):
        where = _where(folder, f"looks[{i}]")
        look = _mapping(look, where)
        looks.append((_number(look.get("seeds"), f"{where}.seeds", 2, integer=True),
                      _number(look.get("alpha"), f"{where}.alpha", 1e-9, high=1)))
    if [n for n, _ in looks] != sorted({n for n, _ in looks}) or looks[-1][0] > len(data["seeds"]):
        raise UsageError(f"{_where(folder, 'looks')}: the looks' seeds must rise and the last ({looks[-1][0]}) be at "
                         f"most the {len(data['seeds'])} seeds listed.")
    extra = {k: tuple(data[k]) for k in ("safety", "descriptive") if data.get(k) is not None}
    return Plan(arms={a: a for a in arms}, primary=primary, looks=tuple(looks), secondaries=secondaries,
                deadline=deadline, family_alpha=_number(data.get("family_alpha", 0.05), _where(folder, "family_alpha"),
                                                        1e-9, high=1),
                collapse_tokens=tokens, min_finished=finished, undefined_auroc=undefined, **extra)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


CODE = Path(__file__).resolve().parents[3]  # the checkout this capo_trl is imported from (when it is one)


def code_version() -> tuple[str | None, str | None]:
    """The commit of the capo_trl being run and the tree of its ``src/`` (None, None when it is not a git checkout
    or its ``src/`` has uncommitted changes). Two commits with the same ``src/`` run the same code."""
    if _git(CODE, "status", "--porcelain", "--", "src") != "":
        return None, None
    return _git(CODE, "rev-parse", "HEAD"), _git(CODE, "rev-parse", "HEAD:src")


def frozen_tree(commit: str) -> str | None:
    """The ``src/`` tree of a study's frozen commit, looked up in the running code's repository."""
    return _git(CODE, "rev-parse", f"{commit}:src")


def start(folder: str | Path) -> str:
    """Freeze a study: refuse a dirty tree, write its commit into ``frozen_commit`` (the team then commits that)."""
    study = load_study(folder)
    root = repo_root(study.folder)
    status = _git(root, "status", "--porcelain")
    if status is None:
        raise UsageError(f"{root} is not a git checkout; a study freezes the commit its runs use.")
    if status:
        raise UsageError(f"the tree at {root} has uncommitted changes; commit the protocol and study.yaml first, so "
                         "the frozen commit holds them:\n" + status[:500])
    if study.frozen_commit:
        raise UsageError(f"{_where(study.folder, 'frozen_commit')} is already {study.frozen_commit}; a study is "
                         "started once.")
    commit = _git(root, "rev-parse", "HEAD")
    path = study.folder / FILE
    text = path.read_text()
    lines = [f"frozen_commit: {commit}" if line.startswith("frozen_commit:") else line for line in text.splitlines()]
    if not any(line.startswith("frozen_commit:") for line in text.splitlines()):
        lines.append(f"frozen_commit: {commit}")
    path.write_text("\n".join(lines) + "\n")
    return commit
