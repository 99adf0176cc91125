"""A study is a file: ``study.yaml`` in the study's folder says everything its protocol fixes, and ``capo-trl study``
runs, queues, reports and closes it (``docs/studies.md``). The protocol's prose stays in ``protocol.md`` beside it.

The file (every key is checked when it is read; an error names the key and the fix)::

    question: Does CAPO keep pooled AUROC better than GRPO on my model?
    kind: confirmatory            # or pilot (exploratory: a decision rule, no test), or measurement (below)
    model: smollm2-135m-instruct  # a short name (capo-trl fetch-model) or a path; omit for the recipe's
    task: addition                # capo_trl.data.tasks
    steps: 100
    arms:                         # in order; the first is the reference of the safety contrasts
      grpo: {recipe: examples/recipes/grpo-smollm2-135m-lora-cpu.yaml, overrides: {learning_rate: 3.0e-4}}
      capo: {recipe: examples/recipes/capo-smollm2-135m-lora-cpu.yaml, overrides: {learning_rate: 3.0e-4}}
    seeds: [200, 201, ...]        # run seed-major in this order
    test: {problems: 256, samples: 8, max_new_tokens: 32, seed: 0}
    primary: {endpoint: auroc, arm: capo, minus: grpo}   # alternative: greater|less makes it one-sided
    secondaries: [{endpoint: auroc_question, arm: capo, minus: grpo}, ...]   # one Holm family, in order
    looks: [{seeds: 12, alpha: 0.05}]
    collapse: {mean_tokens: 30, min_finished: 0.5}
    undefined_auroc: 0.5
    deadline: 2027-01-15T00:00:00+00:00
    # frozen: {...}               # written by `capo-trl study start` (capo_trl.harness.study_freeze)

Optional: ``train_log`` (the trainer's logged keys kept in each record), ``safety`` (endpoints compared with the
first arm), ``descriptive``, ``decision`` (a pilot's rule: :mod:`capo_trl.harness.study_report`), ``reuse`` (an arm's
records taken from another study's folder, with the reason; with ``seeds``, only those seeds' records, and this
study runs the arm's other seeds itself), ``run_hours`` (one run's deadline), ``family_alpha``,
``other_commits`` (why runs may come from other code), and:

- ``records``: where a run's record lies in the folder, ``{arm}/seed{seed}.json`` by default (``{task}``: the arm's
  task); a pattern must tell every run of the study apart.
- an arm's ``task`` and ``steps``: the arm's own, where they differ from the study's (then the study's ``task`` or
  ``steps`` may be left out when every arm has its own).
- an arm's ``preset`` instead of a recipe: a method of the harness (``capo_trl.harness.presets``, amended as
  ``preset:field=value``), trained by the test-bed driver (``python -m capo_trl.harness.testbed``) with the file's
  ``budget`` (the fields of ``capo_trl.harness.presets.Budget`` other than steps, task and model). ``capo-trl study``
  runs recipes only, so such a file says in ``cannot_run`` how its runs were made.
- ``cannot_run``: why today's runner cannot run the study (its frozen commit predates ``capo-trl study``, its arms
  are presets, its records are of another form, ...) and what ran it; ``run``, ``queue`` and ``start`` then refuse
  with this text, while ``status`` and ``report`` read its records as usual.
- ``criterion``: a pilot's checks of each run against the start model and the decisions they make
  (:mod:`capo_trl.harness.criterion`).
- ``deadline: null``: a pilot whose protocol set no date.

``kind: measurement`` is a folder of measurements without training (a start model tested): its ``arms`` name only a
task each (``{task: addition}``), it has no seeds, steps or analysis, and its ``cannot_run`` says what made its files.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UsageError
from .criterion import check_criterion
from .study_freeze import read_frozen
from .study_keys import (ENDPOINTS, FILE, Arm, Plan, Test, alternative, check_decision, check_presets,
                         contrast, key_path, mapping, names, number, read_arms, read_test, repo_root)

KINDS = ("pilot", "confirmatory", "measurement")
TRAIN_LOG = ("reward", "completions/mean_length", "completions/clipped_ratio", "grad_norm", "step_time",
             "capo/skipped_frac", "capo/auroc", "capo/tau", "capo/truncated_adv_share", "capo/truncated_adv_share_grpo",
             "capo/answered_truncated_frac")
KEYS = {"question", "kind", "model", "task", "steps", "arms", "seeds", "test", "primary", "secondaries", "looks",
        "collapse", "undefined_auroc", "deadline", "frozen_commit", "train_log", "safety", "descriptive", "decision",
        "reuse", "run_hours", "family_alpha", "other_commits", "records", "budget", "cannot_run", "criterion", "frozen"}
RECORDS = "{arm}/seed{seed}.json"


@dataclass(frozen=True)
class Study:
    folder: Path
    question: str
    kind: str
    task: str | None
    steps: int | None
    arms: dict
    seeds: list
    test: Test
    deadline: str | None
    model: str | None = None
    plan: Plan | None = None  # what the analysis tests (confirmatory), or the pilot's collapse rule
    decision: dict | None = None
    reuse: dict = field(default_factory=dict)  # arm -> {"folder": ..., "arm": ..., "why": ...}
    train_log: tuple = TRAIN_LOG
    run_hours: float = 6.0
    frozen_commit: str | None = None  # the commit of the study's repository it was frozen at
    frozen: dict | None = None  # what `capo-trl study start` froze (capo_trl.harness.study_freeze); None: older files
    other_commits: str | None = None  # why runs may come from commits other than the frozen one (None: they may not)
    records: str = RECORDS
    budget: dict | None = None  # the harness budget of preset arms
    cannot_run: str | None = None  # why capo-trl study cannot run it (None: it can)
    criterion: dict | None = None

    @property
    def name(self) -> str:
        return self.folder.name

    def reused(self, arm: str, seed: int | None) -> bool:
        """Whether this run's record is another study's (its arm is reused, for every seed or for this one)."""
        spec = self.reuse.get(arm)
        return spec is not None and ("seeds" not in spec or seed in spec["seeds"])

    def own_runs(self) -> list[tuple[str, int | None]]:
        """The runs this study makes itself, seed-major, arms in the file's order."""
        return [(arm, seed) for seed in (self.seeds or [None]) for arm in self.arms if not self.reused(arm, seed)]

    def own_arms(self) -> list[str]:
        """The arms this study runs, for some seeds at least (not those whose records it reuses for every seed)."""
        own = {arm for arm, _ in self.own_runs()}
        return [a for a in self.arms if a in own]

    def arm_task(self, arm: str) -> str:
        return self.arms[arm].task or self.task

    def arm_steps(self, arm: str) -> int:
        return self.arms[arm].steps or self.steps

    def record_path(self, arm: str, seed: int | None, into: Path | None = None) -> Path:
        """Where a run's record lives: this folder (or ``into``), or the reused study's folder."""
        if self.reused(arm, seed):
            source = repo_root(self.folder) / self.reuse[arm]["folder"]
            return source / records_pattern(source).format(arm=self.reuse[arm]["arm"], seed=seed,
                                                           task=self.arm_task(arm))
        return (into or self.folder) / self.records.format(arm=arm, seed=seed, task=self.arm_task(arm))


