"""`capo-trl train`: argument handling, data and reward resolution, CPU training runs (one and two
processes, checkpoint + resume, LoRA), the reference-score cache, and GPU / vLLM runs that skip here."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset

from capo_trl.cli import main as cli
from capo_trl.cli import train as capo_train
from capo_trl.cli.reward_names import resolve_reward
from capo_trl.training.reference import ReferenceScoreCache

HERE = Path(__file__).resolve().parent


def coin_reward(completions, **kwargs):
    """A deterministic fair coin per completion: groups get both classes, so advantages are non-zero."""
    return [float(hashlib.sha256(str(c).encode()).digest()[0] & 1) for c in completions]


def run_group(cmd, env, timeout) -> str:
    """Run a launcher in its own process group; on timeout kill the group, so no rank outlives the test."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"timed out after {timeout} s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    return stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def problems_file(tmp_path) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"what is {i % 10}?", "answer": str(i % 10)}) + "\n"
                            for i in range(16)))
    return str(path)


def job(model_dir, data, out, *extra) -> list[str]:
    """A short CPU job: 2 prompts x 4 completions of 6 tokens per step, the noise mask on and wide open."""
    return ["--model_name_or_path", model_dir, "--dataset_name", data, "--prompt_template", "raw",
            "--reward_funcs", "test_train_cli:coin_reward", "--per_device_train_batch_size", "4",
            "--num_generations", "4", "--max_completion_length", "6", "--learning_rate", "1e-2",
            "--noise_mask", "true", "--ref_high", "1e6", "--ref_low", "1.0", "--gradient_checkpointing", "false",
            "--report_to", "none", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "3",
            "--output_dir", str(out), *extra]


# ------------------------------------------------------------------------------------------ parsing
def test_help_and_dispatch(capsys):
    assert "train" in cli.build_parser().format_help()
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--help"])  # TrlParser's help, not the dispatcher's
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for flag in ("--config", "--tau", "--ref_high", "--lora_r", "--load_in_4bit", "--dataset_name", "--reward_funcs",
                 "--reward_weights", "--use_vllm", "--vllm_mode"):
        assert flag in out, flag


def test_embedded_default_settings_and_precedence(tmp_path):
    script, args, model = capo_train.parse_args([])
    assert model.model_name_or_path is None and script.dataset_name is None
    assert script.reward_funcs == ["math_accuracy"]
    assert (args.max_steps, args.num_generations, args.per_device_train_batch_size) == (200, 8, 64)
    assert script.dataset_limit == 4000
    assert (args.tau_mode, args.advantage_scale, args.noise_mask, args.bf16) == ("relative", "matched", False, False)
    assert args.tau == 0.5
    # a flag beats a recipe, which beats the embedded defaults
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"tau_mode": "absolute", "max_steps": 7}))
    _, args, _ = capo_train.parse_args(["--config", str(recipe), "--max_steps", "3"])
    assert (args.tau_mode, args.max_steps, args.advantage_scale) == ("absolute", 3, "matched")
    assert capo_train._resume_target("last") is True
    assert capo_train._resume_target("ckpt/checkpoint-3") == "ckpt/checkpoint-3"
    assert capo_train._resume_target(None) is None
    # naming a model drops the embedded defaults: CAPOConfig's own apply (the recommendation's, TRL's max_steps)
    from capo_trl.training.defaults import RECOMMENDED

    _, args, _ = capo_train.parse_args(["--model_name_or_path", "some/model"])
    assert (args.tau_mode, args.max_steps, args.noise_mask) == (RECOMMENDED["tau_mode"], -1, RECOMMENDED["noise_mask"])


