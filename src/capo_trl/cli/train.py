"""`capo-trl train`: CAPOTrainer from a YAML recipe plus command-line overrides.

Built like ``trl grpo`` (``trl/scripts/grpo.py``) on TRL's :class:`~trl.TrlParser`, so a recipe is
one flat YAML mapping of :class:`ScriptArguments`, :class:`~capo_trl.CAPOConfig` and
:class:`~trl.ModelConfig` fields, the command line overrides it, and ``accelerate launch`` runs it
unchanged on any number of processes::

    capo-trl train --config examples/recipes/capo-qwen2.5-math-1.5b.yaml --max_steps 10
    accelerate launch --config_file examples/accelerate/zero2.yaml -m capo_trl.cli train --config RECIPE.yaml

Without a model it trains the embedded default (the tiny arithmetic model on the arithmetic task,
graded by ``math_accuracy``) with settings that fit a CPU: the `capo` preset ``capo-trl demo`` trains, and says
so on stderr; the embedded model with any other dataset is refused.

A recipe written for ``trl grpo`` runs too: TRL's dataset format (a ``prompt`` column, every other
column passed to the reward functions), ``trl.rewards``' function names, ``reward_model_name_or_path``;
``datasets`` (mixtures) and ``dataset_streaming`` are refused with what to do instead (docs/migration.md).

This module loads the data and the model and runs the trainer; parsing and checking the arguments
is :mod:`capo_trl.cli.train_args` (its public names are importable from here too).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..data import benchmarks as data
from ..training.config import CAPOConfig
from ..errors import UsageError
from .reward_names import check_reward_columns, resolve_reward
from ..data.tasks import get_task

# The arguments (parsing, defaults, checks) live in train_args; their names stay importable from here.
from .train_args import (  # noqa: F401
    ScriptArguments, _resume_target, check_args, embedded_defaults, make_parser, parse_args, preflight,
)


# ------------------------------------------------------------------------------------------ data
def train_spelling(message: str) -> str:
    """A data error in ``capo-trl train``'s words: its flags, not ``load_benchmark``'s keywords."""
    message = re.sub(r"Pass columns=\{'(\w+)': '<your column>'\} to name the column that holds it\.",
                     r"Name the column that holds it with --dataset_columns \1=NAME (in a recipe: dataset_columns: "
                     r"{\1: NAME}).", message)
    message = re.sub(r"load_benchmark\('([^']+)'\) \(CLI: --dataset_name [^)]+\)", r"--dataset_name \1", message)
    return message.replace("add columns={'problem': ..., 'answer': ..., 'id': ...}",
                           "add --dataset_columns problem=NAME answer=NAME id=NAME")


def load_problems(script_args: ScriptArguments, split: str | None, limit: int | None):
    """The dataset as ``prompt``/``answer``/``id`` rows (:func:`capo_trl.data.benchmarks.normalise`): registry name,
    local file or hub id; an error names ``train``'s flags."""
    try:
        return _load_problems(script_args, split, limit)
    except data.BenchmarkError as err:
        raise data.BenchmarkError(train_spelling(str(err))) from err


def _load_problems(script_args: ScriptArguments, split: str | None, limit: int | None):
    name = script_args.dataset_name or "arithmetic"
    kind = data.dataset_kind(name)
    if kind != "hub" and script_args.dataset_config is not None:
        raise UsageError(f"dataset_config applies to hub dataset ids only, not to {name!r}.")
    if kind == "registry":
        embedded = data.embedded_task(name) is not None  # generated: train/validation/test splits
        return data.load_benchmark(name, split=split or ("train" if embedded else None), limit=limit,
                                   columns=script_args.columns(), template=script_args.prompt_template)
    if kind == "local":
        return data.load_benchmark(name, split=None, limit=limit, columns=script_args.columns(),
                                   template=script_args.prompt_template, keep_columns=True)
    import datasets

    try:
        ds = datasets.load_dataset(name, script_args.dataset_config, split=split or "train")
    except Exception as err:  # offline, unknown id, bad split: one cause for the user
        offline = " (HF_HUB_OFFLINE is set)" if datasets.config.HF_HUB_OFFLINE else ""
        raise UsageError(f"dataset_name {name!r}: cannot load it as a hub dataset{offline}: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}. Give a registry name or a local file.") from err
    source = f"{name!r} (hub dataset, split {split or 'train'!r})"
    if data.uses_prompt_column(ds, script_args.columns()):  # TRL's format: used as is
        return data.trl_format(ds, script_args.columns(), limit=limit, source=source,
                               template=script_args.prompt_template)
    mapping = {"problem": "problem", "answer": "answer", "id": None, **(script_args.columns() or {})}
    if "answer" not in ds.column_names and not (script_args.columns() or {}).get("answer"):
        mapping["answer"] = None  # no gold: fine for reward functions that need none (check_reward_columns)
    return data.normalise(ds, mapping, script_args.prompt_template or data.DEFAULT_TEMPLATE, name=name,
                          source=source, limit=limit, keep_columns=True)