def records_pattern(folder: Path) -> str:
    """Where another study's folder keeps its records (its file's ``records``, read without the other checks)."""
    path = folder / FILE
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return (data or {}).get("records") or RECORDS


def _check_checkpoints(arms: dict, folder: Path, steps: int | None, reused: dict) -> None:
    """Each run resumes from its checkpoints and its record reads the last one: every arm must save one at the end."""
    for arm in arms.values():
        if (arm.name in reused and "seeds" not in reused[arm.name]) or arm.recipe is None:
            continue
        recipe = yaml.safe_load((repo_root(folder) / arm.recipe).read_text()) or {}
        settings = {**recipe, **arm.overrides}
        every, last = settings.get("save_steps", 500), arm.steps or steps
        if settings.get("save_strategy", "steps") != "steps" or not isinstance(every, int) or last % every:
            raise UsageError(f"{key_path(folder, f'arms.{arm.name}')}: its runs save no checkpoint at step {last} "
                             f"(save_strategy {settings.get('save_strategy', 'steps')!r}, save_steps {every!r}); a "
                             "run resumes from its checkpoints and its record reads the last one, so add "
                             f"save_strategy: steps and a save_steps that divides {last} to its overrides.")


def _check_records(pattern, study: Study) -> None:
    """A pattern with known placeholders, relative, that tells every run apart."""
    where = key_path(study.folder, "records")
    names = set(re.findall(r"{(\w*)}", pattern)) if isinstance(pattern, str) else {None}
    if not isinstance(pattern, str) or names - {"arm", "seed", "task"} or pattern.startswith("/") or \
            ".." in pattern.split("/") or not pattern.endswith(".json"):
        raise UsageError(f"{where} = {pattern!r}; write a path relative to the study's folder ending in .json, with "
                         "{arm}, {seed} and {task} where they vary (e.g. {arm}/seed{seed}.json).")
    paths = [study.record_path(arm, seed) for arm, seed in study.own_runs()]
    if len(set(paths)) != len(paths):
        raise UsageError(f"{where} = {pattern!r} gives two runs the same record; add {{arm}} or {{seed}}.")


