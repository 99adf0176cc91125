"""A pilot's criterion: checks of each run against the start model, and the decisions they make, as a study file
fixes them (``criterion:`` in ``study.yaml``; :mod:`capo_trl.harness.study`)::

    criterion:
      start: start.json            # the start model's record, relative to the study's folder ({task}: the arm's
                                   # task; FILE#KEY.KEY reads a record inside a JSON file)
      arms: [grpo]                 # the arms it checks (default: all); seeds: [0, 1, 2] likewise
      checks:                      # name: check, in this order; each is true or false for one run
        accuracy_rises: {endpoint: accuracy, change: 0.02}     # end - start >= 0.02
        auroc_falls: {endpoint: auroc, change: -0.03}          # start - end >= 0.03
        e_aurc_rises: {endpoint: e_aurc, ratio: 1.25}          # end >= 1.25 x start
        short: {endpoint: mean_tokens, at_most: 30}            # end <= 30 (at_least: end >= the value)
        collapsed: {rule: collapse}                            # the file's collapse rule
        trains: {all: [accuracy_rises, not collapsed]}         # earlier checks (or inline ones), all true
      required: [accuracy_rises, auroc_falls, e_aurc_rises]    # a run meets the criterion when all of these hold;
                                                               # an arm, when every seed has run and met it
      decisions:                   # each true when all its conditions hold, once every checked run has finished
        candidate: [{arm: capo, check: collapsed, seeds: none}, {arm: grpo, check: trains, seeds: all}]

A value that is missing or not a number (an undefined AUROC) fails every check that reads it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import UsageError

FORMS = ("change", "ratio", "at_most", "at_least")
KEYS = {"start", "arms", "seeds", "checks", "required", "decisions"}


def _bad(where: str, value, why: str) -> UsageError:
    return UsageError(f"{where} = {value!r}: {why}")


def _check_one(spec, where: str, earlier: list[str], endpoints: tuple) -> None:
    """One check: a comparison with the start model, the collapse rule, or several checks that must all hold."""
    if isinstance(spec, str):  # inside all: an earlier check's name, or "not NAME"
        name = spec.removeprefix("not ")
        if name not in earlier:
            raise _bad(where, spec, f"name a check listed before it ({earlier or 'none yet'}), or 'not NAME'.")
        return
    if not isinstance(spec, dict):
        raise _bad(where, spec, "a check is a mapping: {endpoint: E, change: D}, {rule: collapse} or {all: [...]}.")
    if set(spec) == {"rule"}:
        if spec["rule"] != "collapse":
            raise _bad(f"{where}.rule", spec["rule"], "the one rule is collapse (the file's collapse: key).")
        return
    if set(spec) == {"all"}:
        if not isinstance(spec["all"], list) or not spec["all"]:
            raise _bad(f"{where}.all", spec["all"], "list the checks that must all hold.")
        for i, item in enumerate(spec["all"]):
            _check_one(item, f"{where}.all[{i}]", earlier, endpoints)
        return
    forms = [f for f in FORMS if f in spec]
    if set(spec) != {"endpoint", *forms} or len(forms) != 1:
        raise _bad(where, spec, f"write {{endpoint: E, F: number}} with F one of {FORMS}, {{rule: collapse}} or "
                                "{all: [...]}.")
    if spec["endpoint"] not in endpoints:
        raise _bad(f"{where}.endpoint", spec["endpoint"], f"use one of {endpoints}.")
    value = spec[forms[0]]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or \
            (forms[0] == "change" and value == 0):
        raise _bad(f"{where}.{forms[0]}", value, "it must be a number" + (" other than 0 (its sign says up or down)"
                                                                          if forms[0] == "change" else "") + ".")


def check_criterion(spec, where: str, arms: list[str], seeds: list[int], endpoints: tuple) -> dict:
    """The ``criterion`` mapping, checked: a UsageError names the key and the fix."""
    if not isinstance(spec, dict):
        raise _bad(where, spec, "the criterion is a mapping (start, checks, required, decisions).")
    unknown = sorted(set(spec) - KEYS)
    if unknown or "checks" not in spec or "start" not in spec:
        raise UsageError(f"{where} must have start and checks (and may have {sorted(KEYS - {'start', 'checks'})})"
                         + (f"; unknown keys {unknown}" if unknown else "") + ".")
    if not isinstance(spec["start"], str) or not spec["start"]:
        raise _bad(f"{where}.start", spec["start"], "the start model's record, a path relative to the study folder.")
    for key, known in (("arms", arms), ("seeds", seeds)):
        bad = [x for x in spec.get(key) or [] if x not in known]
        if bad or (key in spec and not spec[key]):
            raise _bad(f"{where}.{key}", spec[key], f"list some of the study's {key} {known}.")
    checks = spec["checks"]
    if not isinstance(checks, dict) or not checks:
        raise _bad(f"{where}.checks", checks, "a mapping of name: check, in order.")
    for i, (name, check) in enumerate(checks.items()):
        _check_one(check, f"{where}.checks.{name}", list(checks)[:i], endpoints)
    required = spec.get("required") or []
    if not isinstance(required, list) or any(name not in checks for name in required):
        raise _bad(f"{where}.required", spec.get("required"), f"list names of its checks {list(checks)}.")
    decisions = spec.get("decisions") or {}
    if not isinstance(decisions, dict):
        raise _bad(f"{where}.decisions", decisions, "a mapping of name: [conditions].")
    for name, conditions in decisions.items():
        at = f"{where}.decisions.{name}"
        if not isinstance(conditions, list) or not conditions:
            raise _bad(at, conditions, "a list of {arm: A, check: C, seeds: all|none}.")
        for i, c in enumerate(conditions):
            if not isinstance(c, dict) or set(c) != {"arm", "check", "seeds"} or c["seeds"] not in ("all", "none") \
                    or c["arm"] not in (spec.get("arms") or arms) or c["check"] not in checks:
                raise _bad(f"{at}[{i}]", c, f"write {{arm: A, check: C, seeds: all|none}} (the check holds on every seed, "
                                            f"or on none) with A a checked arm and C one of {list(checks)}.")
    return spec


def start_record(folder: Path, spec: str, task: str) -> dict:
    """The start model's record the criterion names (``FILE`` or ``FILE#KEY.KEY``, ``{task}`` filled in)."""
    path, _, keys = spec.format(task=task).partition("#")
    found = json.loads((folder / path).read_text())
    for key in filter(None, keys.split(".")):
        found = found[key]
    return found


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    return float(value) if ok else None


