"""The YAML recipes and accelerate configs under examples/: each parses and validates without loading
anything, states the paper's hyperparameters and batch arithmetic, and has a GRPO twin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from capo_trl.cli import main as cli
from capo_trl.data.models import MODELS
from capo_trl.cli import train as capo_train
from capo_trl.training.config import CAPOConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))
ACCELERATE = sorted((ROOT / "examples" / "accelerate").glob("*.yaml"))
CAPO_RECIPES = [r for r in RECIPES if r.name.startswith("capo-")]

# recipe -> (tau, prompts per optimizer step, prompts per generation, max_steps) from CAPO.md's defaults
PAPER = {
    "capo-qwen2.5-math-1.5b.yaml": (64, 128, 1200),
    "capo-qwen2.5-math-7b.yaml": (64, 128, 800),
    "capo-qwen2.5-math-1.5b-lora.yaml": (16, 32, 1200),  # the single-GPU budget version
}


@pytest.fixture
def no_loading(monkeypatch):
    """Parsing a recipe must not touch a model, a tokenizer or a dataset."""
    import datasets
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError(f"parsing loaded something: {args[:1]}")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    monkeypatch.setattr(datasets, "load_dataset", refuse)


def header(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))


def launch_processes(path: Path) -> int:
    """Number of processes the recipe's launch line assumes (1 when it is launched without accelerate)."""
    found = re.search(r"--num_processes (\d+)", header(path))
    return int(found.group(1)) if found else 1