def drop_long_prompts(ds, tokenizer, max_tokens: int):
    """Keep rows whose prompt, rendered as TRL renders it, fits in ``max_tokens`` tokens."""
    from ..training.checks import prompt_lengths

    return ds.filter(lambda row: prompt_lengths([row["prompt"]], tokenizer)[0] <= max_tokens)


# ------------------------------------------------------------------------------------------ model
def _kbit_device_map() -> dict | None:
    """Quantised weights must be placed at load time: each process loads onto its own GPU."""
    import torch
    from accelerate import PartialState

    return {"": PartialState().local_process_index} if torch.cuda.is_available() else None


def build_trainer(script_args: ScriptArguments, training_args: CAPOConfig, model_args):
    """CAPOTrainer for parsed arguments: loads the model, the dataset and the reward functions."""
    from transformers import AutoTokenizer
    from trl import get_peft_config, get_quantization_config

    from ..training.trainer import CAPOTrainer

    # without a model the dataset is an embedded task (check_args): its own start model
    model = (model_args.model_name_or_path
             or get_task(data.embedded_task(script_args.dataset_name or "arithmetic")).model_path())
    init_kwargs = dict(revision=model_args.model_revision, attn_implementation=model_args.attn_implementation,
                       dtype=model_args.dtype)
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        init_kwargs["device_map"] = _kbit_device_map()
    training_args.model_init_kwargs = {**init_kwargs, **(training_args.model_init_kwargs or {})}

    with training_args.main_process_first(desc="loading the dataset"):
        train = load_problems(script_args, script_args.dataset_train_split, script_args.dataset_limit)
        evaluate = None
        if training_args.eval_strategy != "no" and script_args.dataset_test_split is not None:
            evaluate = load_problems(script_args, script_args.dataset_test_split, None)
        if script_args.max_prompt_length is not None:
            tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision,
                                                      trust_remote_code=training_args.trust_remote_code)
            before = len(train)
            train = drop_long_prompts(train, tokenizer, script_args.max_prompt_length)
            if len(train) < before:
                print(f"capo-trl train: dropped {before - len(train)} of {before} problems longer than "
                      f"{script_args.max_prompt_length} prompt tokens", file=sys.stderr)
        monitor = _calibration_monitor(script_args)
    funcs = [resolve_reward(n) for n in script_args.reward_funcs]
    check_reward_columns(train, script_args, funcs)
    if script_args.reward_model_name_or_path:  # TRL loads a model id given among the reward functions
        funcs.insert(0, script_args.reward_model_name_or_path)
    trainer = CAPOTrainer(
        model=model, reward_funcs=funcs, args=training_args,
        train_dataset=train, eval_dataset=evaluate, peft_config=get_peft_config(model_args),
        quantization_config=quantization_config,
    )
    if monitor is not None:
        trainer.add_callback(monitor.bind(trainer))
    return trainer


def _calibration_monitor(script_args: ScriptArguments):
    """The CalibrationCallback asked for with ``calibration_dataset`` (a split or a local file), or None."""
    name = script_args.calibration_dataset
    if name is None:
        return None
    from ..evaluation.callbacks import CalibrationCallback

    if Path(name).suffix.lower() in data.LOCAL_SUFFIXES:
        problems = data.load_benchmark(name, limit=script_args.calibration_limit, columns=script_args.columns(),
                                       template=script_args.prompt_template)
    else:
        problems = load_problems(script_args, name, script_args.calibration_limit)
    return CalibrationCallback(problems, every_n_steps=script_args.calibration_every,
                               n=script_args.calibration_samples)


def _clear_output_dir(path: str) -> None:
    """``overwrite_output_dir``: delete the folder's contents, so no checkpoint of the old run is left to resume."""
    import shutil

    out = Path(path).resolve()
    if out in (Path.cwd().resolve(), Path.home().resolve(), Path(out.anchor)) or (out / ".git").exists():
        raise UsageError(f"overwrite_output_dir would delete {out}, which looks like a working directory, not a "
                         "run's output; choose a dedicated output_dir.")
    for entry in out.iterdir() if out.is_dir() else []:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def _plot_calibration(trainer, output_dir: str) -> None:
    """With ``calibration_dataset``: the CalibrationCallback's curves as output_dir/calibration_curves.png."""
    from ..evaluation.callbacks import CalibrationCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, CalibrationCallback) and callback.history and trainer.accelerator.is_main_process:
            path = callback.plot(Path(output_dir) / "calibration_curves.png")
            trainer.accelerator.print(f"capo-trl train: calibration curves (AUROC, accuracy per step) written to {path}")


SUMMARY_FILE = "calibration_summary.json"