def _read(folder: Path) -> dict:
    """The file's mapping, with its kind and required keys checked."""
    path = folder / FILE
    if not path.is_file():
        raise UsageError(f"{folder} has no {FILE}; a study is a folder with a {FILE} (docs/studies.md).")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from err
    data = mapping(data, str(path))
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise UsageError(f"{path}: unknown keys {unknown}; the keys are {sorted(KEYS)}.")
    if data.get("kind") not in KINDS:
        raise UsageError(f"{key_path(folder, 'kind')} = {data.get('kind')!r}; use one of {KINDS}.")
    measured = data["kind"] == "measurement"
    for key in ("question", "arms", *(("cannot_run",) if measured else ("seeds",))):
        if data.get(key) in (None, ""):
            raise UsageError(f"{key_path(folder, key)} is missing; every {'measurement' if measured else 'study'} "
                             "states it (docs/studies.md).")
    if "deadline" not in data or (data["deadline"] is None and data["kind"] == "confirmatory"):
        raise UsageError(f"{key_path(folder, 'deadline')} is missing; every study states it (a pilot or measurement "
                         "whose protocol set none: deadline: null).")
    if measured and set(data) & {"seeds", "steps", "primary", "looks", "secondaries", "decision", "criterion"}:
        raise UsageError(f"{path}: a measurement trains nothing, so it has no seeds, steps or analysis; its keys are "
                         "question, kind, model, arms (a task each), test, records, cannot_run, deadline.")
    return data


def _deadline(value, folder: Path) -> str | None:
    if value is None:
        return None
    try:
        deadline = datetime.datetime.fromisoformat(str(value))
    except ValueError as err:
        raise UsageError(f"{key_path(folder, 'deadline')} = {value!r}; write it as 2027-01-15T00:00:00+00:00.") from err
    if deadline.tzinfo is None:
        raise UsageError(f"{key_path(folder, 'deadline')} = {value!r} has no time zone; add +00:00.")
    return deadline.isoformat()


