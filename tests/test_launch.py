"""`capo-trl train --accelerate_config NAME|PATH [--num_processes N]`, as `trl grpo` launches."""

import importlib.resources
from pathlib import Path

import pytest
import yaml

from capo_trl.cli import main as cli
from capo_trl.cli.train_args import predefined_configs, split_args

HERE = Path(__file__).resolve().parent


def _trl_config(name: str) -> str:
    return str(importlib.resources.files("trl.accelerate_configs").joinpath(f"{name}.yaml"))


def test_names_resolve_to_trls_configs_and_unknown_flags_go_to_accelerate(tmp_path):
    launch, train = split_args(["--config", "r.yaml", "--accelerate_config", "zero2", "--max_steps", "3",
                                "--num_processes", "2", "--mixed_precision", "no", "--bf16", "false"])
    assert launch == ["--config_file", _trl_config("zero2"), "--num_processes", "2", "--mixed_precision", "no"]
    assert train == ["--config", "r.yaml", "--max_steps", "3", "--bf16", "false"]
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: MULTI_GPU\n")
    assert split_args(["--accelerate_config", str(own)]) == (["--config_file", str(own)], [])
    assert {"zero1", "zero2", "zero3", "fsdp1", "fsdp2", "multi_gpu", "single_gpu"} <= set(predefined_configs())


@pytest.mark.parametrize("argv, words", [
    (["--accelerate_config", "zero9"], "neither a file nor a predefined config"),
    (["--accelerate_config"], "needs a value"),
    (["--accelerate_config", "zero2", "--max_steps", "many"], "max_steps"),
])
def test_bad_launch_arguments_are_one_line(argv, words, capsys):
    assert cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("capo-trl train:") and words in err


def test_our_example_configs_are_trls():
    """Why names resolve to TRL's files: ours set the same launch (examples/accelerate/ differ in comments)."""
    pairs = {"zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp2", "ddp": "multi_gpu"}
    keys = ("distributed_type", "deepspeed_config", "fsdp_config", "num_machines", "mixed_precision", "use_cpu")
    for ours, trls in pairs.items():
        a = yaml.safe_load((HERE.parent / "examples" / "accelerate" / f"{ours}.yaml").read_text())
        b = yaml.safe_load(Path(_trl_config(trls)).read_text())
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, ours


# The documented command starting two gloo processes (one group) on a CPU is the first launch of
# test_train_cli.py::test_two_processes_train_checkpoint_and_resume: one launch serves both checks.
