"""`capo-trl train`'s arguments: the recipe and command line parsed, defaulted and checked, nothing loaded.

:class:`ScriptArguments` (data and reward), TRL's :class:`~trl.TrlParser` over it, :class:`~capo_trl.CAPOConfig`
and :class:`~trl.ModelConfig`, the embedded default's settings as parser defaults, and the checks
that need no model or dataset (:func:`check_args`) or only the file system (:func:`preflight`), so a
bad recipe fails before an hour of loading. :mod:`capo_trl.cli.train` builds and runs the trainer.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..data import benchmarks as data
from ..training.checks import check_correct_threshold
from ..training.config import CAPOConfig
from ..training.defaults import EMBEDDED_METHOD, TrainingBudget, training_config
from ..errors import UsageError, check_model_path, check_output_dir, invalid_choice
from .reward_names import REWARDS, resolve_reward
from .train_flags import LAUNCH_FLAG as FLAG, check_flags, check_recipe_keys, read_recipe
from ..data.models import resolve_model
from ..data.tasks import TASKS


@dataclass
class ScriptArguments:
    """What to train on and how to grade it (the model is :class:`trl.ModelConfig`'s, the trainer CAPOConfig's).

    Field names follow ``trl grpo`` where the meaning is the same, so TRL recipes carry over.
    """

    dataset_name: str | None = field(
        default=None,
        metadata={"help": f"Training data: a capo_trl.data.benchmarks registry name ({', '.join(sorted(data.BENCHMARKS))}), a "
                  f"hub dataset id (or a local dataset folder), or a local {'/'.join(data.LOCAL_SUFFIXES)} file. "
                  "A file or hub dataset with a 'prompt' column (TRL's text or conversational format) is used as is; "
                  "else its 'problem' and 'answer' columns make the prompts (prompt_template). Every other column "
                  "reaches the reward functions as a keyword argument, as in TRL. Default: the embedded arithmetic "
                  "task; without model_name_or_path, an embedded task (capo_trl.data.tasks) trains its own start model."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration name of a hub dataset id (load_dataset's `name`)."},
    )
    dataset_train_split: str | None = field(
        default=None,
        metadata={"help": "Split to train on. Default: 'train' for an embedded task, the registry's split for another "
                  "registered name (capo_trl.data.benchmarks.BENCHMARKS), 'train' for a hub id; not allowed for a local file."},
    )
    dataset_test_split: str | None = field(
        default=None,
        metadata={"help": "Split evaluated when eval_strategy is not 'no' (same dataset). Default: none."},
    )
    dataset_limit: int | None = field(
        default=None, metadata={"help": "Train on the first N problems only."},
    )
    dataset_columns: list[str] | None = field(
        default=None,
        metadata={"help": f"Column mapping ROLE=NAME for the roles {', '.join(data.TRAIN_ROLES)}, e.g. "
                  "--dataset_columns problem=question answer=final_answer (a YAML mapping also works). Mapping "
                  "problem builds prompts from that column even when the dataset has a 'prompt' column."},
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": f"How a problem becomes a prompt: one of {', '.join(sorted(data.PROMPT_TEMPLATES))} "
                  "(capo_trl.data.benchmarks.PROMPT_TEMPLATES). Default: the registry's for a registered name "
                  f"('{data.BENCHMARKS['arithmetic'].template}' for arithmetic), else '{data.DEFAULT_TEMPLATE}'.",
                  "choices": sorted(data.PROMPT_TEMPLATES)},
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Drop training problems whose rendered prompt is longer than this many tokens (verl's "
                  "filter_overlong_prompts; TRL 1.16 has no prompt truncation). Default: keep all."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Delete what output_dir holds before training. Without it, a non-empty output_dir is "
                  "refused (unless resume_from_checkpoint is given), so an earlier run is never replaced silently."},
    )
    calibration_dataset: str | None = field(
        default=None,
        metadata={"help": "Monitor calibration during training (capo_trl.CalibrationCallback: validation accuracy, "
                  "AUROC and ECE logged as val/*; their curves written to output_dir/calibration_curves.png at the end): a "
                  "split of dataset_name (e.g. validation) or a local file. Default: off."},
    )
    calibration_every: int = field(default=50, metadata={"help": "CalibrationCallback: every N optimizer steps."})
    calibration_samples: int = field(default=8, metadata={"help": "CalibrationCallback: samples per problem."})
    calibration_limit: int | None = field(
        default=64, metadata={"help": "CalibrationCallback: the first N problems of calibration_dataset."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={"help": "Reward functions: 'math_accuracy', 'boxed_format', a function of trl.rewards by name "
                  "('accuracy_reward', 'think_format_reward', 'reasoning_accuracy_reward'), or a dotted path "
                  "('package.module:function' or 'package.module.function'). Weights: --reward_weights."},
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A reward model (hub id or local folder, loaded by TRL as a sequence classifier with one "
                  "label), as in `trl grpo`: it becomes the first reward function, before reward_funcs."},
    )
    # `trl grpo` fields that capo-trl train accepts by name but refuses (check_args says why and what to do).
    datasets: list[dict] | None = field(
        default=None,
        metadata={"help": "TRL's dataset mixtures: not supported (refused with the alternative); give dataset_name."},
    )
    dataset_streaming: bool = field(
        default=False,
        metadata={"help": "TRL's streaming datasets: not supported (refused with the alternative)."},
    )

    def __post_init__(self):
        if isinstance(self.dataset_columns, dict):  # a YAML mapping
            self.dataset_columns = [f"{k}={v}" for k, v in self.dataset_columns.items()]
        if isinstance(self.reward_funcs, str):  # a YAML scalar
            self.reward_funcs = [self.reward_funcs]
        self.reward_funcs = list(self.reward_funcs or [])  # `trl grpo`'s default is None
        self.columns()  # validate early
        for name in ("calibration_every", "calibration_samples", "calibration_limit"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")

    def columns(self) -> dict[str, str] | None:
        """``dataset_columns`` as ``{role: column}``."""
        return data.parse_columns(self.dataset_columns, "dataset_columns", data.TRAIN_ROLES)


# ------------------------------------------------------------------------------------------ parsing
def make_parser(prog: str = "capo-trl train"):
    """TRL's parser over (ScriptArguments, CAPOConfig, ModelConfig): every field is a flag and a YAML key."""
    from trl import ModelConfig, TrlParser

    class Parser(TrlParser):
        def error(self, message):  # argparse prints ~250 lines of usage first: one line is enough
            raise UsageError(f"{message} (see `{prog} --help`).")

        def _check_value(self, action, value):  # a slip of a choice names the one meant
            if action.choices is not None and value not in action.choices:
                raise argparse.ArgumentError(action, invalid_choice(value, action.choices))

    return Parser(
        (ScriptArguments, CAPOConfig, ModelConfig), prog=prog, allow_abbrev=False,  # --learning_rat is a slip
        description="Train CAPOTrainer. --config RECIPE.yaml reads a YAML mapping of any of the fields below "
                    "(examples/recipes/); flags override it. Without a model: the embedded default (CPU, minutes). "
                    "--accelerate_config NAME|PATH (TRL's predefined configs: zero1/2/3, fsdp1/2, multi_gpu, "
                    "single_gpu) launches through accelerate; flags that are not fields below (--num_processes N, "
                    "--mixed_precision, --main_process_port...) go to `accelerate launch`. On a machine without an "
                    "accelerator, use_cpu defaults to True and bf16 to False.",
    )