def _reuse(value, folder: Path, arms: dict, seeds: list) -> dict:
    """An arm's records taken from another study's folder (``reuse``), checked."""
    reuse = {}
    for arm, spec in mapping(value or {}, key_path(folder, "reuse")).items():
        where = key_path(folder, f"reuse.{arm}")
        spec = mapping(spec, where)
        if arm not in arms or not {"folder", "arm", "why"} <= set(spec) <= {"folder", "arm", "why", "seeds"}:
            raise UsageError(f"{where} must name an arm and be {{folder: docs/results/OTHER, arm: NAME, why: TEXT}}, "
                             "with seeds: [...] when only some seeds' records are reused.")
        chosen = spec.get("seeds")
        if "seeds" in spec and (not isinstance(chosen, list) or not chosen or len(set(chosen)) != len(chosen) or
                                not set(chosen) <= set(seeds)):
            raise UsageError(f"{where}.seeds = {chosen!r}; list distinct seeds of the study's seeds "
                             "(or leave the key out to reuse every seed).")
        reuse[arm] = dict(spec)
    return reuse


def _texts(data: dict, folder: Path) -> None:
    """The keys that hold a commit or words: each a non-empty string where given."""
    for key in ("frozen_commit", "other_commits", "cannot_run"):
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key].strip()):
            fix = {"frozen_commit": "`capo-trl study start` writes what it freezes (a frozen: block now).",
                   "other_commits": "say in words why runs may come from other code (or leave the key out).",
                   "cannot_run": "say in words why capo-trl study cannot run the study and what ran it (or leave the "
                                 "key out)."}[key]
            raise UsageError(f"{key_path(folder, key)} = {data[key]!r}; {fix}")


def _collapse(data: dict, folder: Path) -> tuple:
    collapse = mapping(data.get("collapse") or {}, key_path(folder, "collapse"))
    tokens = number(collapse["mean_tokens"], key_path(folder, "collapse.mean_tokens"), 1) \
        if "mean_tokens" in collapse else math.inf
    finished = number(collapse.get("min_finished", 0.0), key_path(folder, "collapse.min_finished"), 0, high=1)
    undefined = data.get("undefined_auroc")
    if undefined is not None:
        undefined = number(undefined, key_path(folder, "undefined_auroc"), 0, high=1)
    return tokens, finished, undefined


def load_study(folder: str | Path) -> Study:
    """The study in ``folder`` (its ``study.yaml``), checked; a UsageError names the key and the fix."""
    folder = Path(folder)
    data = _read(folder)
    kind = data["kind"]
    measured = kind == "measurement"
    arms = read_arms(data["arms"], folder, kind)
    for key in ("task", "steps"):
        if data.get(key) in (None, "") and not measured and not all(getattr(a, key) for a in arms.values()):
            raise UsageError(f"{key_path(folder, key)} is missing; every study states it (or every arm its own).")
    if data.get("task"):
        from ..data.tasks import get_task

        get_task(data["task"], f"{key_path(folder, 'task')}")
    seeds = data.get("seeds") or []
    if not measured and (not isinstance(seeds, list) or len(set(seeds)) != len(seeds)):
        raise UsageError(f"{key_path(folder, 'seeds')} must be a list of distinct integers, got {seeds!r}.")
    seeds = [number(s, key_path(folder, "seeds"), 0, integer=True) for s in seeds]
    budget = check_presets(data, arms, folder)
    deadline = _deadline(data["deadline"], folder)
    reuse = _reuse(data.get("reuse"), folder, arms, seeds)
    steps = number(data["steps"], key_path(folder, "steps"), 1, integer=True) if data.get("steps") is not None else None
    _check_checkpoints(arms, folder, steps, reuse)
    _texts(data, folder)
    frozen = read_frozen(data["frozen"], key_path(folder, "frozen")) if data.get("frozen") is not None else None
    plan = None if measured else _plan(data, folder, arms, seeds, *_collapse(data, folder), deadline)
    if kind == "pilot" and data.get("decision") is not None:
        check_decision(mapping(data["decision"], key_path(folder, "decision")), arms, key_path(folder, "decision"))
    criterion = data.get("criterion")
    if criterion is not None:
        criterion = check_criterion(criterion, key_path(folder, "criterion"), list(arms), seeds, ENDPOINTS)
    train_log = names(data["train_log"], key_path(folder, "train_log"), metrics=False) \
        if data.get("train_log") is not None else TRAIN_LOG
    study = Study(folder=folder, question=str(data["question"]), kind=kind, task=data.get("task"), steps=steps,
                  arms=arms, seeds=seeds, test=read_test(data.get("test"), key_path(folder, "test")),
                  deadline=deadline, model=data.get("model"), plan=plan, decision=data.get("decision"), reuse=reuse,
                  train_log=train_log,
                  run_hours=number(data.get("run_hours", 6.0), key_path(folder, "run_hours"), 0.01),
                  frozen_commit=data.get("frozen_commit") or (frozen or {}).get("commit"), frozen=frozen,
                  other_commits=data.get("other_commits"), records=data.get("records") or RECORDS, budget=budget,
                  cannot_run=data.get("cannot_run"), criterion=criterion)
    _check_records(study.records, study)
    return study


