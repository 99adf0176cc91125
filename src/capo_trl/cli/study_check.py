"""Before a study's first run: can its arms learn at all? (``capo-trl study check``; ``start`` and ``queue`` run it.)

A study whose runs cannot learn costs its whole budget and reports nothing: every group of samples ties, so GRPO's
and CAPO's advantages are all 0, and every arm ends where it started. Each distinct setting of the study's arms (its
model, task and sampling, as ``capo-trl train`` reads the recipe, overrides and study keys) is checked once, in one
line each when it fails, with the fix:

- the model is the embedded start model of another task than the arm's (made for that task alone);
- the model cannot load, or the task's prompts do not fit (its context, ``max_prompt_length``);
- on a small sample of the train split (:data:`PROMPTS` prompts, ``num_generations`` samples each, the recipe's
  temperature and length), at most one group in :data:`MIN_SIGNAL` has samples of both grades: no learning signal.

What passed is kept in the runs folder (``<study>/check.json``, keyed by the study file, recipes and capo-trl), so a
queue restarted on the same machine does not sample again.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import yaml

from .. import __version__
from ..errors import UsageError
from ..harness.study_freeze import code_version, digest, recipe_digests, study_digest
from ..harness.study_keys import FILE, key_path, repo_root

PROMPTS = 32  # train prompts sampled per setting
MIN_SIGNAL = 16  # a study whose sampled groups have a learning signal in fewer than 1 in this many is refused


def _settings(study, arm: str):
    """(script_args, training_args, model_args) of ``arm`` as ``capo-trl train`` reads them in a run."""
    from .train_args import parse_args

    spec, root = study.arms[arm], repo_root(study.folder)
    argv = ["--config", str(root / spec.recipe), "--dataset_name", study.arm_task(arm), "--max_steps",
            str(study.arm_steps(arm)), "--output_dir", str(root / "runs" / "check")]
    if study.model:
        argv += ["--model_name_or_path", study.model]
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():  # its notes are for a run's log
        warnings.simplefilter("ignore")
        return parse_args(argv + spec.flags())


def _model(study, arm: str, model_args, task: str) -> str:
    """The model an arm trains (the recipe's or the study's, else the task's start model), refused where it is the
    embedded start model of other tasks only."""
    from ..data.models import resolve_model
    from ..data.tasks import TASKS, get_task

    where = key_path(study.folder, f"arms.{arm}")
    if model_args.model_name_or_path is None:
        return get_task(task).model_path()
    path = resolve_model(model_args.model_name_or_path, f"{where}: model_name_or_path")
    made_for = [t.name for t in TASKS.values() if not isinstance(t.model_dir, str) and Path(path).exists()
                and Path(t.model_dir).resolve() == Path(path).resolve()]
    if made_for and task not in made_for:
        named = "the study's model: key" if study.model else "model_name_or_path in the arm's recipe or overrides"
        raise UsageError(f"{where}: its model {model_args.model_name_or_path} is the embedded start model of "
                         f"{', '.join(made_for)}, made for that alone, not for the study's task {task}; leave out "
                         f"{named} (the task then trains its own start model, {Path(get_task(task).model_dir).name}) "
                         f"or name a model for {task}.")
    return path


def _load(where: str, name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # a check says one line per setting
    try:
        return AutoModelForCausalLM.from_pretrained(name), AutoTokenizer.from_pretrained(name)
    except Exception as err:  # noqa: BLE001 - whatever stops it loading, said in one line with the fix
        text = " ".join(str(err).split())[:300]
        raise UsageError(f"{where}: its model {name} cannot load ({type(err).__name__}: {text}); fix "
                         "model_name_or_path in the recipe or the study's model: key.") from err
    finally:
        if bars:
            logging.enable_progress_bar()


def _prompts(where: str, script_args, args, model, tokenizer):
    """The first :data:`PROMPTS` train prompts, refused where they do not fit the model or ``max_prompt_length``."""
    from .train import load_problems
    from ..training.checks import prompt_lengths

    problems = load_problems(script_args, script_args.dataset_train_split, PROMPTS)
    lengths = prompt_lengths(problems["prompt"], tokenizer)
    limit = script_args.max_prompt_length
    if limit is not None and min(lengths) > limit:
        raise UsageError(f"{where}: every sampled prompt is longer than max_prompt_length {limit} (shortest "
                         f"{min(lengths)} tokens), so training would drop them all; raise max_prompt_length.")
    kept = [i for i, n in enumerate(lengths) if limit is None or n <= limit]
    context = getattr(model.config, "max_position_embeddings", None)
    longest = max(lengths[i] for i in kept)
    if isinstance(context, int) and longest + args.max_completion_length > context:
        raise UsageError(f"{where}: a prompt of {longest} tokens plus max_completion_length "
                         f"{args.max_completion_length} exceeds the model's context of {context} tokens; lower "
                         "max_completion_length or set max_prompt_length.")
    return problems.select(kept), (min(lengths), longest)


def _signal(where: str, args, model, tokenizer, problems) -> str:
    """Sample each prompt's group as training would and refuse a study whose groups almost all tie."""
    from ..evaluation.evaluate import evaluate

    n = args.num_generations
    result = evaluate(model, tokenizer, problems, n=n, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k or 0, max_new_tokens=args.max_completion_length, seed=0, progress=False,
                      bootstrap=0, device="cpu", sampler=args.sampler)  # the arm's draws, as its rollouts make them
    grades: dict = {}
    for sample in result.samples:
        grades.setdefault(sample["id"], []).append(sample["grade"] or 0.0)
    mixed = sum(len(set(g)) > 1 for g in grades.values())
    accuracy = sum(sum(g) for g in grades.values()) / sum(len(g) for g in grades.values())
    said = (f"{mixed} of {len(grades)} train prompts' groups ({n} samples each, temperature {args.temperature:g}) "
            f"have both grades, accuracy {accuracy:.3f}")
    if mixed * MIN_SIGNAL < len(grades):
        raise UsageError(f"{where}: the start model cannot learn this task: only {said}, so almost every group ties, "
                         "its advantages are 0 and the runs would train nothing; choose a model that solves some of "
                         "the task and misses some (capo-trl eval --benchmark TASK shows its accuracy), or another "
                         "task.")
    return said


def _key(study) -> str:
    """What a check's result depends on: the study file's content, its recipes' text and the code."""
    parts = {"study": study_digest(yaml.safe_load((study.folder / FILE).read_text())), "capo_trl": __version__,
             "code": code_version()[1], "recipes": recipe_digests(study)}
    return digest(json.dumps(parts, sort_keys=True))


def check(study, runs: Path | None = None, log=print) -> list[str]:
    """Check every distinct setting of the study's own arms (a UsageError at the first that cannot learn); what
    passed is logged and kept in ``runs/<study>/check.json`` (None: not kept)."""
    from ..harness.study import refuse_unrunnable

    refuse_unrunnable(study, "check")
    kept = None if runs is None else Path(runs) / study.name / "check.json"
    key = _key(study)
    if kept is not None and kept.is_file() and json.loads(kept.read_text()).get("key") == key:
        return json.loads(kept.read_text())["said"]
    said, seen = [], {}
    for arm in study.own_arms():
        script_args, args, model_args = _settings(study, arm)
        where, task = key_path(study.folder, f"arms.{arm}"), study.arm_task(arm)
        path = _model(study, arm, model_args, task)
        setting = (path, task, script_args.prompt_template, script_args.max_prompt_length, args.num_generations,
                   args.temperature, args.top_p, args.top_k, args.max_completion_length)
        if setting in seen:
            seen[setting].append(arm)
            continue
        seen[setting] = [arm]
        model, tokenizer = _load(where, path)
        problems, (short, longest) = _prompts(where, script_args, args, model, tokenizer)
        line = f"{task}, {Path(path).name}: prompts of {short}-{longest} tokens fit; " + \
            _signal(where, args, model, tokenizer, problems)
        said.append(line)
        log(f"check {arm}: {line}")
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps({"key": key, "said": said}, indent=1) + "\n")
    return said


__all__ = ["MIN_SIGNAL", "PROMPTS", "check"]