def test_there_are_recipes_and_configs():
    assert {r.name for r in CAPO_RECIPES} >= set(PAPER)
    assert {p.stem for p in ACCELERATE} >= {"ddp", "zero2", "zero3", "fsdp2", "multi_node"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_and_validates_without_loading(recipe, no_loading):
    script, args, model = capo_train.parse_args(["--config", str(recipe)])
    assert isinstance(args, CAPOConfig) and args.generation_batch_size % args.num_generations == 0
    assert args.output_dir and script.reward_funcs
    text = header(recipe)
    assert "Hardware assumed" in text and re.search(r"[Tt]ime per step", text)
    if model.model_name_or_path is not None and model.model_name_or_path not in MODELS:  # GPU recipes: estimates
        assert "ESTIMATE, NOT MEASURED" in text
    for config in re.findall(r"--config_file (\S+)", text):
        assert (ROOT / config).is_file(), config
    for named in re.findall(r"--config (examples/recipes/\S+)", text):
        assert named == f"examples/recipes/{recipe.name}"


@pytest.mark.parametrize("recipe", [ROOT / "examples" / "recipes" / name for name in PAPER], ids=lambda p: p.name)
def test_paper_hyperparameters_and_batch_arithmetic(recipe):
    per_step, per_generation, max_steps = PAPER[recipe.name]
    script, args, model = capo_train.parse_args(["--config", str(recipe)])
    assert model.model_name_or_path.startswith("Qwen/Qwen2.5-Math-") and model.dtype == "bfloat16"
    assert script.dataset_name == "deepscaler" and script.max_prompt_length == 1050
    assert script.reward_funcs == ["math_accuracy"]
    assert args.advantage_estimator == "capo"  # its CAPO fields: the recommendation's (tests/test_recommendation.py)
    assert (args.num_generations, args.temperature, args.beta, args.epsilon) == (8, 1.0, 0.0, 0.2)
    assert args.max_completion_length == 3046 and args.vllm_max_model_length == 1050 + 3046
    assert args.use_vllm and args.vllm_mode == "colocate" and args.bf16 and args.gradient_checkpointing
    assert args.max_steps == max_steps
    assert args.learning_rate == (1e-5 if model.use_peft else 1e-6)
    n = launch_processes(recipe)
    g = args.num_generations
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * n == per_step * g
    assert args.per_device_train_batch_size * args.steps_per_generation * n == per_generation * g
    assert args.steps_per_generation == 2 * args.gradient_accumulation_steps  # 2 optimizer updates per rollout


def test_lora_recipe_is_single_gpu_lora():
    recipe = ROOT / "examples/recipes/capo-qwen2.5-math-1.5b-lora.yaml"
    _, args, model = capo_train.parse_args(["--config", str(recipe)])
    assert model.use_peft and model.lora_r == 64 and model.lora_target_modules == "all-linear"
    assert model.lora_dropout == 0.0 and launch_processes(recipe) == 1


@pytest.mark.parametrize("capo", CAPO_RECIPES, ids=lambda p: p.name)
def test_grpo_twin_differs_only_in_the_estimator(capo):
    grpo = capo.with_name(capo.name.replace("capo-", "grpo-", 1))
    a, b = yaml.safe_load(capo.read_text()), yaml.safe_load(grpo.read_text())
    assert set(a) == set(b)
    assert {k for k in a if a[k] != b[k]} == {"advantage_estimator", "output_dir", "run_name"} & set(a)
    assert b["advantage_estimator"] == "grpo"
    _, args, _ = capo_train.parse_args(["--config", str(grpo)])
    assert args.advantage_estimator == "grpo" and args.noise_mask is False  # exactly GRPOTrainer's training


def test_cpu_recipe_writes_out_the_embedded_defaults():
    """capo-arith-tiny-cpu.yaml documents what `capo-trl train` does with no arguments: they must agree."""
    script, recipe, _ = capo_train.parse_args(["--config", str(ROOT / "examples/recipes/capo-arith-tiny-cpu.yaml")])
    bare_script, bare, _ = capo_train.parse_args([])
    for key in capo_train.embedded_defaults():
        if key != "output_dir":
            assert getattr(recipe, key) == getattr(bare, key), key
    assert script.dataset_limit == bare_script.dataset_limit


def test_typo_in_a_recipe_fails_naming_the_field(tmp_path, capsys):
    recipe = tmp_path / "typo.yaml"
    text = (ROOT / "examples/recipes/capo-qwen2.5-math-1.5b.yaml").read_text().replace("\ntau: ", "\ntua: ")
    recipe.write_text(text)
    with pytest.raises(ValueError, match=r"unknown field\(s\) 'tua' \(did you mean 'tau'\?\)"):
        capo_train.parse_args(["--config", str(recipe)])
    assert cli.main(["train", "--config", str(recipe)]) == 2
    assert "'tua'" in capsys.readouterr().err
    recipe.write_text("learning_rat: 1.0e-6\nnum_generation: 8\n")
    with pytest.raises(ValueError, match="'learning_rat'.*'learning_rate'.*'num_generation'.*'num_generations'"):
        capo_train.parse_args(["--config", str(recipe)])


def test_a_bad_value_in_a_recipe_fails_naming_the_field(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model_name_or_path: m\nadvantage_estimator: capo2\n")
    with pytest.raises(ValueError, match="advantage_estimator='capo2'"):
        capo_train.parse_args(["--config", str(recipe)])
    recipe.write_text("model_name_or_path: m\nref_low: 0.5\n")
    with pytest.raises(ValueError, match="ref_low"):
        capo_train.parse_args(["--config", str(recipe)])
    with pytest.raises(ValueError, match="Cannot read recipe"):
        capo_train.parse_args(["--config", str(tmp_path / "missing.yaml")])


@pytest.mark.parametrize("config", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_config_loads_and_validates(config):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    loaded = load_config_from_file(str(config))  # raises on unknown top-level keys
    known = {action.dest for action in launch_command_parser()._actions}
    nested = list((loaded.deepspeed_config or {})) + [
        k if k.startswith("fsdp_") else f"fsdp_{k}" for k in (loaded.fsdp_config or {})]
    assert not [k for k in nested if k not in known], "unknown deepspeed/fsdp keys"
    assert loaded.mixed_precision == "bf16" and loaded.num_processes >= 2
    try:  # accelerate's own merge of config file and flags (private; skip if it moves)
        from accelerate.commands.launch import _validate_launch_command
    except ImportError:
        pytest.skip("accelerate moved _validate_launch_command")
    args, _, _ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", str(config), "-m", "capo_trl.cli", "train"]))
    assert args.num_processes == loaded.num_processes and args.num_machines == loaded.num_machines
    assert args.multi_gpu or args.use_deepspeed or args.use_fsdp
    for recipe in re.findall(r"--config (examples/recipes/\S+)", header(config)):
        assert (ROOT / recipe).is_file(), recipe