def calibration_summary(trainer) -> dict | None:
    """Calibration at the start and at the end of the run, from what it evaluated: the ``calibration_dataset``
    monitor (accuracy, pooled and per-question AUROC, ECE), else TRL's evaluation on ``eval_dataset`` (its rollouts'
    pooled AUROC and mean reward); None when the run evaluated nothing, or only once."""
    from ..evaluation.callbacks import CalibrationCallback

    monitor = next((c for c in trainer.callback_handler.callbacks if isinstance(c, CalibrationCallback)), None)
    if monitor is not None and len(monitor.history) >= 2:
        p, n = monitor.prefix, monitor.n
        keys = {"accuracy": f"{p}mean@{n}", "auroc": f"{p}auroc", "auroc_question": f"{p}auroc_question",
                "ece": f"{p}ece"}
        source = f"calibration_dataset, {len(monitor.eval_dataset)} problems x {n} samples"
        points = monitor.history
    else:
        points = [h for h in trainer.state.log_history if "eval_capo/auroc" in h]
        keys = {"auroc": "eval_capo/auroc", "mean reward": "eval_reward"}
        source = "eval_dataset rollouts"
        if len(points) < 2:
            return None

    def at(point):
        return {"step": point["step"], **{name: point.get(key) for name, key in keys.items()}}
    return {"source": source, "start": at(points[0]), "end": at(points[-1])}


def report_calibration(trainer, output_dir: str) -> dict | None:
    """Print the calibration summary (or how to get one) and write it to output_dir as JSON."""
    import json

    summary = calibration_summary(trainer)
    if not trainer.accelerator.is_main_process:
        return summary
    if summary is None:
        print("capo-trl train: no calibration measured during the run (give --calibration_dataset validation, or a "
              "file, to measure accuracy, AUROC and ECE at the start and the end).")
        return None
    start, end = summary["start"], summary["end"]
    lines = [f"capo-trl train: calibration ({summary['source']}), step {start['step']} -> step {end['step']}:"]
    for name in start:
        if name != "step":
            a, b = (f"{v:.3f}" if isinstance(v, float) and v == v else "n/a" for v in (start[name], end[name]))
            lines.append(f"  {name:<15} {a} -> {b}")
    path = Path(output_dir) / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(lines) + f"\n  written to {path}")
    return summary


def quiet_known_noise() -> None:
    """Silence what every run printed and no user can act on: transformers 5's FutureWarnings for the old
    checkpointing *method* names TRL 1.16 calls (the old *config* name, when a recipe uses it, still warns), and
    DeepSpeed's "Setting accelerator to CPU" on a machine without one."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`(is_gradient_checkpointing|gradient_checkpointing_enable|"
                                    r"gradient_checkpointing_disable)` is deprecated")
    logging.getLogger("DeepSpeed").addFilter(lambda record: "Setting accelerator to CPU" not in record.getMessage())


def run(script_args: ScriptArguments, training_args: CAPOConfig, model_args):
    """Train, then save the final model (the adapter only, under PEFT) to output_dir; returns the trainer."""
    quiet_known_noise()
    preflight(script_args, training_args, model_args)
    resume = _resume_target(training_args.resume_from_checkpoint)
    if script_args.overwrite_output_dir and resume is None:
        with training_args.main_process_first(desc="clearing output_dir", local=False):
            if training_args.process_index == 0:
                _clear_output_dir(training_args.output_dir)
    trainer = build_trainer(script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.state.global_step == 0:
        raise UsageError("training ran 0 steps (the dataset yielded no complete batch); nothing was saved. Add rows, "
                         "or lower per_device_train_batch_size.")
    trainer.save_model(training_args.output_dir)
    _plot_calibration(trainer, training_args.output_dir)
    report_calibration(trainer, training_args.output_dir)
    n = trainer.accelerator.num_processes
    trainer.accelerator.print(f"capo-trl train: {trainer.state.global_step} steps on {n} process{'es' * (n > 1)}, "
                              f"model saved to {training_args.output_dir}")
    return trainer


def main(argv: list[str] | None = None):
    """Parse ``argv`` (default: sys.argv) and :func:`run`; returns the trainer (tests inspect it)."""
    return run(*parse_args(argv))


def run_and_end(script_args: ScriptArguments, training_args: CAPOConfig, model_args) -> None:
    """:func:`run`, then end trackers and the process group, releasing the wrapped model *first*.

    Why: destroying the process group while a DDP-wrapped model still holds it left one gloo rank
    hanging in the model's destructor (seen 1 run in 3 under `accelerate launch --multi_gpu` on CPU).
    """
    import gc

    trainer = run(script_args, training_args, model_args)
    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    del trainer
    accelerator.free_memory()  # drops accelerate's references to the prepared model and optimizer
    gc.collect()
    accelerator.end_training()


__all__ = ["ScriptArguments", "make_parser", "parse_args", "check_args", "preflight", "load_problems",
           "build_trainer", "run", "run_and_end", "main"]


if __name__ == "__main__":
    run_and_end(*parse_args())