def holds(spec, rec: dict, start: dict, done: dict, collapsed) -> bool:
    """One check on one run (``done``: the earlier checks' results; ``collapsed``: the file's collapse rule)."""
    if isinstance(spec, str):
        return not done[spec[4:]] if spec.startswith("not ") else done[spec]
    if "rule" in spec:
        return bool(collapsed(rec))
    if "all" in spec:
        return all(holds(item, rec, start, done, collapsed) for item in spec["all"])
    end, begin = _number(rec.get(spec["endpoint"])), _number(start.get(spec["endpoint"]))
    if end is None or (begin is None and ("change" in spec or "ratio" in spec)):
        return False
    if "change" in spec:
        direction = 1 if spec["change"] > 0 else -1
        return direction * (end - begin) >= abs(spec["change"]) - 1e-12
    if "ratio" in spec:
        return end >= spec["ratio"] * begin
    return end <= spec["at_most"] if "at_most" in spec else end >= spec["at_least"]


def evaluate(spec: dict, runs: dict, starts: dict, collapsed, seeds: list) -> dict:
    """The criterion over ``runs[arm][seed]`` (finished records) with ``starts[arm]`` (each arm's start record):
    per run its checks in order and ``required_met``; per arm whether it is complete and meets the criterion
    (every seed run, every run meeting it); the decisions, once every checked run has finished (else None)."""
    arms, seeds = list(spec.get("arms") or runs), list(spec.get("seeds") or seeds)
    per_run, meets, complete = {}, {}, {}
    for arm in arms:
        per_run[arm] = {}
        for seed in seeds:
            if seed not in runs[arm]:
                continue
            done: dict = {}
            for name, check in spec["checks"].items():
                done[name] = holds(check, runs[arm][seed], starts[arm], done, collapsed)
            per_run[arm][seed] = {**done, "required_met": all(done[name] for name in spec.get("required") or [])}
        complete[arm] = len(per_run[arm]) == len(seeds)
        meets[arm] = complete[arm] and all(r["required_met"] for r in per_run[arm].values())
    decided = None
    if all(complete.values()):
        def met(c):
            values = [per_run[c["arm"]][s][c["check"]] for s in seeds]
            return all(values) if c["seeds"] == "all" else not any(values)
        decided = {name: all(met(c) for c in conditions) for name, conditions in (spec.get("decisions") or {}).items()}
    return {"seeds": seeds, "runs": per_run, "complete": complete, "meets": meets, "decided": decided}