def _plan(data: dict, folder: Path, arms: dict, seeds: list, tokens: float, finished: float, undefined,
          deadline: str | None) -> Plan:
    """The analysis the file fixes, as a :class:`Plan` (a pilot: its collapse rule)."""
    first = next(iter(arms))
    labels = {a: arm.label for a, arm in arms.items()}
    extra = {k: names(data[k], key_path(folder, k)) for k in ("safety", "descriptive") if data.get(k) is not None}
    if data["kind"] == "pilot":
        return Plan(arms=labels, primary=("auroc", first, first), looks=((len(seeds), 1.0),),
                    secondaries=(), deadline=deadline, collapse_tokens=tokens, min_finished=finished,
                    undefined_auroc=undefined, **extra)
    if data.get("primary") is None or data.get("looks") is None:
        raise UsageError(f"{key_path(folder, 'primary')} and looks: a confirmatory study fixes its primary contrast "
                         "and its looks ([{seeds: N, alpha: A}]) before its first run.")
    primary = contrast(data["primary"], key_path(folder, "primary"), arms, primary=True)
    secondaries = tuple(contrast(c, key_path(folder, f"secondaries[{i}]"), arms)
                        for i, c in enumerate(data.get("secondaries") or []))
    looks = []
    for i, look in enumerate(data["looks"] if isinstance(data["looks"], list) else [None]):
        where = key_path(folder, f"looks[{i}]")
        look = mapping(look, where)
        looks.append((number(look.get("seeds"), f"{where}.seeds", 2, integer=True),
                      number(look.get("alpha"), f"{where}.alpha", 1e-9, high=1)))
    if [n for n, _ in looks] != sorted({n for n, _ in looks}) or looks[-1][0] > len(seeds):
        raise UsageError(f"{key_path(folder, 'looks')}: the looks' seeds must rise and the last ({looks[-1][0]}) be at "
                         f"most the {len(seeds)} seeds listed.")
    return Plan(arms=labels, primary=primary, looks=tuple(looks), secondaries=secondaries,
                deadline=deadline, family_alpha=number(data.get("family_alpha", 0.05), key_path(folder, "family_alpha"),
                                                        1e-9, high=1),
                collapse_tokens=tokens, min_finished=finished, undefined_auroc=undefined,
                alternative=alternative(data["primary"], key_path(folder, "primary")), **extra)


def refuse_unrunnable(study: Study, verb: str) -> None:
    """``capo-trl study start``, ``run`` and ``queue`` refuse a study whose file says today's runner cannot run it."""
    if study.cannot_run:
        raise UsageError(f"{study.folder / FILE} says capo-trl study cannot {verb} it (cannot_run): "
                         f"{' '.join(study.cannot_run.split())}")


__all__ = ["ENDPOINTS", "FILE", "KEYS", "KINDS", "TRAIN_LOG", "Arm", "Plan", "Study", "Test", "load_study",
           "refuse_unrunnable", "repo_root"]