def test_bad_arguments_fail_cleanly_naming_the_problem(tmp_path, capsys):
    cases = [
        (["--reward_funcs", "no_such_reward"], "Unknown reward function 'no_such_reward'"),
        (["--reward_funcs", "capo_trl.nowhere:f"], "Cannot load reward function 'capo_trl.nowhere:f'"),
        (["--reward_funcs", "capo_trl.cli.reward_names:REWARDS"], "not callable"),
        (["--reward_funcs", "math_accuracy", "boxed_format", "--reward_weights", "1.0"], "reward_weights has 1"),
        (["--model_name_or_path", "m", "--load_in_4bit", "true"], "use_peft"),
        (["--model_name_or_path", "m", "--beta", "0.1", "--sync_ref_model", "true", "--noise_mask", "true"],
         "sync_ref_model"),
        (["--dataset_name", "x.jsonl", "--dataset_train_split", "train"], "does not apply to a local file"),
        (["--dataset_columns", "question"], "ROLE=NAME"),
        (["--dataset_columns", "prompt=question"], "unknown role 'prompt'"),
        (["--tua", "0.5"], "--tua"),
    ]
    for argv, message in cases:
        assert cli.main(["train", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_reward_functions_by_name_and_dotted_path():
    from capo_trl.rewards import boxed_format_reward, math_accuracy_reward

    assert resolve_reward("math_accuracy") is math_accuracy_reward
    assert resolve_reward("math_accuracy_reward") is math_accuracy_reward
    assert resolve_reward("boxed_format") is boxed_format_reward
    assert resolve_reward("capo_trl.rewards:boxed_format_reward") is boxed_format_reward
    assert resolve_reward("capo_trl.rewards.boxed_format_reward") is boxed_format_reward


# ------------------------------------------------------------------------------------------ data
def test_datasets_local_registry_and_hub(tmp_path, monkeypatch):
    local = tmp_path / "q.jsonl"
    rows = [{"question": "1+1?", "final": "2"}, {"question": "2+2?", "final": 4}]
    local.write_text("\n".join(json.dumps(row) for row in rows))
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", str(local),
                                          "--prompt_template", "plain",
                                          "--dataset_columns", "problem=question", "answer=final"])
    ds = capo_train.load_problems(script, None, None)
    assert ds["answer"] == ["2", "4"] and ds["prompt"][0].startswith("1+1?\n")

    script.dataset_columns = {"problem": "question", "answer": "final"}  # the YAML mapping form
    script.__post_init__()
    assert script.columns() == {"problem": "question", "answer": "final"}

    script, _, _ = capo_train.parse_args(["--dataset_name", "arithmetic", "--dataset_limit", "5"])
    ds = capo_train.load_problems(script, None, script.dataset_limit)
    assert len(ds) == 5 and ds["prompt"][0].startswith("Compute ")  # train split, raw template

    calls = {}

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.update(name=name, config=config, split=split)
        return Dataset.from_list([{"question": "3+3?", "solution": "6", "extra": 1}])

    import datasets

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", "someone/math",
                                          "--dataset_config", "main",
                                          "--dataset_columns", "problem=question", "answer=solution"])
    ds = capo_train.load_problems(script, None, None)
    assert calls == {"name": "someone/math", "config": "main", "split": "train"}
    # data.normalise's schema, then every column not mapped (TRL passes them to the reward functions)
    assert ds.column_names == ["prompt", "answer", "id", "extra"] and ds[0]["answer"] == "6"
    assert ds[0]["id"] == "someone/math/0"
    assert ds[0]["prompt"][-1] == {"role": "user", "content": "3+3?"}  # qwen_math: conversational


def test_max_prompt_length_drops_long_prompts(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ds = Dataset.from_dict({"prompt": ["ab", "a" * 50, "abc"], "answer": ["1", "2", "3"]})
    assert capo_train.drop_long_prompts(ds, tokenizer, 10)["answer"] == ["1", "3"]
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}])
    assert len(capo_train.drop_long_prompts(chat, tokenizer, 5)) == 0  # the chat template's tokens count
    assert len(capo_train.drop_long_prompts(chat, tokenizer, 50)) == 1


# ------------------------------------------------------------------------------------------ TRL's formats and names
SEEN = []