def embedded_defaults() -> dict:
    """Trainer settings for the embedded tiny model (:mod:`capo_trl.training.defaults`): those of ``capo-trl demo
    --task arithmetic``.

    They are parser defaults, so a recipe or a flag still overrides each of them.
    """
    return dict(**training_config(TrainingBudget()), **EMBEDDED_METHOD, activation_checkpointing=False,
                logging_steps=5, save_strategy="no", output_dir="runs/capo-arith-tiny")


def unread_defaults(method_name) -> list[str]:
    """The embedded default's method fields (CAPO's) that a chosen built-in method other than CAPO never reads."""
    from dataclasses import fields

    from ..methods import BUILTIN

    builtin = {m.name: m for m in BUILTIN}
    chosen = builtin.get(method_name) if method_name is not None else None
    if chosen is None or chosen.name == EMBEDDED_METHOD["advantage_estimator"]:
        return []  # CAPO, or a method of your own (which may read any field): every default stays
    reads = {f.name for f in fields(chosen.Args)} if chosen.Args is not None else set()
    owned = {f.name for m in BUILTIN if m.Args is not None for f in fields(m.Args)}
    return [name for name in EMBEDDED_METHOD if name in owned and name not in reads]


def _has_accelerator() -> bool:
    import torch

    if hasattr(torch, "accelerator"):
        return torch.accelerator.is_available()
    return torch.cuda.is_available()