def difficulty_reward(completions, difficulty, **kwargs):
    """Records the extra column it is given: TRL passes every dataset column as a keyword argument."""
    SEEN.append((list(difficulty), sorted(kwargs)))
    return [0.0] * len(completions)


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_trl_format_datasets_keep_prompt_and_every_column(tmp_path, monkeypatch):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    conversational = write_rows(tmp_path / "chat.jsonl", [{"prompt": chat, "solution": "$2$", "level": 3}] * 2)
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", conversational,
                                          "--reward_funcs", "accuracy_reward"])
    ds = capo_train.load_problems(script, None, None)
    assert ds.column_names == ["prompt", "solution", "level"] and ds[0]["prompt"] == chat  # not str(list)
    assert ds[0]["solution"] == "$2$"
    text = write_rows(tmp_path / "text.jsonl", [{"prompt": "1+1=", "solution": "2", "difficulty": "easy"}])
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", text,
                                          "--dataset_columns", "answer=solution"])
    ds = capo_train.load_problems(script, None, None)
    assert ds[0] == {"prompt": "1+1=", "solution": "2", "difficulty": "easy", "answer": "2"}
    # the math convenience stays: problem/answer + template, the other columns kept
    math = write_rows(tmp_path / "math.jsonl", [{"problem": "1+1?", "answer": "2", "difficulty": "easy"}])
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", math,
                                          "--prompt_template", "raw"])
    assert capo_train.load_problems(script, None, None)[0] == {"prompt": "1+1?", "answer": "2", "id": "math/0",
                                                               "difficulty": "easy"}
    # ... and mapping problem= builds prompts from that column even next to a prompt column
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", text,
                                          "--dataset_columns", "problem=prompt", "answer=solution",
                                          "--prompt_template", "plain"])
    assert capo_train.load_problems(script, None, None)[0]["prompt"].startswith("1+1=\n")
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", text,
                                          "--prompt_template", "raw"])
    with pytest.raises(ValueError, match="'prompt' column, used as is"):
        capo_train.load_problems(script, None, None)
    # a hub dataset in TRL's format is used as is too
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Dataset.from_list(
        [{"prompt": chat, "solution": "$2$", "source": "x"}]))
    script, _, _ = capo_train.parse_args(["--model_name_or_path", "m", "--dataset_name", "someone/trl-format"])
    assert capo_train.load_problems(script, None, None).column_names == ["prompt", "solution", "source"]
    # registry benchmarks keep their schema
    script, _, _ = capo_train.parse_args(["--dataset_name", "arithmetic", "--dataset_limit", "2"])
    assert capo_train.load_problems(script, None, 2).column_names == ["prompt", "answer", "id"]


def test_extra_columns_reach_the_reward_functions(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"{i}+1=", "solution": str(i + 1), "difficulty": f"d{i}"} for i in range(4)]
    path = write_rows(tmp_path / "text.jsonl", rows)
    SEEN.clear()
    argv = job(tiny_model_dir, path, tmp_path / "out", "--max_steps", "1", "--save_strategy", "no")
    argv[argv.index("--prompt_template"):argv.index("--prompt_template") + 2] = []  # the prompts are written
    argv[argv.index("test_train_cli:coin_reward")] = "test_train_cli:difficulty_reward"
    trainer = capo_train.main(argv)
    assert trainer.state.global_step == 1 and SEEN
    values, names = SEEN[0]
    assert set(values) <= {"d0", "d1", "d2", "d3"} and "solution" in names


def test_conversational_jsonl_trains_with_trls_accuracy_reward(tiny_model_dir, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1=?"}], "solution": f"${i + 1}$"} for i in range(4)]
    argv = job(tiny_model_dir, write_rows(tmp_path / "chat.jsonl", rows), tmp_path / "out", "--max_steps", "1",
               "--save_strategy", "no")
    argv[argv.index("--prompt_template"):argv.index("--prompt_template") + 2] = []
    argv[argv.index("test_train_cli:coin_reward")] = "accuracy_reward"
    trainer = capo_train.main(argv)
    assert trainer.state.global_step == 1 and trainer.reward_func_names == ["accuracy_reward"]
    assert any("rewards/accuracy_reward/mean" in row for row in trainer.state.log_history)


def test_trl_reward_names_resolve_and_factories_say_what_to_do(capsys):
    import trl.rewards

    from capo_trl.rewards import math_accuracy_reward

    assert resolve_reward("accuracy_reward") is trl.rewards.accuracy_reward
    assert resolve_reward("think_format_reward") is trl.rewards.think_format_reward
    assert resolve_reward("reasoning_accuracy_reward") is trl.rewards.reasoning_accuracy_reward
    assert resolve_reward("math_accuracy_reward") is math_accuracy_reward  # ours keep their names
    err = one_line_error(capsys, ["--reward_funcs", "get_soft_overlong_punishment"])
    assert "reward factory" in err and "dotted path" in err
    assert "accuracy_reward" in one_line_error(capsys, ["--reward_funcs", "no_such_reward"])


def test_trl_grpo_fields_are_accepted_or_refused_in_one_line(tiny_model_dir, problems_file, tmp_path, capsys):
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "m", "datasets": [{"path": "a/b", "split": "train"}]}))
    assert "concatenate_datasets" in one_line_error(capsys, ["--config", str(recipe)])
    err = one_line_error(capsys, ["--model_name_or_path", "m", "--dataset_streaming", "true"])
    assert "dataset_streaming is not supported" in err and "dataset_limit" in err
    err = one_line_error(capsys, ["--model_name_or_path", "m", "--reward_model_name_or_path", "rm",
                                  "--reward_weights", "1.0"])
    assert "reward_weights has 1 entries for 2 reward functions (the reward model first)" in err
    # a reward model is a reward function, as in `trl grpo`
    trainer = capo_train.main(job(tiny_model_dir, problems_file, tmp_path / "out", "--max_steps", "1",
                                  "--save_strategy", "no", "--reward_model_name_or_path", tiny_model_dir))
    from transformers import PreTrainedModel

    assert trainer.state.global_step == 1 and isinstance(trainer.reward_funcs[0], PreTrainedModel)
    assert len(trainer.reward_funcs) == 2


def test_no_model_says_so_and_refuses_other_datasets(capsys):
    capo_train.parse_args([])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no model_name_or_path: training the embedded tiny model" in err
    assert "noise_mask False" in err and "200 steps" in err
    capo_train.parse_args(["--model_name_or_path", "m"])
    assert "embedded" not in capsys.readouterr().err
    err = one_line_error(capsys, ["--dataset_name", "math500"])
    assert "only do the embedded tasks (arithmetic, guess, guess-half, guess-redraw)" in err
    err = one_line_error(capsys, ["--dataset_name", "addition"])
    assert "dataset_name addition is a task of the real model smollm2-135m-instruct" in err
    assert "--model_name_or_path" in err


def test_a_task_with_its_own_reward_is_not_trained_with_another(capsys):
    err = one_line_error(capsys, ["--dataset_name", "guess-redraw"])  # the default reward: math_accuracy
    assert "dataset_name guess-redraw trains with its own reward (guess_redraw)" in err
    assert "--reward_funcs guess_redraw" in err
    capo_train.parse_args(["--dataset_name", "guess-redraw", "--reward_funcs", "guess_redraw"])


def test_help_shows_the_documented_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "on for 'capo', off for 'grpo'. (default: None)" in out
    assert "no model_name_or_path" not in out