def parse_args(argv: list[str] | None = None):
    """(ScriptArguments, CAPOConfig, ModelConfig) from ``--config RECIPE.yaml`` and flags; loads nothing.

    Precedence: flags > recipe > embedded-default settings (only when no model is named) > CAPOConfig.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if FLAG in argv:  # the launch's own flags are accelerate's, not fields (capo_trl.cli.launch)
        argv = split_args(argv)[1]
    parser = make_parser()
    helping = any(a in ("-h", "--help") for a in argv)  # --help shows the dataclasses' defaults, as documented
    config = read_recipe(argv)
    if config:
        check_recipe_keys(config, [action.dest for action in parser._actions], argv[argv.index("--config") + 1])
    if not helping:  # argparse prints --help before it looks at unknown flags
        check_flags(argv, [s for action in parser._actions for s in action.option_strings])
    defaults = {}
    if not _has_accelerator():
        # Without use_cpu, `accelerate launch --multi_gpu` on a CPU-only machine starts N processes that each
        # train alone (transformers sees no distributed type); with it they form one gloo group (MULTI_CPU).
        # GRPOConfig's bf16=True default refuses to start on a CPU unless use_cpu is set.
        defaults.update(use_cpu=True, bf16=False)
    def given(name):
        flags = (f"--{name}", f"--{name.replace('_', '-')}")
        return name in config or any(a.split("=", 1)[0] in flags for a in argv)

    def value(name):  # what the command line (last) or the recipe gives
        for i in range(len(argv) - 1, -1, -1):
            flag, eq, text = argv[i].partition("=")
            if flag in (f"--{name}", f"--{name.replace('_', '-')}"):
                return text if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        return config.get(name)

    embedded = not given("model_name_or_path")
    if embedded and not helping:
        defaults.update(embedded_defaults())
        for name in unread_defaults(value("advantage_estimator")):  # no CAPO settings under grpo: nothing to warn of
            defaults.pop(name)
        if given("gradient_checkpointing"):  # the old name, asked for: the new one's default must not override it
            defaults.pop("activation_checkpointing")
        defaults["dataset_limit"] = TrainingBudget().train_problems  # the problems `capo-trl demo` trains on
    old_name = given("gradient_checkpointing") or given("no_gradient_checkpointing")
    if not helping and not old_name:  # TRL's default (on) under transformers 5's name: the old name's default warns
        defaults.setdefault("activation_checkpointing", True)
    parser.set_defaults(**defaults)
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    check_args(script_args, training_args, model_args)
    if embedded and os.environ.get("RANK", "0") == "0":
        print(f"capo-trl train: no model_name_or_path: training the embedded tiny model with the embedded default "
              f"settings ({_embedded_summary(training_args, script_args)}); give --model_name_or_path to train "
              "another model.", file=sys.stderr)
    return script_args, training_args, model_args


def _embedded_summary(args: CAPOConfig, script_args: ScriptArguments) -> str:
    """What the embedded default trains, in one clause (the values after any recipe or flag)."""
    tau = f" with tau_mode {args.tau_mode}" if args.advantage_estimator == EMBEDDED_METHOD["advantage_estimator"] else ""
    return (f"{script_args.dataset_name or 'arithmetic'} task, {args.advantage_estimator}{tau}, noise_mask "
            f"{args.noise_mask}, {args.max_steps} steps of "
            f"{args.per_device_train_batch_size // max(args.num_generations, 1)} prompts x {args.num_generations}, "
            f"lr {args.learning_rate:g}, output_dir {args.output_dir}")


def check_args(script_args: ScriptArguments, training_args: CAPOConfig, model_args) -> None:
    """Cross-field checks that need no model, dataset or network (a recipe fails here, not an hour in)."""
    if script_args.datasets:
        raise UsageError("datasets (TRL's dataset mixtures) is not supported by capo-trl train: its loaders, "
                         "column mapping and checks take one dataset. Build the mixture yourself (datasets."
                         "concatenate_datasets / interleave_datasets), save it as a .jsonl or .parquet file and "
                         "give it as dataset_name.")
    if script_args.dataset_streaming:
        raise UsageError("dataset_streaming is not supported by capo-trl train: it needs the rows in memory (the "
                         "size and prompt-length checks, max_prompt_length, dataset_limit). Use dataset_limit N to "
                         "train on the first N rows, or save the part you need as a local .jsonl/.parquet file.")
    if not script_args.reward_funcs and not script_args.reward_model_name_or_path:
        raise UsageError("no reward: give reward_funcs (e.g. math_accuracy) or reward_model_name_or_path.")
    funcs = [resolve_reward(name) for name in script_args.reward_funcs]
    n = len(funcs) + bool(script_args.reward_model_name_or_path)
    weights = training_args.reward_weights
    if weights is not None and len(weights) != n:
        model = " (the reward model first)" if script_args.reward_model_name_or_path else ""
        raise ValueError(f"reward_weights has {len(weights)} entries for {n} reward functions{model} "
                         f"{script_args.reward_funcs}; give one weight per function.")
    if not script_args.reward_model_name_or_path:  # a reward model's range is unknown: nothing to check
        check_correct_threshold(funcs, weights, training_args.correct_threshold, script_args.reward_funcs)
    if (model_args.load_in_4bit or model_args.load_in_8bit) and not model_args.use_peft:
        raise ValueError("load_in_4bit/load_in_8bit train only adapters: add use_peft: true (LoRA).")
    if script_args.max_prompt_length is not None and script_args.max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {script_args.max_prompt_length}.")
    name = script_args.dataset_name
    if name is not None and data.dataset_kind(name) == "hub" and "/" not in name:  # a slip of a registered name?
        import difflib

        close = difflib.get_close_matches(name.lower(), sorted(data.BENCHMARKS), n=1, cutoff=0.8)
        if close:
            raise UsageError(f"dataset_name {name}: not a registered name nor a local file (and a hub dataset id is "
                             f"org/name); did you mean {close[0]}?")
    if name is not None and data.dataset_kind(name) == "local":
        if script_args.dataset_train_split is not None:
            raise UsageError(f"dataset_train_split does not apply to a local file ({name}): give each split its own "
                             "file.")
    task = TASKS.get(data.embedded_task(name)) if name is not None else None
    if task is not None and task.reward is not None and resolve_reward(f"capo_trl.rewards:{task.reward}") not in funcs:
        short = next(k for k, v in REWARDS.items() if v == f"capo_trl.rewards:{task.reward}")
        raise UsageError(f"dataset_name {name} trains with its own reward ({short}), not {script_args.reward_funcs}; "
                         f"give --reward_funcs {short}.")
    tiny = [t.name for t in TASKS.values() if not isinstance(t.model_dir, str)]  # the others' model is a real one
    if model_args.model_name_or_path is None and name is not None and data.embedded_task(name) not in tiny:
        real = TASKS.get(data.embedded_task(name) or "")
        if real is not None:  # the embedded default's settings are the tiny model's: the real model has a recipe
            raise UsageError(f"dataset_name {name} is a task of the real model {real.model_dir}: give "
                             f"--model_name_or_path {real.model_dir}, or train its recipe (--config "
                             f"examples/recipes/capo-smollm2-135m-lora-cpu.yaml).")
        raise UsageError(f"dataset_name {name} without model_name_or_path: the embedded tiny models only do the "
                         f"embedded tasks ({', '.join(tiny)}); give --model_name_or_path MODEL to train on this "
                         "dataset.")


def preflight(script_args: ScriptArguments, training_args: CAPOConfig, model_args) -> None:
    """Checks against the file system, before anything loads: vLLM when asked for, model, data file, output
    folder, checkpoint.

    An earlier run's folder is refused unless resuming it or told to replace it.
    """
    from trl.import_utils import is_vllm_available

    from ..training.resume import resume_checkpoint

    if training_args.use_vllm and not is_vllm_available():  # TRL would find out after the model has loaded
        raise UsageError("use_vllm true needs vLLM, which is not installed here: install it with capo-trl "
                         "(pip install -e '.[vllm]' in a checkout, on a GPU machine), or drop --use_vllm.")

    name = script_args.dataset_name
    if name is not None and data.dataset_kind(name) == "local" and not Path(name).is_file():
        raise UsageError(f"dataset_name {name}: no such file. Give an existing .json/.jsonl/.csv/.parquet file, "
                         "a registry name or a hub dataset id.")
    if model_args.model_name_or_path is not None:  # a fetched short name becomes its folder here
        model_args.model_name_or_path = resolve_model(model_args.model_name_or_path, "model_name_or_path")
        check_model_path(model_args.model_name_or_path, "model_name_or_path")
    if script_args.reward_model_name_or_path is not None:
        check_model_path(script_args.reward_model_name_or_path, "reward_model_name_or_path")
    out = Path(training_args.output_dir)
    resume = _resume_target(training_args.resume_from_checkpoint)
    if isinstance(resume, str) and not Path(resume).is_dir():
        raise UsageError(f"resume_from_checkpoint {resume}: no such directory; give a checkpoint-N folder, or "
                         "'last' for the newest one in output_dir.")
    # the checks that need no model: a broken checkpoint is refused here, before it loads (the trainer checks again)
    resume_checkpoint(resume, str(out), needs_optimizer=False, warn=False, max_steps=training_args.max_steps)
    if resume is None and not script_args.overwrite_output_dir:
        check_output_dir(out, overwrite=False, flag="--overwrite_output_dir true (or resume it with "
                                                     "--resume_from_checkpoint last)")


def _resume_target(value):
    """HF Trainer resumes from the last checkpoint of output_dir when given True: accept 'true'/'last'."""
    if isinstance(value, str) and value.strip().lower() in ("true", "last", "latest"):
        return True
    return value or None



# ------------------------------------------------------------------------------------ launch flags

def predefined_configs() -> list[str]:
    """The names TRL ships in ``trl/accelerate_configs`` (without ``.yaml``)."""
    files = importlib.resources.files("trl.accelerate_configs").iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def _without(argv: list[str], taken: list[str]) -> list[str]:
    """``argv`` less ``taken``, an ordered subsequence of it (argparse's unknown strings keep their order)."""
    rest, pending = [], list(taken)
    for arg in argv:
        if pending and arg == pending[0]:
            pending.pop(0)
        else:
            rest.append(arg)
    return rest


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(accelerate launch arguments, capo-trl train arguments) of ``argv``; the config name is resolved."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    index = argv.index(FLAG)
    if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
        raise UsageError(f"{FLAG} needs a value: one of {', '.join(predefined_configs())}, or a config file path.")
    rest = argv[:index] + argv[index + 2:]
    recipe = []
    if "--config" in rest and rest.index("--config") + 1 < len(rest):  # TrlParser reads it itself
        at = rest.index("--config")
        recipe, rest = rest[at:at + 2], rest[:at] + rest[at + 2:]
    _, unknown = make_parser().parse_known_args(rest)
    try:
        launch = resolve_accelerate_config_argument([FLAG, argv[index + 1], *unknown])
    except ValueError as err:
        raise UsageError(f"{FLAG} {argv[index + 1]}: neither a file nor a predefined config; give one of "
                         f"{', '.join(predefined_configs())}, or a config file path.") from err
    return launch, recipe + _without(rest, unknown)


__all__ = ["FLAG", "ScriptArguments", "check_args", "embedded_defaults", "make_parser", "parse_args",
           "predefined_configs", "preflight", "split_args"]