def test_reward_columns_are_checked_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from capo_trl.training import trainer as trainer_module

    def never(*args, **kwargs):
        raise AssertionError("CAPOTrainer was built")

    monkeypatch.setattr(trainer_module, "CAPOTrainer", never)
    out = str(tmp_path / "out")
    no_gold = write_rows(tmp_path / "q.jsonl", [{"problem": "1+1?", "final": "2"}] * 4)
    argv = job(tiny_model_dir, no_gold, out, "--reward_funcs", "math_accuracy", "--dataset_columns", "id=final")
    err = one_line_error(capsys, argv)
    assert "'answer' or 'solution'" in err and "--dataset_columns answer=NAME" in err
    chat = [{"role": "user", "content": "1+1?"}]
    only_answer = write_rows(tmp_path / "a.jsonl", [{"prompt": chat, "answer": "2"}] * 4)
    argv = job(tiny_model_dir, only_answer, out, "--reward_funcs", "accuracy_reward")
    argv[argv.index("--prompt_template"):argv.index("--prompt_template") + 2] = []
    err = one_line_error(capsys, argv)
    assert "needs the dataset column 'solution'" in err and "--dataset_columns solution=NAME" in err
    text = write_rows(tmp_path / "t.jsonl", [{"prompt": "1+1=", "solution": "2"}] * 4)
    argv = job(tiny_model_dir, text, out, "--reward_funcs", "accuracy_reward")
    argv[argv.index("--prompt_template"):argv.index("--prompt_template") + 2] = []
    assert "reads chat completions" in one_line_error(capsys, argv)


# ------------------------------------------------------------------------------------------ reference cache
def test_reference_cache_is_a_bounded_lru_and_clears():
    cache = ReferenceScoreCache(3)
    for key, value in ((b"a", -1.0), (b"b", -2.0), (b"c", -3.0)):
        cache.put(key, value)
    assert cache.get(b"a") == -1.0  # a is now the most recent
    cache.put(b"d", -4.0)  # evicts b, the least recently used
    assert len(cache) == 3 and cache.get(b"b") is None and cache.get(b"c") == -3.0
    cache.put(b"e", -5.0)  # evicts a (c and d were used / inserted after it)
    assert cache.get(b"a") is None and len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.get(b"d") is None
    disabled = ReferenceScoreCache(0)
    disabled.put(b"a", -1.0)
    assert len(disabled) == 0
    with pytest.raises(ValueError):
        ReferenceScoreCache(-1)


# ------------------------------------------------------------------------------------------ training on CPU
def test_train_saves_checkpoints_that_load_and_resume(tiny_model_dir, problems_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    assert cli.main(["train", *job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_steps", "1",
                                   "--ref_cache_size", "4")]) == 0
    assert "2 steps on 1 process" in capsys.readouterr().out
    for path in (out / "checkpoint-2", out):
        assert AutoModelForCausalLM.from_pretrained(path).config.hidden_size == 32

    resumed = capo_train.main(job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_steps", "1",
                                  "--ref_cache_size", "4", "--resume_from_checkpoint", str(out / "checkpoint-1")))
    assert resumed.state.global_step == 2
    assert [row["step"] for row in resumed.state.log_history if "loss" in row] == [1, 2]  # step 1 restored, 2 trained
    # the reference-score cache respected its bound while the mask ran on every step
    assert len(resumed._ref_cache) <= 4 and resumed._ref_cache.lookups > 0
    assert any("capo/ref_cache_hit_rate" in row for row in resumed.state.log_history)


def test_lora_trains_only_the_adapter_with_the_base_as_reference(tiny_model_dir, problems_file, tmp_path,
                                                                  monkeypatch):
    from accelerate.utils import is_peft_model
    from safetensors.torch import load_file

    from capo_trl.training import trainer as trainer_module

    built = []
    monkeypatch.setattr(trainer_module, "build_reference", lambda trainer, source: built.append(source))
    out = tmp_path / "lora"
    trainer = capo_train.main(job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_strategy", "no",
                                  "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0",
                                  "--lora_target_modules", "q_proj", "v_proj"))
    assert is_peft_model(trainer.model) and trainer.args.noise_mask
    assert trainer._capo_ref_model is None and trainer.ref_model is None and built == []  # no second copy
    assert any("capo/ref_ppl_mean" in row for row in trainer.state.log_history)  # the mask scored the base model
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    state = {n.replace("base_model.model.", "").replace(".base_layer", ""): p.detach()
             for n, p in trainer.model.named_parameters() if "lora_" not in n}
    assert set(base) <= set(state) and all(torch.equal(state[n].cpu(), base[n]) for n in base)  # base untouched
    assert any(p.abs().sum() > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)  # B starts at 0
    assert (out / "adapter_config.json").is_file()


def test_embedded_default_trains(tiny_model_dir, tmp_path, monkeypatch):
    """`capo-trl train` with no model: the embedded model (else the tiny test model), arithmetic, math reward."""
    from capo_trl.data import arithmetic

    try:
        arithmetic.embedded_model_path()
    except FileNotFoundError:
        monkeypatch.setattr(arithmetic, "embedded_model_path", lambda: tiny_model_dir)
    trainer = capo_train.main(["--max_steps", "1", "--per_device_train_batch_size", "8",
                               "--max_completion_length", "8", "--dataset_limit", "16", "--save_strategy", "no",
                               "--disable_tqdm", "true", "--output_dir", str(tmp_path / "out")])
    assert trainer.state.global_step == 1 and trainer.args.tau_mode == "relative"
    assert trainer.train_dataset[0]["prompt"].startswith("Compute ")
    assert trainer.reward_func_names == ["math_accuracy_reward"]


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume(tiny_model_dir, problems_file, tmp_path):
    """Both ways to start 2 gloo processes on a CPU-only machine (one group each, with --cpu it would be ONE):
    the documented command (TRL's multi_gpu config) trains and checkpoints, `accelerate launch --multi_gpu`
    resumes it."""
    from transformers import AutoModelForCausalLM

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    train = job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_steps", "1")
    first = run_group([sys.executable, "-m", "capo_trl", "train", "--accelerate_config", "multi_gpu",
                       "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
                       *train], env, timeout=240)
    assert first.count("2 steps on 2 processes") == 1  # one group of two, printed by the main process only
    assert first.count("'loss':") == 2
    assert (out / "model.safetensors").is_file()
    assert AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").config.num_hidden_layers == 2
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    resumed = run_group([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                         "--main_process_port", str(free_port()), "--num_machines", "1", "--mixed_precision", "no",
                         "--dynamo_backend", "no", "-m", "capo_trl.cli", "train", *train,
                         "--resume_from_checkpoint", str(out / "checkpoint-1")], env, timeout=150)
    assert "2 steps on 2 processes" in resumed and resumed.count("'loss':") == 1  # only step 2 was trained again


def test_gpu_check_script_cpu_smoke(tmp_path):
    """scripts/gpu_check.sh cannot run here; its CPU smoke mode runs every piece once with a tiny model."""
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    stdout = run_group(["bash", str(HERE.parent / "scripts" / "gpu_check.sh"), "--cpu-smoke"], env, timeout=180)
    assert "capo_over_grpo: step time" in stdout and "failed" not in stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    results = report["results"]
    assert report["mode"] == "cpu-smoke" and set(results) == {"grpo", "capo_nomask", "capo", "grpo_lora", "capo_lora",
                                                              "grpo_tied", "capo_tied", "capo_zero3"}
    assert results["capo_tied"]["skipped_frac"] == 0.5 and results["grpo_tied"]["skipped_frac"] == 0.0
    assert report["ratios"]["capo_tied_over_grpo_tied"]["step_time"] > 0
    assert all(r["final_step"] == 1 and r["tokens_per_s"] > 0 for r in results.values())
    assert results["capo"]["has_reference_copy"] and results["capo"]["ref_ppl_logged"]
    assert not results["capo_nomask"]["ref_ppl_logged"] and not results["grpo"]["has_reference_copy"]
    assert results["capo_lora"]["ref_ppl_logged"] and not results["capo_lora"]["has_reference_copy"]
    assert results["capo_zero3"]["deepspeed"] and results["capo_zero3"]["has_reference_copy"]
    assert report["ratios"]["capo_over_grpo"]["step_time"] > 0
    if not torch.cuda.is_available():  # without --cpu-smoke it refuses to "measure" a CPU
        proc = subprocess.run(["bash", str(HERE.parent / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr


# ------------------------------------------------------------------------------------------ GPU / vLLM (skip here)
def _vllm_model(tmp_path) -> str:
    """A small Qwen2 vLLM can serve (head dim 64), saved with the tests' character tokenizer."""
    from capo_trl.testing.tiny import build_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return str(tmp_path / "m")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_train_on_gpu_in_bf16(tiny_model_dir, problems_file, tmp_path):
    trainer = capo_train.main(job(tiny_model_dir, problems_file, tmp_path / "out", "--max_steps", "2",
                                  "--save_strategy", "no", "--bf16", "true", "--use_cpu", "false"))
    assert trainer.state.global_step == 2 and next(trainer.model.parameters()).is_cuda
    assert trainer._capo_ref_model is not None and any("capo/ref_ppl_mean" in r for r in trainer.state.log_history)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", ["fsdp2", "zero3"])
def test_sharded_launch_on_one_gpu(tiny_model_dir, problems_file, tmp_path, config):
    """The shipped FSDP2 / ZeRO-3 accelerate configs through `capo-trl train` on one GPU: the reference copy
    is sharded with the policy (noise mask on), it trains in bf16 and writes a loadable model."""
    from transformers import AutoModelForCausalLM

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE),
                                                        os.environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    stdout = run_group([sys.executable, "-m", "capo_trl", "train", "--accelerate_config",
                        str(HERE.parent / "examples" / "accelerate" / f"{config}.yaml"), "--num_processes", "1",
                        "--main_process_port", str(free_port()),
                        *job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_strategy", "no",
                             "--bf16", "true", "--use_cpu", "false")], env, timeout=240)
    assert "2 steps on 1 process" in stdout and "capo/ref_ppl_mean" in stdout
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2


@pytest.mark.gpu
@pytest.mark.vllm
@needs_cuda
@pytest.mark.parametrize("correction", ["true", "false"])
def test_vllm_colocate(problems_file, tmp_path, correction):
    """Scores come from TRL's old_per_token_logps (correction on) or CAPO's own forward (correction off)."""
    pytest.importorskip("vllm", reason="needs vLLM (pip install 'capo-trl[vllm]')")
    model = _vllm_model(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "capo_trl.cli", "train",
           *job(model, problems_file, tmp_path / "out", "--max_steps", "2", "--save_strategy", "no", "--bf16", "true",
                "--use_cpu", "false", "--use_vllm", "true", "--vllm_mode", "colocate",
                "--vllm_gpu_memory_utilization", "0.2", "--vllm_max_model_length", "512",
                "--vllm_importance_sampling_correction", correction)]
    stdout = run_group(cmd, env, timeout=600)
    assert "2 steps on 1 process" in stdout and "capo/auroc" in stdout


# ------------------------------------------------------------------------------------------ faults, one line each
def one_line_error(capsys, argv) -> str:
    capsys.readouterr()
    assert cli.main(["train", *argv]) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith("capo-trl train: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_missing_model_data_and_checkpoint_are_one_line_errors(tiny_model_dir, problems_file, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert "no such directory" in one_line_error(capsys, job(str(tmp_path / "nope"), problems_file, out))
    assert "no config.json" in one_line_error(capsys, job(str(tmp_path), problems_file, out))
    assert "no such file" in one_line_error(capsys, job(tiny_model_dir, str(tmp_path / "missing.jsonl"), out))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{not json\n')
    assert "not valid JSON" in one_line_error(capsys, job(tiny_model_dir, str(bad), out))
    bad_csv = tmp_path / "bad.parquet"
    bad_csv.write_bytes(b"\x00\x01 definitely not parquet")
    assert "cannot be read as parquet" in one_line_error(capsys, job(tiny_model_dir, str(bad_csv), out))
    few = tmp_path / "few.jsonl"
    few.write_text('{"problem": "1", "answer": "1"}\n')  # one row; a batch needs 1 prompt x 4: fits
    small = job(tiny_model_dir, str(few), out, "--per_device_train_batch_size", "8", "--max_steps", "1")
    assert "fewer than the 2 distinct prompts" in one_line_error(capsys, small)
    assert "holds no checkpoint" in one_line_error(
        capsys, job(tiny_model_dir, problems_file, out, "--resume_from_checkpoint", "last"))
    assert "trains nothing" in one_line_error(capsys, job(tiny_model_dir, problems_file, out, "--max_steps", "0"))


def test_use_vllm_without_vllm_is_one_line_before_any_model_loads(tiny_model_dir, problems_file, tmp_path, capsys,
                                                                  monkeypatch):
    import importlib

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the vLLM check")

    monkeypatch.setattr(importlib.import_module("trl.import_utils"), "is_vllm_available", lambda *args, **kwargs: False)  # as without vLLM
    monkeypatch.setattr(capo_train, "build_trainer", no_loading)
    err = one_line_error(capsys, job(tiny_model_dir, problems_file, str(tmp_path / "out"), "--use_vllm", "true"))
    assert "use_vllm true needs vLLM, which is not installed" in err and "drop --use_vllm" in err
    assert not (tmp_path / "out").exists()


def test_an_uncached_hub_kernel_offline_is_one_line(tiny_model_dir, problems_file, tmp_path, capsys, monkeypatch):
    """The load error transformers raised on an H200 (CUDA, HF_HUB_OFFLINE, kernels not cached), raised here by a
    stand-in for the model load: CPUs get no Hub kernels, so only its translation into one line is tested."""
    seen = ("Version 2 of 'kernels-community/rotary' is not available in the local cache and Hugging Face Hub is in "
            "offline mode. Download the kernel while online first, or pass an explicit `revision=<commit>`.")

    def load(*args, **kwargs):
        raise ValueError(seen)

    monkeypatch.setattr(capo_train, "build_trainer", load)
    err = one_line_error(capsys, job(tiny_model_dir, problems_file, str(tmp_path / "out")))
    assert "USE_HUB_KERNELS=NO" in err and "kernels-community/rotary" in err
    monkeypatch.setattr(capo_train, "build_trainer", lambda *a, **k: (_ for _ in ()).throw(ValueError("other")))
    with pytest.raises(ValueError, match="other"):  # any other load error keeps its traceback
        cli.main(["train", *job(tiny_model_dir, problems_file, str(tmp_path / "out2"))])


def test_an_earlier_run_is_never_replaced_silently(tiny_model_dir, problems_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["train", *job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_steps", "1")]) == 0
    weights = (out / "model.safetensors").read_bytes()
    err = one_line_error(capsys, job(tiny_model_dir, problems_file, out, "--max_steps", "1"))
    assert "is not empty" in err and "--overwrite_output_dir" in err and "--resume_from_checkpoint last" in err
    assert (out / "model.safetensors").read_bytes() == weights and (out / "checkpoint-2").is_dir()
    # told to: the old run is gone, checkpoints included, so `resume last` cannot pick up a stale one
    assert cli.main(["train", *job(tiny_model_dir, problems_file, out, "--max_steps", "1",
                                   "--overwrite_output_dir", "true")]) == 0
    assert not (out / "checkpoint-2").exists() and (out / "model.safetensors").read_bytes() != weights
    with pytest.raises(ValueError, match="looks like a working directory"):
        capo_train._clear_output_dir(str(HERE.parent))


def test_calibration_callback_from_the_cli(tiny_model_dir, problems_file, tmp_path):
    out = tmp_path / "cal"
    trainer = capo_train.main(job(tiny_model_dir, problems_file, out, "--max_steps", "2", "--save_strategy", "no",
                                  "--calibration_dataset", problems_file, "--calibration_every", "1",
                                  "--calibration_samples", "2", "--calibration_limit", "4"))
    rows = [row for row in trainer.state.log_history if "val/auroc" in row]
    assert [row["step"] for row in rows] == [0, 1, 2]  # at the start, then every step
    with pytest.raises(ValueError, match="calibration_every must be an integer >= 1"):
        capo_train.parse_args(["--calibration_every", "0"])
